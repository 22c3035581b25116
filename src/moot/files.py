"""Reading the files people give moot: UTF-8 text, with one-line errors that name the file; and
writing the CSV files moot exports, safe to open in a spreadsheet.

Every file moot reads as input (context passages, eval JSONL, protocol and run YAML, scripted
replies, agent reports, ABSA configs and data, a saved result) goes through :func:`read_text`, so
they all behave the same way: a UTF-8 byte-order mark is read as UTF-8 (Windows editors write
one), and a file in another encoding, a folder or a missing path is an :class:`InputFileError`
saying so, never a ``UnicodeDecodeError`` traceback.

Every CSV file moot writes (``moot batch --export x.csv``, ``moot absa report --csv``) goes through
:func:`csv_text`, which neutralises formula cells as the OWASP CSV-injection guidance says.

Text that cannot be written is refused where it comes in: a JSON or YAML escape can write half of a
UTF-16 surrogate pair (``"\\udfff"``), which no UTF-8 file, database or response can hold, or a NUL
(``"\\u0000"``), which no PostgreSQL text can; one such string would fail every write of it later.
:func:`not_text` finds one in a value read from a file or a request (the server's doors use the same
check).

Every SQLite file moot opens (a run's ``run.sqlite``, ``moot serve --db``) is opened by
:func:`open_sqlite`, which reads it once: a truncated or foreign file is a :class:`StoreFileError`
naming it, never a ``sqlite3.DatabaseError`` traceback in the middle of a command.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml
from pydantic_core import ErrorDetails

_UTF16_32 = (
    (codecs.BOM_UTF32_LE, "UTF-32"),  # before UTF-16 LE: its BOM starts the same way
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class InputFileError(ValueError):
    """An input file cannot be read as text. The message names the file, the problem and the fix."""


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of an input file, decoded as UTF-8 (a leading byte-order mark is dropped).

    ``what`` names the file in errors ("context file", "protocol file", ...)."""
    p = Path(path)
    if p.is_dir():
        raise InputFileError(f"{what} {str(p)!r} is a folder, not a file")
    if not p.exists():
        raise InputFileError(f"{what} {str(p)!r} does not exist")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {str(p)!r}: {exc.strerror}") from None
    return decode_text(data, p, what)


def decode_text(data: bytes, path: str | Path, what: str = "file") -> str:
    """``data`` as UTF-8 text; anything else is an :class:`InputFileError` naming ``path``."""
    for bom, encoding in _UTF16_32:
        if data.startswith(bom):
            raise InputFileError(f"{what} {str(path)!r} is {encoding} text, not UTF-8; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputFileError(
            f"{what} {str(path)!r} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); save it as UTF-8"
        ) from None


_SURROGATE = re.compile("[\ud800-\udfff]")
#: What no stored text can hold: half of a UTF-16 pair (no UTF-8 text can), a NUL (no PostgreSQL text can).
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str, fix: str = "send valid UTF-16/UTF-8 text") -> str | None:
    """What is wrong with ``text`` if it holds what no stored text can (a lone surrogate, half of a
    UTF-16 pair, which no UTF-8 text can hold; a NUL, which no PostgreSQL text can), else None."""
    found = _NOT_TEXT.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return f"contains a NUL character (U+0000) at position {found.start()}, which is not text; remove it"
    code = ord(found.group())
    # Python reads a command line's (or a file name's) bytes that are not UTF-8 as U+DC80-U+DCFF.
    byte = (
        f" (the byte 0x{code - 0xDC00:02X} of text that is not UTF-8, as a command line gives it)"
        if 0xDC80 <= code <= 0xDCFF
        else ""
    )
    return f"contains a lone surrogate (U+{code:04X}) at position {found.start()}{byte}; {fix}"


def not_text(value: Any, where: str = "", fix: str = "send valid UTF-16/UTF-8 text") -> tuple[str, str] | None:
    """The first string of a JSON-like value (its keys too) that holds what is not text
    (:func:`text_problem`): its place (``messages[0].content``; ``where`` is the value's own) and the
    problem, else None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item, fix)
            if problem is not None:
                return at, problem
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and (problem := text_problem(key, fix)) is not None:
                    return at, f"the key {key!a} {problem}"
                stack.append((child, f"{at}.{key}" if at else str(key)))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{at}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None


_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def join_pairs(value: Any) -> Any:
    """``value`` (a string, or YAML-like data: keys too) with each escaped surrogate pair joined into
    its character: PyYAML reads ``"\\ud83d\\ude00"`` as two halves, where JSON reads one emoji. A
    lone half stays, for :func:`check_text` to refuse."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return _PAIR.sub(lambda m: m.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le"), value)
    if isinstance(value, dict):
        return {join_pairs(k): join_pairs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [join_pairs(v) for v in value]
    return value


def scrub_surrogates(value: Any) -> Any:
    """``value`` (a string, or JSON-like data: keys too) with each lone surrogate, and each NUL,
    replaced by U+FFFD, the replacement character: for what moot does not refuse but receives, a
    model's reply, whose text must still be writable to a transcript and a store."""
    if isinstance(value, str):
        return _NOT_TEXT.sub("\ufffd", value) if _NOT_TEXT.search(value) is not None else value
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    return value


def check_text(value: Any, where: str, text: str | None = None) -> None:
    """Refuse a value read from an input file that holds a lone surrogate (:func:`not_text`):
    an :class:`InputFileError` naming ``where`` (the file, and its line) and the field. Given the
    file's ``text``, the line of its escape is named too (a YAML or JSON file read whole, its escaped
    pairs joined: :func:`join_pairs`)."""
    found = not_text(value, fix="write the character itself, or both halves of its \\u pair")
    if found is not None:
        field, problem = found
        code = re.search(r"U\+([0-9A-F]{4})", problem)
        line = _lone_escape_line(text, int(code.group(1), 16)) if code and text else None
        if line is not None:
            where += f", line {line}"
        raise InputFileError(f"{where}: {field + ': ' if field else ''}{problem}")


# From the start of a run of backslashes only (the lookbehind): from each one inside it, a run not
# followed by an escape would be read again to its end, the square of its length.
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(\\+)[uU]([dD][89a-fA-F][0-9a-fA-F]{2})")


def _lone_escape_line(text: str, code: int) -> int | None:
    """The line of the first ``\\uXXXX`` escape of the surrogate ``code`` in ``text`` that is not half of
    a pair (an escaped backslash before it, ``\\\\udfff``, is text, not an escape), else None."""
    escapes = [(m.start(), m.end(), int(m.group(2), 16)) for m in _SURROGATE_ESCAPE.finditer(text)
               if len(m.group(1)) % 2 == 1]  # fmt: skip
    for i, (start, end, value) in enumerate(escapes):
        high = 0xD800 <= value <= 0xDBFF
        after = escapes[i + 1] if i + 1 < len(escapes) and escapes[i + 1][0] == end else None
        before = escapes[i - 1] if i > 0 and escapes[i - 1][1] == start else None
        joins_next = high and after is not None and 0xDC00 <= after[2] <= 0xDFFF
        joins_last = not high and before is not None and 0xD800 <= before[2] <= 0xDBFF
        paired = joins_next or joins_last
        if value == code and not paired:
            return text.count("\n", 0, start) + 1
    return None


class StoreFileError(InputFileError):
    """A SQLite file moot cannot read (truncated, damaged, or not SQLite): one line naming it.
    ``path`` and ``reason`` (SQLite's words) let a caller name the file as its user gave it."""

    def __init__(self, message: str, path: Path, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


def open_sqlite(
    path: str | Path,
    kind: str = "a moot store",
    *,
    fix: str = "give another path, or move that file away",
    check_same_thread: bool = True,
) -> sqlite3.Connection:
    """A connection to the SQLite file at ``path`` (created when missing), read once so that a
    truncated or foreign file is refused here, as a :class:`StoreFileError` saying that ``path`` is
    not ``kind`` and ``fix``, rather than as a ``sqlite3.DatabaseError`` in the middle of a command.
    Every store moot opens (a run's, ``moot serve --db``) is opened here."""
    conn = sqlite3.connect(path, check_same_thread=check_same_thread)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreFileError(
            f"{path} is not {kind} ({exc}): it is truncated, damaged or another kind of file; {fix}",
            Path(path),
            str(exc),
        ) from None
    return conn


def text_lines(text: str) -> list[str]:
    """The lines of a JSONL text: split on newlines only (``str.splitlines`` also splits on
    U+2028 and other characters a JSON string may hold as they are)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def json_bytes(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8, by orjson (a fifth of ``json.dumps``'s time on a debate's
    request), or by the standard library for what orjson refuses (a lone surrogate, which it
    escapes; an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


#: How deep the lists and mappings of an input file may nest: far past any moot file's (a protocol's
#: JSON Schemas included), well short of the recursion of the code that reads them (about 1,000).
MAX_DEPTH = 100


class TooDeep(yaml.YAMLError):
    """A document whose lists and mappings nest deeper than :data:`MAX_DEPTH`: each reader of YAML
    reports it as it reports invalid YAML (a ``yaml.YAMLError``), naming its file."""


def _too_deep(value: Any) -> bool:
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return True
            pending.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


_DEEP = f"its lists and mappings nest deeper than {MAX_DEPTH} levels; flatten it"


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``; a document nested deeper than :data:`MAX_DEPTH` is a :class:`TooDeep`
    (the parser itself would stop at Python's recursion limit with a traceback)."""
    try:
        value = yaml.safe_load(text)
    except RecursionError:
        raise TooDeep(_DEEP) from None
    if _too_deep(value):
        raise TooDeep(_DEEP)
    return value


def load_json(text: str) -> Any:
    """``json.loads(text)``; one nested deeper than :data:`MAX_DEPTH` is a ``json.JSONDecodeError``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError(_DEEP, text, 0) from None
    if _too_deep(value):
        raise json.JSONDecodeError(_DEEP, text, 0)
    return value


def too_deep(exc: json.JSONDecodeError | yaml.YAMLError) -> str | None:
    """What :func:`load_json` or :func:`load_yaml` said when it refused a document nested too deep
    (it has no position worth naming); None for any other error."""
    if isinstance(exc, TooDeep) or (isinstance(exc, json.JSONDecodeError) and exc.msg == _DEEP):
        return _DEEP
    return None


def syntax_problem(exc: json.JSONDecodeError | yaml.YAMLError) -> str:
    """A JSON or YAML syntax error as one clause, where first: ``line 2, column 1: Expecting
    value`` (the decoders' own text splices the position into the middle, or spans lines)."""
    if (deep := too_deep(exc)) is not None:
        return deep
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context or 'invalid YAML'}"
    return " ".join(str(exc).split())


def read_json(path: str | Path, what: str = "file") -> Any:
    """A JSON file's value (:func:`read_text` rules); invalid JSON is an :class:`InputFileError`
    naming the line."""
    text = read_text(path, what)
    try:
        value = load_json(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{what} {str(path)!r} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    check_text(value, f"{what} {str(path)!r}", text)
    return value


def read_jsonl(path: str | Path, what: str = "file") -> list[tuple[int, Any]]:
    """The values of a JSONL file with their line numbers; blank lines are skipped, invalid JSON is
    an :class:`InputFileError` naming the line."""
    out: list[tuple[int, Any]] = []
    for n, line in enumerate(text_lines(read_text(path, what)), 1):
        if not line.strip():
            continue
        try:
            out.append((n, load_json(line)))
        except json.JSONDecodeError as exc:
            raise InputFileError(f"{what} {str(path)!r}, line {n}: not valid JSON ({exc.msg})") from None
        check_text(out[-1][1], f"{what} {str(path)!r}, line {n}")
    return out


#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection"): a cell that begins
#: with one of them is written with a leading ``'``, which makes it text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: A cell that is a plain number (``-5``, ``+3.2``, ``-1e-3``) is written as it is: a spreadsheet
#: reads it as that number, and a number runs nothing. OWASP's guidance prefixes every such cell;
#: moot departs from it only here, so that negative numbers stay numbers.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell a spreadsheet shows as text, never runs as a formula."""
    text = "" if value is None else str(value)
    if text.startswith(FORMULA_STARTS) and _PLAIN_NUMBER.fullmatch(text) is None:
        return "'" + text
    return text


def csv_text(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A CSV document: a header of ``columns``, then one line per row (missing keys empty, others
    ignored), every cell through :func:`csv_cell`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in columns])
    return buf.getvalue()


class _Invalid(Protocol):
    """A validation error: pydantic's, or FastAPI's for a request."""

    def errors(self) -> Sequence[ErrorDetails]: ...


def field_path(loc: Iterable[int | str]) -> str:
    """A field's place as OpenAI's API names it in an error's ``param``, and moot's own refusals do:
    ``messages[0].content``, an index in brackets, a name after a dot."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def first_error(exc: _Invalid) -> ErrorDetails:
    """The error of a file's or a body's content to name first: an unknown key before the others (a
    misspelt required key is both unknown and missing, and "unknown key 'questoin'; it may have
    question, ..." is the message that finds it), else pydantic's first."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
