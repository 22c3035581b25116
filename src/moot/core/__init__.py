"""The engine and its data: types, protocol spec, events."""

from moot.core.engine import CallBudgetExhausted, DebateFailed, DebateState, DebateTimeout, Engine
from moot.core.events import (
    DebateDone,
    DebateStarted,
    Event,
    EventHandler,
    RoundDone,
    TokenDelta,
    TurnDone,
    TurnRetry,
    TurnStarted,
)
from moot.core.spec import (
    Budget,
    NoDecision,
    Participant,
    Prompts,
    ProtocolSpec,
    SpecError,
    SynthesizeDecision,
    TurnFormat,
    Visibility,
)
from moot.core.types import ContextChunk, DebateResult, DebateTask, Persona, Round, Turn, load_result

__all__ = [
    "Budget",
    "CallBudgetExhausted",
    "ContextChunk",
    "DebateDone",
    "DebateFailed",
    "DebateResult",
    "DebateStarted",
    "DebateState",
    "DebateTask",
    "DebateTimeout",
    "Engine",
    "Event",
    "EventHandler",
    "NoDecision",
    "Participant",
    "Persona",
    "Prompts",
    "ProtocolSpec",
    "Round",
    "RoundDone",
    "SpecError",
    "SynthesizeDecision",
    "TokenDelta",
    "Turn",
    "TurnDone",
    "TurnFormat",
    "TurnRetry",
    "TurnStarted",
    "Visibility",
    "load_result",
]
