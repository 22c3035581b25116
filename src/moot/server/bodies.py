"""A request body's JSON, decoded and checked before any route reads it (:func:`read_json`): what
FastAPI's own parser refuses with a generic message or a 500 is refused here in one line naming the
field; the routes validate their models from the value decoded here."""

from __future__ import annotations

import json
import math
from typing import Any

from moot.files import field_path, not_text
from moot.server.limits import RequestError

#: How deep a request body's JSON may nest (an inline protocol needs fewer than 10 levels).
MAX_JSON_DEPTH = 32
#: The longest integer a request body may write (int64 has 19 digits): longer is no count of anything.
MAX_INTEGER_DIGITS = 20


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    # As FastAPI decides it: application/json, or application/<anything>+json.
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class _Unusable:
    """A number the body writes that no field can take: kept in place so that its field can be named."""

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def problem(self) -> str:
        if self.literal in ("NaN", "Infinity", "-Infinity"):
            return f"{self.literal} is not a JSON number; give a number"
        digits = sum(c.isdigit() for c in self.literal)
        shown = self.literal if len(self.literal) <= 24 else f"a number of {digits} digits"
        return f"{shown} is out of range; give a smaller number"


def unusable_number(data: Any, where: str = "") -> tuple[str, str] | None:
    """Where ``data`` (JSON a transport decoded itself: the MCP SDK's) holds a number no field can
    take, and why, as :func:`read_json` refuses it in a body: an integer of over
    :data:`MAX_INTEGER_DIGITS` digits (``10**400`` overflowed a float deep in a check), an infinity
    or a NaN. None: there is none."""
    stack: list[tuple[Any, str]] = [(data, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and len(str(abs(value))) > MAX_INTEGER_DIGITS:
            return at, _Unusable(str(value)).problem()
        if isinstance(value, float) and not math.isfinite(value):
            literal = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return at, _Unusable(literal).problem()
        if isinstance(value, dict):
            stack += [(v, f"{at}.{k}" if at else str(k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{at}[{i}]") for i, v in enumerate(value)]
    return None


class NoBody:
    """A request with no body (nothing to decode)."""


NO_BODY = NoBody()


class _TooMany(Exception):
    """More JSON objects than :func:`read_json` was allowed to read."""


def read_json(body: bytes, content_type: str | None, *, max_objects: int | None = None) -> Any:
    """A request body's JSON (:data:`NO_BODY` for none), or a :class:`RequestError` raised for why it
    is not JSON this server can read: the wrong content type (415), not UTF-8, not strict JSON
    (``NaN`` included), nested too deep, a number out of any range, or a string holding a lone
    surrogate (400, naming the field). FastAPI's own parser turns several of these into one generic
    message or a 500 (a 5,000-digit integer, a lone surrogate in a question), so they are found here
    first, for every route alike; the routes then read the value decoded here
    (:class:`moot.server.asgi.DecodedRoute`). ``max_objects``: more JSON objects than this are refused
    as they are read (what a small payload unpacks to: :func:`moot.server.openai.open_responses.expanded`)."""
    if not body:
        return NO_BODY
    media = _media_type(content_type or "")
    if not _is_json(media):
        given = f"{media!r} is not JSON" if media else "missing"
        raise RequestError(
            f"Content-Type: {given}; send the body as a JSON object with the header 'Content-Type: application/json'",
            param="Content-Type",
            status=415,
            code="unsupported_media_type",
        )
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RequestError(
            f"the body is not valid UTF-8 (byte {exc.start} is 0x{body[exc.start]:02x}); send JSON encoded as UTF-8",
            code="invalid_encoding",
        ) from None
    unusable: list[_Unusable] = []

    def keep(literal: str) -> _Unusable:
        unusable.append(_Unusable(literal))
        return unusable[-1]

    def integer(literal: str) -> int | _Unusable:
        return int(literal) if len(literal) <= MAX_INTEGER_DIGITS + 1 else keep(literal)

    def number(literal: str) -> float | _Unusable:
        value = float(literal)
        return value if math.isfinite(value) else keep(literal)

    deep = RequestError(
        f"the body nests deeper than {MAX_JSON_DEPTH} levels of objects and lists; send a flatter body (see /docs)",
        code="too_deep",
    )
    objects = 0

    def counted(value: dict[str, Any]) -> dict[str, Any]:
        nonlocal objects
        objects += 1
        if max_objects is not None and objects > max_objects:
            raise _TooMany
        return value

    try:
        data = json.loads(
            text,
            parse_int=integer,
            parse_float=number,
            parse_constant=keep,
            object_hook=counted if max_objects is not None else None,
        )
    except _TooMany:
        raise RequestError(
            f"the body holds over {max_objects:,} JSON objects; send fewer", code="too_many_objects"
        ) from None
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"the body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); send a JSON object",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise deep from None
    if isinstance(data, _Unusable):
        raise RequestError(data.problem())
    # One walk over the containers, for their depth and the field of an unusable number.
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())] if isinstance(data, dict | list) else []
    while stack:
        value, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            raise deep
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            if isinstance(child, dict | list):
                stack.append((child, (*path, key)))
            elif unusable and isinstance(child, _Unusable):
                where = field_path((*path, key))
                raise RequestError(f"{where}: {child.problem()}", param=where)
    # Half a UTF-16 pair ("\udfff") in any string or key, of any route: no UTF-8 text can hold it, so
    # the store's write of it would fail (and, sharing a moment with other debates, theirs with it).
    found = not_text(data)
    if found is not None:
        where, problem = found
        raise RequestError(f"{where}: {problem}" if where else f"the body {problem}", param=where or None)
    return data
