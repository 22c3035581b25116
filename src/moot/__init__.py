"""moot: structured multi-agent LLM debate: typed, budgeted, on any model."""

import importlib
from typing import TYPE_CHECKING, Any

from moot._version import __version__

if TYPE_CHECKING:
    from moot.apps.rag import DebateEngine, RagDebateResult
    from moot.batch import BatchItem, BatchResult, run_batch, run_batch_sync
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

#: Where each public name lives. Imported when first used (PEP 562), so that ``import moot.x`` (every
#: ``moot`` command, every server process) loads what it uses and not the whole facade: the facade
#: alone imported the RAG app, batch runs and every protocol (about 0.7 s of each process's start).
_EXPORTS: dict[str, str] = {
    "BatchItem": "moot.batch",
    "BatchResult": "moot.batch",
    "Budget": "moot.core",
    "CallBudget": "moot.core",
    "Consensus": "moot.core",
    "ContextChunk": "moot.core",
    "DebateEngine": "moot.apps.rag",
    "DebateFailed": "moot.core",
    "DebateResult": "moot.core",
    "DebateState": "moot.core",
    "DebateTask": "moot.core",
    "DebateTimeout": "moot.core",
    "Engine": "moot.core",
    "JudgeDecision": "moot.core",
    "MaxRounds": "moot.core",
    "ModeratorVerdict": "moot.core",
    "NoDecision": "moot.core",
    "Participant": "moot.core",
    "Persona": "moot.core",
    "Prompts": "moot.core",
    "ProtocolSpec": "moot.core",
    "RagDebateResult": "moot.apps.rag",
    "RoundPlan": "moot.core",
    "RuleDecision": "moot.core",
    "ScriptedModel": "moot.models",
    "StableAnswers": "moot.core",
    "Stage": "moot.core",
    "StopCondition": "moot.core",
    "SynthesizeDecision": "moot.core",
    "TimeoutStop": "moot.core",
    "TokenBudget": "moot.core",
    "TurnFormat": "moot.core",
    "Visibility": "moot.core",
    "VoteDecision": "moot.core",
    "get_preset": "moot.protocols",
    "load_result": "moot.core",
    "register_schema": "moot.structured",
    "register_stop": "moot.core",
    "resolve_model": "moot.models",
    "run_batch": "moot.batch",
    "run_batch_sync": "moot.batch",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'moot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
