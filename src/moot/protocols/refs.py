"""A protocol named in one line of text: the syntax every front door reads.

``NAME`` (a preset), ``NAME(key=value, ...)`` (a preset with parameters: ``mad(rounds=2)``,
``weighted-vote(signal=answer_prob,softmax_t=0.2)``), ``vote@K`` (a vote of K samples), and two
run-level votes: ``vote@auto`` (``moot eval``: K matched to a debate of the same run) and
``vote@uab(budget=B, cap=K)`` (``moot batch`` and ``moot eval``: B samples per input on average,
moved between a run's inputs by how hard their first sample found them). Values are read as YAML
scalars (``2`` is a number, ``answer_prob`` a string, ``true`` a boolean).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, Field

from moot.core.spec_base import MAX_PARTICIPANTS

_REF = re.compile(r"^(?P<name>[A-Za-z0-9_.\-/]+?)(?:@(?P<at>auto|uab|\d+))?(?:\((?P<params>.*)\))?$")


class ProtocolRefError(ValueError):
    """A protocol reference that cannot be read: the message names it and the syntax."""


#: How deep a parameter's value may nest lists or mappings (``models=[a, b]`` is 1).
MAX_VALUE_DEPTH = 8
#: The most digits of a vote's sample count (``vote@K``): past them, K is over any cap anyway.
MAX_K_DIGITS = 7


class _ValueRefused(yaml.YAMLError):
    """A value using what a protocol's parameter never needs: said as it is."""


class _ValueLoader(yaml.SafeLoader):
    """YAML's safe loader, narrowed to what a protocol's parameter is (a number, a word, a boolean or
    a short list), so that what a value costs is what its length does:
    - no anchors or aliases: a few hundred characters of nested aliases (``[&a [0,0], &b [*a,*a],
      ...]``) expand to gigabytes once anything walks them;
    - no explicit tags (``!!int``), and numbers in decimal only: YAML 1.1's base-60 integers
      (``1:0:0:...``) are read in quadratic time, and its hexadecimal and octal ones (``0x...``,
      ``0777``) escape Python's limit of 4,300 digits: they read as words, as timestamps do;
    - collections nested at most :data:`MAX_VALUE_DEPTH` deep, in flow (``[a, [b]]``) or block
      (``- - a``) style alike: deeper ones exhausted the recursion of YAML's composer."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _ValueRefused("anchors and aliases (& and *) are not allowed in a protocol's parameters")
        if getattr(event, "tag", None) is not None:  # (set only when written: !!int, !foo)
            raise _ValueRefused("tags (! and !!) are not allowed in a protocol's parameters")
        self.depth += 1
        try:
            if self.depth > MAX_VALUE_DEPTH + 1:  # (the value itself is depth 1)
                raise _ValueRefused(f"lists nest deeper than {MAX_VALUE_DEPTH} levels; give a flat value")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


# Its own table of implicit types: YAML's booleans and null, then integers and floats narrowed (no
# timestamps, merge keys or YAML 1.1's octal, hexadecimal and base-60 forms: those are words).
_ValueLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:null")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)
_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:(?:0|[1-9][0-9_]*)?\.[0-9][0-9_]*|(?:0|[1-9][0-9_]*)\.)(?:[eE][-+]?[0-9]+)?$"
               r"|^[-+]?(?:0|[1-9][0-9_]*)[eE][-+]?[0-9]+$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)  # fmt: skip


def _shown(text: str, limit: int = 120) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (a long one with ``…``)."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def read_value(key: str, value: str, text: str) -> Any:
    """One parameter's value, read as YAML (a number, a word, true/false, a [list]), refused in one
    line when it is not one, nests deeper than :data:`MAX_VALUE_DEPTH`, or uses anchors."""
    try:
        return yaml.load(value, Loader=_ValueLoader)  # (the safe loader, narrowed)
    except _ValueRefused as exc:
        raise ProtocolRefError(f"protocol {_shown(text)}: {key}={_shown(value, 80)} is refused: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        raise ProtocolRefError(
            f"protocol {_shown(text)}: {key}={_shown(value, 80)} is not a value (a number, a word, true/false, "
            "or a [list])"
        ) from None
    except ValueError:  # an integer past Python's 4,300 digits
        raise ProtocolRefError(
            f"protocol {_shown(text)}: {key}= is a number of more than 4,300 digits; give a smaller one"
        ) from None


class ProtocolCall(BaseModel):
    """What a reference says, before anything checks that the name exists."""

    name: str
    #: What follows ``@``: a sample count, ``auto`` or ``uab`` (None: nothing).
    at: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


def split_protocols(text: str) -> list[str]:
    """Split on commas outside parentheses and brackets (``vote(models=[a,b]),single``); an empty
    entry between two (``single,,vote@3``: a typo, often of a name) is refused, not skipped."""
    parts = _split_top(text)
    if len(parts) > 1 and not all(parts):
        raise ProtocolRefError(
            f"{text!r} has an empty entry (two commas, or one at an end): remove it or name the protocol"
        )
    return [p for p in parts if p]


def _split_top(text: str) -> list[str]:
    """``text`` split on the commas outside parentheses and brackets, each part stripped (empty ones
    kept: a parameter list's trailing comma, ``mad(rounds=2,)``, is one)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def parse_call(text: str) -> ProtocolCall:
    """``NAME[@K|@auto|@uab][(key=value, ...)]`` read, the values as YAML scalars."""
    m = _REF.match(text.strip())
    if m is None:
        raise ProtocolRefError(f"cannot read protocol {text!r}: use NAME, NAME@K, NAME@auto or NAME(key=value, ...)")
    params: dict[str, Any] = {}
    if m.group("params"):
        pairs = _split_top(m.group("params"))
        if "" in pairs[:-1]:  # a trailing comma is fine (Python's), a leading or doubled one a typo
            raise ProtocolRefError(
                f"protocol {text!r} has an empty parameter (a comma at the start, or two together): remove it"
            )
        for pair in (p for p in pairs if p):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ProtocolRefError(f"protocol {text!r}: parameter {pair!r} is not key=value")
            if key.strip() in params:  # the second would silently win: say which one is meant
                raise ProtocolRefError(f"protocol {text!r}: parameter {key.strip()!r} is given twice; give it once")
            params[key.strip()] = read_value(key.strip(), value.strip(), text)
    at = m.group("at")
    if at is not None and m.group("name") != "vote":
        raise ProtocolRefError(f"{text!r}: @K applies to vote only (vote@5, vote@auto, vote@uab(budget=4))")
    return ProtocolCall(name=m.group("name"), at=at, params=params)


def uab_terms(call: ProtocolCall, text: str) -> tuple[int, int]:
    """``vote@uab(budget=B, cap=K)``'s B (mean samples per input, a whole number) and K (the most
    one input gets, at least B; 8 by default), checked; ``call.params`` keeps what else it held."""
    if "k" in call.params:
        raise ProtocolRefError(f"{text!r}: UAB sets each item's sample count itself; give budget= and cap=, not k=")
    budget, cap = call.params.pop("budget", None), call.params.pop("cap", 8)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        given = f" (it gives {', '.join(sorted(call.params))})" if budget is None and call.params else ""
        raise ProtocolRefError(f"{text!r}: give budget=B, the mean samples per item (a whole number, 1 or more){given}")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < budget:
        raise ProtocolRefError(f"{text!r}: cap= (the most samples one item gets) must be at least the budget")
    return budget, cap


def vote_k(call: ProtocolCall, text: str) -> int:
    """``vote@K``'s K (1 or more)."""
    assert call.at is not None and call.at.isdigit()
    if len(call.at.lstrip("0")) > MAX_K_DIGITS:
        raise ProtocolRefError(f"{_shown(text)}: a vote takes at most {MAX_PARTICIPANTS:,} samples")
    k = int(call.at)
    if k < 1:
        raise ProtocolRefError(f"{text!r}: a vote needs at least 1 sample")
    if k > MAX_PARTICIPANTS:
        raise ProtocolRefError(f"{text!r}: a vote takes at most {MAX_PARTICIPANTS:,} samples")
    return k


def preset_params(call: ProtocolCall, text: str) -> dict[str, Any]:
    """The parameters of a preset named with them, ``vote@K`` as ``k=K`` (refused if also given as
    ``k=``); ``call`` must not be a run-level vote (``@auto``, ``@uab``)."""
    assert call.at not in ("auto", "uab")
    if call.at is None:
        return dict(call.params)
    if "k" in call.params:
        raise ProtocolRefError(f"{text!r} gives the sample count twice: vote@K or vote(k=K)")
    return {**call.params, "k": vote_k(call, text)}
