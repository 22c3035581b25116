"""moot: structured multi-agent LLM debate: typed, budgeted, on any model."""

import importlib
from typing import TYPE_CHECKING, Any

from moot._version import __version__

# The library proper, imported with the package: any ``import moot.x`` also registers the presets'
# turn schemas, which a spec names (a Ray worker, unpickling a job, has only what the job's modules
# import).
from moot.core import (
    Budget,
    CallBudget,
    Consensus,
    ContextChunk,
    DebateFailed,
    DebateResult,
    DebateState,
    DebateTask,
    DebateTimeout,
    Engine,
    JudgeDecision,
    MaxRounds,
    ModeratorVerdict,
    NoDecision,
    Participant,
    Persona,
    Prompts,
    ProtocolSpec,
    RoundPlan,
    RuleDecision,
    StableAnswers,
    Stage,
    StopCondition,
    SynthesizeDecision,
    TimeoutStop,
    TokenBudget,
    TurnFormat,
    Visibility,
    VoteDecision,
    load_result,
    register_stop,
)
from moot.models import ScriptedModel, resolve_model
from moot.protocols import get_preset
from moot.structured import register_schema

if TYPE_CHECKING:
    from moot.apps.rag import DebateEngine, RagDebateResult
    from moot.batch import BatchItem, BatchResult, run_batch, run_batch_sync

#: The applications on the library, imported when first used (PEP 562): the RAG app and batch runs
#: (with the evaluation store and the executors under them), which a program using the library does
#: not always need: ``import moot`` took 0.78 s of CPU with them, 0.50 s without (median of 7).
_LAZY: dict[str, str] = {
    "BatchItem": "moot.batch",
    "BatchResult": "moot.batch",
    "DebateEngine": "moot.apps.rag",
    "RagDebateResult": "moot.apps.rag",
    "run_batch": "moot.batch",
    "run_batch_sync": "moot.batch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'moot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "BatchItem",
    "BatchResult",
    "Budget",
    "CallBudget",
    "Consensus",
    "ContextChunk",
    "DebateEngine",
    "DebateFailed",
    "DebateResult",
    "DebateState",
    "DebateTask",
    "DebateTimeout",
    "Engine",
    "JudgeDecision",
    "MaxRounds",
    "ModeratorVerdict",
    "NoDecision",
    "Participant",
    "Persona",
    "Prompts",
    "ProtocolSpec",
    "RagDebateResult",
    "RoundPlan",
    "RuleDecision",
    "ScriptedModel",
    "StableAnswers",
    "Stage",
    "StopCondition",
    "SynthesizeDecision",
    "TimeoutStop",
    "TokenBudget",
    "TurnFormat",
    "Visibility",
    "VoteDecision",
    "__version__",
    "get_preset",
    "load_result",
    "register_schema",
    "register_stop",
    "resolve_model",
    "run_batch",
    "run_batch_sync",
]
