"""A file a request sends inline (the Responses API's ``input_file`` part, chat completions' ``file``
part), turned into text before the debate: the file's text is a context passage every debater reads,
named by its filename (an image goes as an image part: :func:`~moot.server.openai.conversation.image_of`).

- ``file_data``, a base64 data URL (``data:application/pdf;base64,...``) or bare base64 with a
  ``filename`` that says its type: a PDF's text is extracted with pypdf; text, JSON, Markdown, CSV
  and the like are read as UTF-8; any other type is refused by the part's place.
- ``file_id`` is refused: this server has no Files API to look one up in.
- ``file_url`` is refused: the server fetches nothing (a fetch on a caller's behalf is an outbound
  request from inside the server's network).

The data is bounded by the body limit (``--max-body``); its text, like any passage, by the prompt
budget (a conversation's oldest messages are left out to fit, and what cannot fit is refused).
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import mimetypes
import re
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from moot.core.types import ContextChunk
from moot.server.limits import RequestError

#: The media types read as UTF-8 text, besides every ``text/*``.
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/jsonl",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/csv",
        "application/sql",
        "application/javascript",
        "application/x-sh",
        "application/x-python",
    }
)
#: Names whose type :mod:`mimetypes` may not know, read as UTF-8 text.
TEXT_SUFFIXES = frozenset(
    {".txt", ".md", ".markdown", ".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".yaml", ".yml", ".toml", ".xml"}
    | {".html", ".htm", ".rst", ".tex", ".log", ".py", ".js", ".ts", ".sql", ".sh", ".ini", ".cfg"}
)
ACCEPTED = "a PDF (application/pdf), or text as UTF-8 (text/*, JSON, Markdown, CSV, YAML, XML)"
#: Sources a file's passage may not take as its name: they are the conversation's roles.
_ROLES = frozenset({"system", "developer", "instructions", "user", "assistant", "tool", "moot"})
_DATA_URL = re.compile(r"data:(?P<type>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)", re.DOTALL)


class FileProblem(ValueError):
    """A file part that cannot be read as text: ``param`` is the field at fault, the message says why
    and what to send instead."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param}: {why}")
        self.param = param


def file_passage(part: dict[str, Any], where: str) -> ContextChunk:
    """The passage a file part of a message is: its text, its filename as the source. ``part`` holds
    ``file_data``, ``filename``, ``file_id`` and ``file_url`` (the Responses part itself, or the chat
    part's ``file`` object); ``where`` is its place, which a refusal names (a :class:`FileProblem`
    whose param is the field at fault)."""
    if part.get("file_id") is not None:
        raise FileProblem(
            f"{where}.file_id",
            "this server has no Files API, so there is no file to look up; send the file inline "
            "as file_data (a base64 data URL) with its filename",
        )
    if part.get("file_url") is not None:
        raise FileProblem(
            f"{where}.file_url",
            "this server fetches nothing on a request's behalf (no outbound requests); send the "
            "file inline as file_data (a base64 data URL) with its filename",
        )
    data = part.get("file_data")
    name = part.get("filename")
    if name is not None and not isinstance(name, str):
        raise FileProblem(f"{where}.filename", "give the file's name as text")
    if not isinstance(data, str) or not data.strip():
        raise FileProblem(
            f"{where}.file_data",
            "required; send the file inline as a base64 data URL (data:application/pdf;base64,...) with its filename",
        )
    kind, raw = _decoded(data, name, f"{where}.file_data")
    text = _text_of(raw, kind, name, where)
    if not text.strip():
        raise FileProblem(where, "the file holds no text; send a file with text in it")
    source = (name or "").strip()[:200] or "attached file"
    return ContextChunk(text=text.strip(), source=f"file {source}" if source.lower() in _ROLES else source)


def _decoded(data: str, name: str | None, where: str) -> tuple[str, bytes]:
    """The media type and the bytes of ``file_data``: a data URL's type, or the filename's."""
    match = _DATA_URL.fullmatch(data.strip())
    if match is not None:
        if ";base64" not in match["params"].lower():
            raise FileProblem(where, "give the data URL's data as base64 (data:<type>;base64,...)")
        kind, payload = match["type"].strip().lower(), match["data"]
    else:
        if name is None:
            raise FileProblem(
                f"{where}",
                "bare base64 says nothing of the file's type; give a data URL "
                "(data:application/pdf;base64,...) or the filename",
            )
        kind, payload = "", data
    if not kind and name is not None:
        kind = _type_of_name(name)
    try:
        raw = base64.b64decode(re.sub(r"\s+", "", payload), validate=True)
    except (binascii.Error, ValueError):
        raise FileProblem(where, "not valid base64; encode the file's bytes as base64") from None
    return kind, raw


def _type_of_name(name: str) -> str:
    lowered = name.lower()
    if lowered.endswith(".pdf"):
        return "application/pdf"
    if any(lowered.endswith(s) for s in TEXT_SUFFIXES):
        return "text/plain"
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or ""


def _is_text(kind: str) -> bool:
    return kind.startswith("text/") or kind in TEXT_TYPES or kind.endswith("+json") or kind.endswith("+xml")


def _text_of(raw: bytes, kind: str, name: str | None, where: str) -> str:
    if kind in ("", "application/octet-stream") and name is not None:
        kind = _type_of_name(name)  # a generic type: the name may say more
    if kind == "application/pdf":
        return _pdf_text(raw, where)
    if _is_text(kind):
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FileProblem(
                where, f"a file of type {kind} that is not UTF-8 (byte {exc.start}); send it encoded as UTF-8"
            ) from None
        if len(text) > MAX_FILE_CHARS:
            raise FileProblem(where, f"the file is over {MAX_FILE_CHARS:,} characters; send the part that matters")
        return text
    said = f"a file of type {kind}" if kind else "a file of no known type"
    if kind.startswith("image/"):
        raise FileProblem(where, f"{said}; send an image as an image part (input_image, chat's image_url), not a file")
    raise FileProblem(where, f"{said}; a file is read as text, so send {ACCEPTED}")


#: A PDF's reading stops at this many pages or characters of text, or this many seconds (checked
#: between pages; pypdf bounds one page's work itself), and the file is refused: well past what any
#: prompt budget holds, and a file made to cost more (many pages on one huge content stream) costs
#: a worker thread no longer than this.
MAX_PDF_PAGES = 1_000
MAX_FILE_CHARS = 2_000_000
MAX_PDF_SECONDS = 10.0
#: All of one request's files are read within this many seconds, the same bound as one file's: a
#: request of 110 small PDFs, each just under its own bound, held a worker thread for minutes.
MAX_REQUEST_FILE_SECONDS = MAX_PDF_SECONDS

#: How many requests may read PDFs at once, of the threads that read requests
#: (:mod:`moot.server.openai.submission`): the others are never all held by PDFs. A review: four
#: requests of six pages sharing one 2 MB content stream held every one of those threads for their
#: 10 s, and a "hi" waited 10.4 s behind them. A request that finds them all taken is answered 429
#: (the SDKs retry it), before it reads anything.
MAX_PDF_READERS = 2
_PDF_READERS = threading.BoundedSemaphore(MAX_PDF_READERS)

#: The request being read: how long its files may take together, and, from its first file on, by
#: when (:func:`within_file_budget`); None outside one.
_FILE_BUDGET: ContextVar[dict[str, float] | None] = ContextVar("moot_file_budget", default=None)
T = TypeVar("T")


def within_file_budget(read: Callable[[], T], seconds: float = MAX_REQUEST_FILE_SECONDS) -> T:
    """``read()`` (one request read, in a worker thread) with all of its files' reading bounded
    together to ``seconds``, counted from its first file (its schemas' checks do not use it up): a
    file read past it is refused, naming it."""
    budget = {"seconds": seconds}
    token = _FILE_BUDGET.set(budget)
    try:
        return read()
    finally:
        _FILE_BUDGET.reset(token)
        if budget.get("reader"):
            _PDF_READERS.release()


def _take_a_reader(where: str) -> None:
    """One of the :data:`MAX_PDF_READERS` for the request being read, held until its reading ends
    (:func:`within_file_budget`); a 429 if none is free."""
    budget = _FILE_BUDGET.get()
    if budget is None or budget.get("reader"):
        return
    if not _PDF_READERS.acquire(blocking=False):
        raise RequestError(
            f"{where}: the server is reading other requests' PDFs ({MAX_PDF_READERS} at once, its limit); send the "
            "request again in a moment",
            param=where,
            status=429,
            code="files_busy",
        )
    budget["reader"] = 1.0


def _read_by(started: float) -> float:
    """When the file begun at ``started`` must be read by: its own bound, or its request's if sooner."""
    own = started + MAX_PDF_SECONDS
    budget = _FILE_BUDGET.get()
    if budget is None:
        return own
    by = budget.setdefault("by", started + budget["seconds"])
    return min(own, by)


def _pdf_text(raw: bytes, where: str) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError
    except ImportError:  # pragma: no cover - pypdf is in the serve extra
        raise FileProblem(
            where, "this server cannot read PDFs (pypdf is not installed: pip install 'moot[serve]')"
        ) from None
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a malformed file's warnings are not the server's
    _take_a_reader(where)
    started = time.monotonic()
    by = _read_by(started)
    if started > by:
        raise FileProblem(
            where,
            f"the request's files took over {MAX_REQUEST_FILE_SECONDS:.0f} seconds to read before this one; send "
            "fewer files, or their text",
        )
    pages: list[str] = []
    try:
        try:
            reader = PdfReader(io.BytesIO(raw))
        except PyPdfError as exc:
            if "startxref" not in str(exc):
                raise
            # No cross-reference table at all (a PDF written by hand, as the Open Responses suite's
            # fixture is): a pointer to none makes pypdf rebuild it from the objects themselves.
            reader = PdfReader(io.BytesIO(raw + b"\nstartxref\n0\n%%EOF\n"))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileProblem(where, "the PDF is encrypted with a password; send it decrypted")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise FileProblem(
                where,
                f"the PDF has {len(reader.pages)} pages, over the {MAX_PDF_PAGES} read; send the pages that matter",
            )
        for page in reader.pages:
            pages.append((page.extract_text() or "").strip())
            if sum(map(len, pages)) > MAX_FILE_CHARS or time.monotonic() > by:
                raise FileProblem(
                    where,
                    f"the PDF's text is too long to read (over {MAX_FILE_CHARS:,} characters, or "
                    f"{MAX_PDF_SECONDS:.0f} seconds for the request's files together); send the pages that matter",
                )
    except FileProblem:
        raise
    except PyPdfError as exc:
        if type(exc).__name__ == "LimitReachedError":  # pypdf's own bound on a page's work
            raise FileProblem(where, "the PDF is over pypdf's limits on a page's work; send its text instead") from None
        raise FileProblem(where, "not a readable PDF; send the file itself, base64-encoded") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError):
        raise FileProblem(where, "not a readable PDF; send the file itself, base64-encoded") from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise FileProblem(
            where,
            "the PDF has no extractable text (a scanned document is images of text); send its text "
            "instead (from OCR) as input_text or a text file",
        )
    return text
