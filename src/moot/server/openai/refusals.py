"""How the OpenAI door refuses what a debate cannot honour: a 400 naming the field, as the request
writes it, and what to send instead; never silence."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from moot.core.user_schemas import is_text
from moot.files import field_path, first_error
from moot.server.limits import RequestError

# ----------------------------------------------------------------------------------- refusals


class FieldRefusal(RequestError):
    """A refusal of one of the OpenAI request's own fields, found while the debate is prepared: named
    as the request writes it already (not under ``moot``)."""


#: Why a field both wire shapes have is refused, and what to do instead (each adds its own).
UNSUPPORTED_BOTH = {
    "moderation": "this server runs no moderation model; leave moderation out",
    "prompt_cache_options": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_options out",
    "prompt_cache_retention": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_retention out",
}
#: Why ``stream_options.include_obfuscation`` is refused.
NO_OBFUSCATION = "this server pads no stream; leave include_obfuscation out or false"


def refuse_unless(where: str, ok: bool, why: str) -> None:
    """A 400 naming ``where`` when its value is not one a debate can honour (``why``: what to do)."""
    if not ok:
        raise RequestError(f"{where}: {why}", param=where)


def invalid_at(exc: ValidationError, where: str) -> RequestError:
    """A part of the request (``where``: its place, ``input[2]``) that its wire type refused, as a 400
    naming the field inside it (``input[2].call_id``), as the route names a field of the body."""
    first = first_error(exc)
    inner = field_path(first["loc"])
    at = f"{where}.{inner}" if inner and not inner.startswith("[") else f"{where}{inner}"
    why = "required; add it" if first["type"] == "missing" else first["msg"].removeprefix("Value error, ")
    return RequestError(f"{at}: {why}", param=at)


def no_legacy_functions(fields: dict[str, Any]) -> None:
    """The legacy ``functions`` and ``function_call`` are refused by their own names, saying exactly
    what to send instead: tool calls work here, as ``tools`` and ``tool_choice``."""
    for name, value in fields.items():
        how = (
            'send each function as a tool: tools=[{"type": "function", "function": <the function>}] (tool calls '
            "work on this server, through the debate)"
            if name == "functions"
            else 'send it as tool_choice: "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
        )
        refuse_unless(name, not value, f"the legacy field; {how}")


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as a refusal may quote it: text as it is, anything else (or text that is not Unicode,
    with a lone surrogate) as escaped JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) and is_text(value) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def sampling_refusals(fields: dict[str, Any]) -> None:
    """The fields both endpoints honour only at their no-op value."""
    checks = {
        "top_p": (fields.get("top_p") in (None, 1), "a debate samples at a temperature only; leave top_p out (or 1)"),
        "top_logprobs": (not fields.get("top_logprobs"), "a debate's answer has no log-probabilities; leave it out"),
        "service_tier": (
            fields.get("service_tier") in (None, "auto", "default"),
            "a debate runs in this server's own queue; leave service_tier out",
        ),
        "store": (
            not fields.get("store"),
            "this server keeps no chat completion to retrieve by its id (its debate is stored: GET "
            "/v1/debates/{id}; a stored conversation is the Responses API's, POST /v1/responses); leave store "
            "out or false, and send the history in the request",
        ),
    }
    for name, (ok, why) in checks.items():
        if name in fields:
            refuse_unless(name, ok, why)
