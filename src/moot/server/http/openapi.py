"""The OpenAPI schema as the server behaves: every route's error responses in the API's error body
(:func:`error_responses`), no 422, a 503 on every route (a store out of reach, a stop, the
connection cap can answer any of them), and, once the server needs a key, the bearer scheme and a
401 on every /v1 route (:func:`declare_openapi`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from moot.server.schemas import ErrorBody
from moot.server.state.keyring import KeyRing

#: What each error status of the API means (the OpenAPI schema lists those a route really sends).
_ERRORS: dict[int, str] = {
    400: "A field is wrong: the message names it (param) and the fix",
    401: "Missing or wrong API key (send 'Authorization: Bearer <key>')",
    404: "No such debate (or debate model)",
    408: "The request body did not arrive in time",
    409: "The debate is not in a state that allows this, or an Idempotency-Key was sent before with another body",
    413: "The body is over the server's --max-body",
    415: "The body is not sent as JSON (Content-Type: application/json)",
    429: "A limit is reached (code: queue_full, key_concurrency, key_rate): retry after Retry-After seconds",
    502: "The debate ended without a decision",
    503: (
        "Not now: the server cannot use its model (code model_unavailable) or reach its store (store_unavailable), "
        "it is stopping (server_stopping), or it holds as many connections as it may; retry after Retry-After seconds"
    ),
    504: "The debate's timeout expired",
}


_REF = "#/components/schemas/"
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": _REF + "ErrorBody"}}}


def _declare_errors(schema: dict[str, Any], keyed: bool) -> None:
    """The schema as the server behaves: no 422 (every validation error is a 400 in the error shape),
    a 503 on every route, and with a key (the server's own, or keys in its store), the bearer scheme
    and a 401 on every /v1 route."""
    unauthorized = {"description": _ERRORS[401], "content": _ERROR_CONTENT}
    unavailable = {"description": _ERRORS[503], "content": _ERROR_CONTENT}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            operation.setdefault("responses", {}).setdefault("503", unavailable)
            if keyed and (path == "/v1" or path.startswith("/v1/")):
                operation["security"] = [{"bearer": []}]
                operation.setdefault("responses", {}).setdefault("401", unauthorized)
    components = schema.setdefault("components", {})
    # The error body the routes' error responses name (:func:`error_responses`), and what it holds.
    error_body = ErrorBody.model_json_schema(ref_template=_REF + "{model}")
    components.setdefault("schemas", {}).update({**error_body.pop("$defs", {}), "ErrorBody": error_body})
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}


def error_responses(key: str | None) -> Callable[..., dict[int | str, dict[str, Any]]]:
    """The error responses of a route, as the OpenAPI schema lists them (401 when ``key``: the
    server's own). Each names the error body's schema (:func:`_declare_errors` adds it) rather than
    giving its model: FastAPI builds a validator for each response model of each route, 4 to 7 per
    route, which made the app's routes most of the time a test server takes to start."""

    def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
        keyed = (401,) if key is not None else ()
        return {code: {"description": _ERRORS[code], "content": _ERROR_CONTENT} for code in sorted({*codes, *keyed})}

    return errors


def declare_openapi(app: FastAPI, key: str | None, ring: KeyRing) -> None:
    """The app's schema, declared as the server behaves (:func:`_declare_errors`)."""
    original_openapi = app.openapi
    declared_keyed: list[bool] = []

    def openapi() -> dict[str, Any]:
        # Made again once the server needs a key (a first key added to its store).
        keyed = key is not None or ring.required()
        if app.openapi_schema is None or declared_keyed != [keyed]:
            app.openapi_schema = None
            _declare_errors(original_openapi(), keyed=keyed)
            declared_keyed[:] = [keyed]
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
