"""``moot view``'s server: a read-only viewer of one run or transcript, on loopback.

The JSON API under ``/v1/view`` (:func:`router`) serves :mod:`moot.server.view.data`'s rows and
analyses; ``/`` and ``/item`` are the viewer's pages (``runs.html``, ``runs-item.html``, built by
``runs.js`` on ``moot.js``'s helpers). The app (:func:`create_view_app`) is small and separate from
``moot serve``'s, with the same security headers; it answers only requests addressed to a loopback
name, so a web page cannot reach it through a rebound DNS name.
"""

from __future__ import annotations

import logging
from importlib.resources import files
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from moot._version import __version__
from moot.server.asgi import api_router
from moot.server.http.app import HostCheck, ResponseHeaders, error_response, validation_message
from moot.server.limits import RequestError
from moot.server.settings import LOOPBACK_NAMES
from moot.server.view.data import (
    ItemDetail,
    ItemFilter,
    ItemPage,
    PairCounts,
    RunInfo,
    RunView,
    filter_rows,
    pair_counts,
)

log = logging.getLogger("moot.view")


class ItemQuery(ItemFilter):
    """The item table's query string: the filters, and nothing else (an unknown field is a 400)."""

    model_config = ConfigDict(extra="forbid")


#: The query parameters of the routes that take no filter model (``/items``'s are :class:`ItemQuery`'s).
_TAKES = {"/v1/view/run": (), "/v1/view/pair": ("a", "b"), "/v1/view/item": ("id",)}


def given_once(request: Request) -> None:
    """A query parameter given twice is refused, naming it (one of the two was used, with no word), and
    so is one the route does not take (``/items`` refuses its own: :class:`ItemQuery`)."""
    keys = [key for key, _ in request.query_params.multi_items()]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise RequestError(f"{twice}: given {keys.count(twice)} times; give it once", twice)
    takes = _TAKES.get(request.url.path)
    unknown = next((key for key in keys if takes is not None and key not in takes), None)
    if unknown is not None and takes is not None:
        said = ", ".join(takes) if takes else "none"
        raise RequestError(f"{unknown}: unknown query parameter; this route takes {said}", unknown)


def router(view: RunView) -> APIRouter:
    """The viewer's JSON API over ``view``."""
    api = api_router(prefix="/v1/view", dependencies=[Depends(given_once)])

    @api.get("/run")
    async def run_info() -> RunInfo:
        """What was opened: its kind, model, protocols and each protocol's totals."""
        return view.info()

    @api.get("/items")
    async def items(query: Annotated[ItemQuery, Query()]) -> ItemPage:
        """The run's items with each protocol's row, narrowed by the filters given."""
        return ItemPage(total=len(view.rows), rows=filter_rows(view, query))

    @api.get("/pair")
    async def pair(a: str, b: str) -> PairCounts:
        """Protocols ``a`` and ``b`` on the items both have a result for, over the whole run."""
        return pair_counts(view, a, b)

    @api.get("/item")
    async def item(id: str) -> ItemDetail:
        """One item: what was asked, each protocol's row, and each protocol's transcript."""
        return view.detail(id)

    return api


def create_view_app(view: RunView, allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES) -> FastAPI:
    """The viewer's app over ``view`` (a run or transcript read once by the caller), answering only requests
    addressed to ``allowed_hosts`` (its Host header: loopback names)."""
    app = FastAPI(title="moot view", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    hint = "moot view answers to loopback names only: open the address it printed"
    app.add_middleware(HostCheck, allowed=list(allowed_hosts), hint=hint)
    app.add_middleware(ResponseHeaders)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        # The viewer has no /docs: its fields are the filters of /v1/view/items and a and b of /v1/view/pair.
        return error_response(400, message.replace(" (see /docs)", "").replace("; see /docs", ""), param=param)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {where}; the viewer's pages are / and /item, its API is under /v1/view"
        elif exc.status_code == 405:
            message = f"{where} is not allowed; the viewer only reads (GET)"
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(500, "internal error of the viewer; its terminal has the details")

    app.include_router(router(view))

    static = files("moot.server") / "static"

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def runs_page() -> FileResponse:
        return FileResponse(str(static / "runs.html"))

    @app.api_route("/item", methods=["GET", "HEAD"], include_in_schema=False)
    async def item_page() -> FileResponse:
        return FileResponse(str(static / "runs-item.html"))

    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    return app
