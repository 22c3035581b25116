"""Chat models: one async interface; embedded (llama.cpp), OpenAI-compatible and scripted backends."""

from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    ConcurrencyLimiter,
    Message,
    ModelConfigError,
    ModelError,
    ModelSpecError,
    ResponseFormatRejected,
    RetryCallback,
    RetryPolicy,
    TokenCallback,
    TransientModelError,
    Usage,
)
from moot.models.registry import default_spec, resolve_model
from moot.models.scripted import ScriptedModel, ScriptExhausted

__all__ = [
    "BaseChatModel",
    "ChatRequest",
    "ChatResponse",
    "ConcurrencyLimiter",
    "Message",
    "ModelConfigError",
    "ModelError",
    "ModelSpecError",
    "ResponseFormatRejected",
    "RetryCallback",
    "RetryPolicy",
    "ScriptExhausted",
    "ScriptedModel",
    "TokenCallback",
    "TransientModelError",
    "Usage",
    "default_spec",
    "resolve_model",
]
