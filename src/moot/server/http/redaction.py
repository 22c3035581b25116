"""The server's log lines with its secrets redacted: the server's key, the store's and Redis's
passwords, and every key seen since, out of every logger the server writes to."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from urllib.parse import unquote

from moot.secrets import redact

#: Set in a WebSocket's task when the server refused its handshake with an HTTP response (a missing
#: or wrong key's 401, a foreign Host's 400): uvicorn's line that the ASGI app "returned without
#: completing handshake" is then no error, and is not written (any client could fill the log with it).
REFUSED_HANDSHAKE: ContextVar[bool] = ContextVar("moot_refused_handshake", default=False)
_UNFINISHED_HANDSHAKE = "ASGI callable returned without completing handshake."

_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "moot", "moot.server", "fastapi", "websockets")


class RedactingFilter(logging.Filter):
    """Keeps the server's key (and every known secret) out of log lines."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _UNFINISHED_HANDSHAKE and REFUSED_HANDSHAKE.get():
            return False
        # A WebSocket frame's line (the library logs "< %s" with the frame, on uvicorn.error): its text
        # is cut in the middle when formatted, past what a redaction of whole values finds. Not written.
        if isinstance(record.args, tuple) and any(type(a).__module__.startswith("websockets") for a in record.args):
            return False
        # Each part on its own, so that formatters that read ``args`` (uvicorn's access log) still work.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        if isinstance(record.args, tuple):
            record.args = tuple(self._arg(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v, self.secrets) if isinstance(v, str) else v for k, v in record.args.items()}
        # A traceback is formatted once into exc_text, which formatters then reuse: redact that too
        # (an exception's message can quote a key).
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True

    def _arg(self, text: str) -> str:
        """A part of a line redacted, and read percent-decoded too where it holds escapes: the access
        log writes a request's path and query as sent (``?cursor=%73k-proj-...``, ``redis%3A%2F%2F``),
        past what a redaction of the text as written finds. Written decoded where that redacted more."""
        out = redact(text, self.secrets)
        if "%" in out:
            decoded = unquote(out)
            cleaned = redact(decoded, self.secrets)
            if cleaned != decoded:
                return cleaned
        return out


def install_redaction(secrets: list[str]) -> None:
    """One redacting filter per logger the server writes to, holding every key seen so far. The
    WebSocket library's frame lines are not written, even at ``--log-level debug`` (on whichever
    logger: uvicorn hands the library its own): they quote a message's text cut in its middle, past
    what a redaction of whole values can find (a key at the start of a message showed 30 characters)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        existing = next((f for f in logger.filters if isinstance(f, RedactingFilter)), None)
        if existing is None:
            logger.addFilter(RedactingFilter(list(secrets)))
        else:
            existing.secrets.extend(s for s in secrets if s not in existing.secrets)
