"""The API's error responses: their one body (:func:`error_response`), a validation error as one
line naming the field (:func:`validation_message`), and the app's handlers that turn every
exception into that body (:func:`add_error_handlers`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Scope

from moot.files import field_path, first_error
from moot.secrets import redact
from moot.server.policy import RequestError
from moot.server.schemas import ErrorBody, ErrorDetail
from moot.server.state import StoreUnavailable
from moot.server.state.base import Outage
from moot.server.state.manager import QueueFull

#: What a request is told to wait when the store is out of reach, and how often that is logged.
STORE_RETRY_AFTER_S = 5
STORE_LOG_EVERY_S = 5.0
#: Where OpenAI's API keeps stored chat completions (``GET /v1/chat/completions/{id}``), which moot has not.
CHAT_STORED = "/v1/chat/completions/"
#: The Responses API's count of a request's input tokens (the SDK's ``responses.input_tokens.count``),
#: which moot has not: its path is read as ``POST /v1/responses/{response_id}``.
INPUT_TOKENS = "/v1/responses/input_tokens"

log = logging.getLogger("moot.server")


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
    secrets: list[str] | None = None,
) -> JSONResponse:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    # (the param too: an unknown field is named by its key, which may be a secret pasted in the wrong place)
    param = redact(param, secrets or []) if param is not None else None
    body = ErrorBody(error=ErrorDetail(message=redact(message, secrets or []), type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


#: Names pydantic gives a union's branches in an error's location.
_BRANCH = re.compile(r"str|int|float|bool|list\[.*\]|dict\[.*\]|[A-Z][A-Za-z]+|function-.*")


def validation_message(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    first = first_error(exc)
    original = (first.get("ctx") or {}).get("error")
    if isinstance(original, RequestError):  # raised by a validator: it names its field itself
        return original.message, original.param
    raw_loc = list(first["loc"])
    if raw_loc and raw_loc[0] in ("body", "query", "header", "path", "cookie"):
        raw_loc = raw_loc[1:]
    # A union's branch is in the location ("protocol.str", "context.0.ContextChunk"): the field is
    # what the user wrote, so leave the branch names out.
    loc = [x for x in raw_loc if not (isinstance(x, str) and _BRANCH.fullmatch(x))]
    where = field_path(loc) or None
    kind = first["type"]
    msg = first["msg"]
    if kind == "missing" and where is None:
        return "the body is missing: send a JSON object (see /docs)", None
    if kind == "json_invalid":
        return f"the body is not valid JSON ({msg}); send a JSON object", None
    if kind == "extra_forbidden":
        return f"{where}: unknown field; remove it or check its spelling (see /docs)", where
    if kind == "missing":
        return f"{where}: required; add it", where
    if kind in ("model_attributes_type", "dict_type") and where is None:
        return "the body must be a JSON object; see /docs", None
    msg = msg.removeprefix("Value error, ")
    return (f"{where}: {msg}" if where else msg), where


#: The methods a 405's ``Allow`` is worked out over: every method a route of this app serves.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """Every method some route serves at the request's path, each route asked by its own matching.
    Starlette's 405 gives the methods of the first route whose path matched, so a path two routes
    serve (``GET`` and ``POST /v1/debates``) was said to allow only one. Mounts are left out: one
    answers its own 405."""
    allowed = []
    for method in _METHODS:
        probe = {**scope, "method": method, "fastapi": {}}  # the router's own bookkeeping, kept apart
        if any(not isinstance(r, Mount) and r.matches(probe)[0] is Match.FULL for r in routes):
            allowed.append(method)
    return allowed


def add_error_handlers(app: FastAPI, secrets: list[str]) -> None:
    """Every error the app's routes raise, answered in the API's error body (``secrets`` redacted):
    a validation error and a refusal (400, naming the field), a full queue (429), the store out of
    reach (503 with Retry-After), an HTTP error (404, 405 with every allowed method), and a bug (500,
    its details in the log only)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param=param, secrets=secrets)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        retry = {} if exc.should_retry is None else {"x-should-retry": "true" if exc.should_retry else "false"}
        kind = None
        if exc.status == 429:  # (busy for a moment, as a full queue is: files_busy)
            kind, retry = "rate_limit_error", {**retry, "Retry-After": "1"}
        return error_response(
            exc.status, exc.message, param=exc.param, code=exc.code, kind=kind, headers=retry or None, secrets=secrets
        )

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> JSONResponse:
        return error_response(
            429,
            str(exc),
            code=exc.code,
            kind="rate_limit_error",
            headers={"Retry-After": str(exc.retry_after)},
            secrets=secrets,
        )

    outage = Outage(log, every_s=STORE_LOG_EVERY_S)  # the store's absence, logged now and then

    @app.exception_handler(StoreUnavailable)
    async def _unreachable(request: Request, exc: StoreUnavailable) -> JSONResponse:
        # The store (PostgreSQL) is out of reach for now: a retry after a moment may succeed. Not a
        # bug: no traceback, and one log line every few seconds, not one a request.
        outage.warn("requests answered 503: %s", redact(str(exc), secrets))
        return error_response(
            503,
            StoreUnavailable.TOLD,
            code="store_unavailable",
            headers={"Retry-After": str(STORE_RETRY_AFTER_S)},
            secrets=secrets,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {where}; the API is under /v1 (see /docs)"
            stored = request.url.path.removeprefix(CHAT_STORED)
            if stored != request.url.path and stored:  # the SDK's chat.completions.retrieve, list_messages...
                debate = stored.split("/")[0].removeprefix("moot-")
                message = (
                    f"no such path: {where}; this server keeps no chat completion to retrieve (store is refused): "
                    f"its debate is at GET /v1/debates/{debate}, and a stored conversation is the Responses API's"
                )
        headers = exc.headers
        if request.url.path.rstrip("/") == INPUT_TOKENS:  # (read as a response's id: a 405 that misled)
            return error_response(
                404,
                f"no such path: {where}; this server counts no input before a debate (each debater's prompt holds the "
                "input with its own instructions): a response's usage.input_tokens says what its debate read",
                code="unsupported_endpoint",
                secrets=secrets,
            )
        if exc.status_code == 405:
            message = f"{where} is not allowed; see /docs for the methods of each path"
            allowed = allowed_methods(request.app.router.routes, request.scope)
            if allowed:  # (a mount, the static files, answers its own 405 with its own Allow)
                headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return error_response(exc.status_code, message, headers=headers, secrets=secrets)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(500, "internal server error; the server's log has the details", secrets=secrets)
