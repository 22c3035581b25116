"""``moot batch``: one debate per input, durable and resumable, in this process or on Ray."""

from moot.batch.items import BatchInputError, BatchItem, load_items
from moot.batch.results import BatchConfig, BatchResult, LoadedBatch, export, load_batch
from moot.batch.runner import run_batch, run_batch_sync

__all__ = [
    "BatchConfig",
    "BatchInputError",
    "BatchItem",
    "BatchResult",
    "LoadedBatch",
    "export",
    "load_batch",
    "load_items",
    "run_batch",
    "run_batch_sync",
]
