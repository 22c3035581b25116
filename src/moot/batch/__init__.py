"""``moot batch``: one debate per input, durable and resumable, in this process or on Ray."""

from moot.batch.items import BatchInputError, BatchItem, load_items
from moot.batch.runner import BatchConfig, BatchResult, export, run_batch, run_batch_sync

__all__ = [
    "BatchConfig",
    "BatchInputError",
    "BatchItem",
    "BatchResult",
    "export",
    "load_items",
    "run_batch",
    "run_batch_sync",
]
