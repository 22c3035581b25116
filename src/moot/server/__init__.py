"""``moot serve``: debates as a web service, an OpenAI-compatible debate model, and a live viewer.

Needs the ``serve`` extra (``pip install 'moot[serve]'``: FastAPI, uvicorn, sse-starlette).
"""

from typing import TYPE_CHECKING, Any

from moot.server.settings import Limits, ServerSettings

if TYPE_CHECKING:
    from moot.server.http.app import create_app


def __getattr__(name: str) -> Any:
    """``create_app`` (the HTTP door: FastAPI, 0.4 s to import) when first asked for: ``moot mcp``
    takes the server's settings, manager and store from this package, not its HTTP app."""
    if name == "create_app":
        from moot.server.http.app import create_app

        return create_app
    raise AttributeError(f"module 'moot.server' has no attribute {name!r}")


__all__ = ["Limits", "ServerSettings", "create_app"]
