"""moot: structured multi-agent LLM debate: typed, budgeted, on any model."""

from moot.apps.rag import DebateEngine, RagDebateResult
from moot.batch import BatchItem, BatchResult, run_batch, run_batch_sync
from moot.core import (
    Budget,
    ContextChunk,
    DebateFailed,
    DebateResult,
    DebateTask,
    DebateTimeout,
    Engine,
    Participant,
    Persona,
    ProtocolSpec,
    Visibility,
    load_result,
)
from moot.models import ScriptedModel, resolve_model
from moot.protocols import get_preset

__version__ = "0.1.0"

__all__ = [
    "BatchItem",
    "BatchResult",
    "Budget",
    "ContextChunk",
    "DebateEngine",
    "DebateFailed",
    "DebateResult",
    "DebateTask",
    "DebateTimeout",
    "Engine",
    "Participant",
    "Persona",
    "ProtocolSpec",
    "RagDebateResult",
    "ScriptedModel",
    "Visibility",
    "__version__",
    "get_preset",
    "load_result",
    "resolve_model",
    "run_batch",
    "run_batch_sync",
]
