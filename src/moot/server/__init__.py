"""``moot serve``: debates as a web service, an OpenAI-compatible debate model, and a live viewer.

Needs the ``serve`` extra (``pip install 'moot[serve]'``: FastAPI, uvicorn, sse-starlette).
"""

from moot.server.http.app import create_app
from moot.server.settings import Limits, ServerSettings

__all__ = ["Limits", "ServerSettings", "create_app"]
