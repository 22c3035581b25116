"""Keep secrets out of logs, transcripts and error messages."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable
from typing import Any

# Environment variables whose values are secrets wherever they turn up.
SECRET_ENV_VARS = ("OPENAI_API_KEY", "MOOT_API_KEY", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY")

# Shapes of common API keys and credentials, redacted even when we did not know the value. A key's
# prefix is found after anything but an ASCII letter or digit (a word boundary missed one glued to
# "_" or to CJK text: 我的密钥是sk-proj-...), so "task-..." and "risk-..." are not keys.
_KEY_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_\-]{12,}"  # OpenAI, Anthropic (sk-ant-), OpenRouter (sk-or-), ...
    r"|moot_sk_[A-Za-z0-9_\-]{12,}"  # a key of moot serve's store (moot serve keys add)
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|AIza[0-9A-Za-z_\-]{30,}"  # Google
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"  # an AWS access key id
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
    r")"
    # an HTTP credential: "Bearer" and 12 characters as before; any case, with a digit, as bearer
    # tokens have and words do not ("bearer certificates" is not one); an Authorization header's, with
    # a digit, a capital or a base64 sign
    r"|\bBearer\s+[A-Za-z0-9_\-.+/=~]{12,}"
    r"|(?i:\bbearer\s+)(?=[A-Za-z0-9_\-.+/=~]*\d)[A-Za-z0-9_\-.+/=~]{12,}"
    r"|(?i:\bauthorization[\"']?\s*[:=]\s*[\"']?(?:basic|bearer|token|digest)\s+)"
    r"(?=[A-Za-z0-9_\-.+/=~]*[0-9A-Z+/=])[A-Za-z0-9_\-.+/=~]{6,}"  # ("Basic authentication" is not one)
)
#: A password in an address (``postgresql://moot:s3cret@host``): the user stays, the password goes;
#: a placeholder (``user:password@``, in a hint or a doc) stays.
#: The user may be empty (``redis://:password@host``); the password runs to the last "@" before the
#: host (an "@" in it, unescaped, is the password's, as URL parsers read it).
_USERINFO = re.compile(r"(?:(?<=://)|(?<=:\\/\\/))([^\s/\\:@]*):([^\s/\\]+)@")  # (and :\/\/, JSON's)
_PLACEHOLDERS = frozenset({"password", "PASSWORD", "<password>", "{password}", "***", "PASS", "pass"})


#: A credential in an address's query or fragment (a signed URL's signature, a key given as ``?key=``,
#: an OAuth token after ``#``): the name stays, the value goes (a review, session 38: an image's signed
#: URL was stored as it was given). The separator may be HTML-escaped (``&amp;``) or percent-encoded
#: (an address inside another's query); the value ends where a query value cannot go on, or at what
#: closes the text around it (a bracket, a comma, a quote). Its "=" may be an HTML entity (``&#61;``,
#: ``&#x3D;``: a page's source quoted in a passage).
_QUERY_SECRET = re.compile(
    r"(?i)((?:[?&#;]|&amp;|%3f|%26|%23)"
    r"(?:x-(?:amz|goog)-(?:signature|credential|security-token)|sig|auth|jwt|code|pass|pwd"
    r"|[a-z0-9_\-]*(?:token|key|secret|password|passwd|assertion|signature))"
    r"(?:=|%3d|&#0*61;|&#x0*3d;))"
    r"(?:[^&#\s\"'<>\\),;\]`{}]|\\/)+(?<!\.)"
)
#: What the JSON of a string holding one of them holds, looked for in its lower-cased text (looser:
#: its separator may be escaped in the JSON).
_MAYBE_QUERY = re.compile(
    r"(?:sig|signature|key|auth|jwt|code|pass|pwd|secret|passwd|password|token|credential|assertion)"
    r"(?:=|%3d|&#0*61;|&#x0*3d;)"
)


def _may_hold_query(text: str) -> bool:
    """Whether ``text`` may hold a credential in an address's query (looked for in C, before the
    patterns above, which try every letter of prose: 20 us on a 3 KB turn with a "?" and a "%")."""
    return ("=" in text or "%3d" in text or "%3D" in text or "&#" in text) and any(
        c in text for c in "?&#;%"
    )  # (memchr)


def _userinfo(found: re.Match[str]) -> str:
    return found.group() if found.group(2) in _PLACEHOLDERS else f"{found.group(1)}:***@"


_MAYBE_KEY = re.compile(r"(?:moot_)?sk[-_][A-Za-z0-9_\-]{12,}")
#: What the JSON of a string that may hold one of the other shapes holds (looser: its escapes stay),
#: found in a few passes over the text, each a search in C (a pattern of all the alternatives, or a
#: case-insensitive one, cost 6 to 10 times as much on every event a server writes).
_MAYBE_PREFIX = re.compile(r"A(?:Iza|[KS]IA)")
_MAYBE_SLACK = re.compile(r"xox[abposr]-")
_BEFORE_UNDERSCORE = ("ghp", "gho", "ghu", "ghs", "ghr")
_UNDERSCORE_RUN = re.compile(r"_[A-Za-z0-9]{20}")
_ANY_CASE_AUTH = re.compile(r"(?i)bearer|authoriz")
#: A JSON escape of an ASCII character, or of one of the look-alikes or the Kelvin sign.
_ESCAPED_ASCII = re.compile(r"\\u(?:00[0-7][0-9a-fA-F]|013[01]|017[fF]|212[aA])")


def _may_hold_shape(text: str) -> bool:
    """Whether ``text`` (JSON) may hold a key shape other than ``sk-``'s: a bearer or an Authorization
    header (in any case, mixed too), a GitHub or Hugging Face token, a Google, AWS or Slack key, an
    address with a password, or a credential in an address's query."""
    if "\\" in text and "\\u" in text and _ESCAPED_ASCII.search(text) is not None:  # ("\\": memchr)
        return True  # an escaped letter or separator (or a look-alike of one): its strings are read
    lowered = text.lower()  # (one pass in C: less than the four searches of each case it replaced)
    if "bearer" in lowered or "authoriz" in lowered:
        return True
    if ("\u0131" in text or "\u0130" in text or "\u017f" in text) and (
        _ANY_CASE_AUTH.search(text) is not None or _QUERY_SECRET.search(text) is not None
    ):
        return True  # ı, İ, ſ: redact()'s case-blind match reads them as i or s, lower() does not (as it does K)
    if _may_hold_query(text) and _MAYBE_QUERY.search(lowered) is not None:
        return True
    if _MAYBE_PREFIX.search(text) is not None or _MAYBE_SLACK.search(text) is not None:
        return True
    if "@" in text and ("://" in text or ":\\" in text):  # (an address, its slashes escaped too)
        return True
    if "ithub_pat_" in text:  # (its runs hold underscores: not the search below)
        return True
    # A GitHub classic or Hugging Face token: an underscore and 20 letters or digits (found in C; a JSON event's
    # field names, each a step in Python, cost 5 us), then what comes before it.
    for found in _UNDERSCORE_RUN.finditer(text):
        j = found.start()
        if text[j - 3 : j] in _BEFORE_UNDERSCORE or text[j - 2 : j] == "hf":
            return True
    return False


#: The environment's own table (CPython's ``os.environ`` keeps its variables in ``_data``, encoded,
#: and updates it with every change made through ``os.environ``), with those names encoded as it
#: keys them; None where it is laid out otherwise.
_ENVIRON_DATA: dict[Any, Any] | None = getattr(os.environ, "_data", None)
_SECRET_KEYS = tuple(os.environ.encodekey(n) for n in SECRET_ENV_VARS) if _ENVIRON_DATA is not None else ()


#: The raw values :func:`known_secrets` last saw in the environment's table, and what it made of them.
_last: tuple[tuple[Any, ...], list[str]] = ((), [])


def known_secrets() -> list[str]:
    """The values of :data:`SECRET_ENV_VARS` set in the environment now. Every event, stored row and
    transcript a server writes asks (dozens per debate): read from the environment's own table, a
    missing variable costs a dictionary miss, not ``os.environ.get``'s KeyError (0.7 against 9 us),
    and the values are decoded again only when one of them changed."""
    global _last
    data = _ENVIRON_DATA
    if data is not None and getattr(os.environ, "_data", None) is _ENVIRON_DATA:
        raws = tuple(data.get(key) for key in _SECRET_KEYS)
        if raws != _last[0]:  # decoded again only when one of them changed
            values = [os.environ.decodevalue(raw) for raw in raws if raw]
            _last = (raws, [v for v in values if len(v) >= 6])
        return list(_last[1])
    return [v for name in SECRET_ENV_VARS if (v := os.environ.get(name)) and len(v) >= 6]


@functools.lru_cache(maxsize=64)
def _as_json(secret: str) -> str:
    """A secret as it appears inside a JSON string (escaped), computed once per secret."""
    return json.dumps(secret, ensure_ascii=False)[1:-1]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every known secret (given ones and those in the environment) by ``***``."""
    return _redact_known(text, redacted(secrets))


def _redact_known(text: str, known: list[str]) -> str:
    """:func:`redact` with its secrets gathered already (:func:`redacted`)."""
    for secret in known:
        text = text.replace(secret, "***")
    if "://" in text or ":\\/\\/" in text:
        text = _USERINFO.sub(_userinfo, text)
    if _may_hold_query(text):
        text = _QUERY_SECRET.sub(r"\1***", text)
    return _KEY_SHAPES.sub("***", text)


def _redact_strings(value: Any, known: list[str]) -> Any:
    if isinstance(value, str):
        return _redact_known(value, known)
    if isinstance(value, list):
        return [_redact_strings(v, known) for v in value]
    if isinstance(value, dict):
        return {_redact_known(k, known): _redact_strings(v, known) for k, v in value.items()}
    return value


def redact_json(text: str, secrets: Iterable[str] = (), *, indent: int | None = None) -> str:
    """JSON text (a transcript, a stored result) with every secret inside its strings replaced by
    ``***``, as :func:`redact` does to a log line: a key typed into a question, given as an option or
    held in the environment never reaches a file or a store. Only strings are rewritten, so the
    numbers and the structure stay as they were (a key of digits cannot corrupt a count). Text that
    holds no secret, the usual case, is returned as it is (mostly without being parsed); text that
    held one is written again with ``indent`` (that of ``text``)."""
    return redact_json_of(text, redacted(secrets), indent=indent)


def redacted(secrets: Iterable[str] = ()) -> list[str]:
    """The values :func:`redact_json` replaces: ``secrets`` and those of the environment now."""
    return [s for s in [*secrets, *known_secrets()] if s and len(s) >= 6]


def redact_json_of(text: str, known: list[str], *, indent: int | None = None) -> str:
    """:func:`redact_json` with its secrets gathered already (:func:`redacted`), for a caller that
    redacts many pieces of one document at once."""
    # Looser than redact(), so that no string holding a secret takes the fast path: a secret as JSON
    # escapes it, a key shape without what comes before it (it may follow an escape such as \n), any
    # "bearer" or "authorization" (their whitespace may be escaped), any address with an "@".
    if (
        not any(_as_json(s) in text for s in known)
        and not (("sk-" in text or "sk_" in text) and _MAYBE_KEY.search(text))
        and not _may_hold_shape(text)
    ):
        return text
    data = json.loads(text)
    clean = _redact_strings(data, known)
    if clean == data:
        return text  # nothing was redacted: the text as it was, not written again
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(clean, indent=indent, ensure_ascii=False, separators=separators)
