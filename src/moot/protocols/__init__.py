"""Presets: debate formats as data. ``get_preset(name)`` returns a fresh spec to adjust."""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from pydantic import ValidationError, validate_call

from moot.core.spec import ProtocolSpec
from moot.files import first_error
from moot.protocols.affirmative_critical import affirmative_critical
from moot.protocols.presets import (
    adaptive_consistency,
    adaptive_debate,
    chateval,
    cisc,
    direct,
    filtered_vote,
    free_mad,
    mad,
    mad_conformist,
    moderated,
    moderated_extended,
    panel,
    select,
    single,
    society_of_minds,
    usc,
    vote,
    weighted_vote,
)

_PRESETS: dict[str, Callable[..., ProtocolSpec]] = {
    "affirmative-critical": affirmative_critical,
    "panel": panel,
    "moderated": moderated,
    "moderated-extended": moderated_extended,
    "society-of-minds": society_of_minds,
    "mad": mad,
    "chateval": chateval,
    "chateval-simultaneous": functools.partial(chateval, "simultaneous"),
    "chateval-summarizer": functools.partial(chateval, "summarizer"),
    "single": single,
    "vote": vote,
    "usc": usc,
    "select": select,
    "cisc": cisc,
    "direct": direct,
    "adaptive-debate": adaptive_debate,
    "mad-conformist": mad_conformist,
    "free-mad": free_mad,
    "adaptive-consistency": adaptive_consistency,
    "weighted-vote": weighted_vote,
    "filtered-vote": filtered_vote,
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


class UnknownPreset(KeyError, ValueError):
    """No preset of that name: a ``KeyError`` (a lookup, as it always was) and a ``ValueError`` (bad
    input, as every other door's refusal of a protocol name is), its message as it reads."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def closest_preset(name: str) -> str | None:
    """The preset a misspelt ``name`` most likely means (``society-of-mind``: ``society-of-minds``)."""
    close = difflib.get_close_matches(str(name), preset_names(), n=1)
    return close[0] if close else None


def get_preset_factory(name: str) -> Callable[..., ProtocolSpec]:
    try:
        return _PRESETS[name]
    except KeyError:
        close = closest_preset(name)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise UnknownPreset(f"no protocol preset named {name!r}{hint}; known: {', '.join(preset_names())}") from None


class PresetParamError(TypeError):
    """A preset parameter is unknown or of the wrong type: the message names it, the preset and what
    it takes (a ``TypeError``, as calling the factory with it would have raised)."""


def get_preset(name: str, **params: Any) -> ProtocolSpec:
    """A fresh spec of a preset; ``params`` go to its factory (``rounds``, ``agents``, ``k``, ...),
    checked against the factory's signature first (``agents: "five"`` is refused by name, not met
    deep inside the factory)."""
    return call_preset(name, get_preset_factory(name), params)


# A factory's signature and its validating wrapper are built once, not per spec: building the
# wrapper generates a pydantic schema, about 3% of a served debate's CPU (docs/benchmarks.md).
def _parameters(factory: Callable[..., ProtocolSpec]) -> Mapping[str, inspect.Parameter]:
    if isinstance(factory, Hashable):
        return _cached_parameters(factory)
    return inspect.signature(factory).parameters


def _validated(target: Callable[..., ProtocolSpec]) -> Callable[..., ProtocolSpec] | None:
    return _cached_validated(target) if isinstance(target, Hashable) else _validate_call(target)


@functools.lru_cache(maxsize=256)
def _cached_parameters(factory: Callable[..., ProtocolSpec]) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(factory).parameters


def _validate_call(target: Callable[..., ProtocolSpec]) -> Callable[..., ProtocolSpec] | None:
    try:
        return validate_call(target)
    except Exception:
        return None


_cached_validated = functools.lru_cache(maxsize=256)(_validate_call)


#: What a parameter annotated as a number alone is written with (``int``, ``float | None``, ...).
_NUMBERS = frozenset({"int", "float", "None", "Optional", "typing.Optional"})


def _number_hint(hint: Any) -> str | None:
    """A parameter's annotation as written, if it is a number alone (``int``, ``float | None``)."""
    written = hint.__name__ if isinstance(hint, type) else hint if isinstance(hint, str) else None
    names = set(re.findall(r"[A-Za-z_][\w.]*", written or ""))
    return written if names and names <= _NUMBERS else None


def call_preset(name: str, factory: Callable[..., ProtocolSpec], params: dict[str, Any]) -> ProtocolSpec:
    """``factory(**params)``, the parameters validated against its type hints."""
    accepted = _parameters(factory)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        names = [k for k, p in accepted.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        unknown = sorted(set(params) - set(names))
        if unknown:
            # (named to a point: a request may send thousands, and the error must stay a line)
            shown = ", ".join(repr(k)[1:-1] if len(k) <= 40 else repr(k[:40])[1:-1] + "…" for k in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise PresetParamError(
                f"preset {name} has no parameter {shown}{more}; its parameters: {', '.join(names) or 'none'}"
            )
    for key, value in params.items():
        # (pydantic's lax mode takes true as 1: rounds: true ran one round) A parameter annotated as a
        # number alone (int, float, optional) refuses a bool; any other annotation is left to pydantic.
        if isinstance(value, bool) and key in accepted and (number := _number_hint(accepted[key].annotation)):
            raise PresetParamError(f"preset {name}: {key} takes {number}, not {str(value).lower()}")
    target = factory.func if isinstance(factory, functools.partial) else factory
    checked = _validated(target)
    if checked is None:  # not introspectable (a builtin, an odd callable): call it as it is
        return factory(**params)
    if isinstance(factory, functools.partial):
        checked = functools.partial(checked, *factory.args, **factory.keywords)
    try:
        spec: ProtocolSpec = checked(**params)
    except ValidationError as exc:
        first = first_error(exc)
        where = ".".join(str(x) for x in first["loc"])
        # pydantic titles a call's own errors by the function's qualified name; another title is the
        # spec the parameters made (ProtocolSpec), not a parameter
        if exc.title != getattr(target, "__qualname__", exc.title):
            given = ", ".join(f"{k}={_short(v)}" for k, v in list(params.items())[:10])
            raise PresetParamError(
                f"preset {name} with {given or 'its defaults'} makes no valid protocol: {where}: "
                f"{first['msg'].removeprefix('Value error, ')}"
            ) from None
        raise PresetParamError(
            f"preset {name}: parameter {where} = {_short(first.get('input'))}: {first['msg']}"
        ) from None
    return spec


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def register_preset(name: str, factory: Callable[..., ProtocolSpec]) -> None:
    _PRESETS[name] = factory


__all__ = [
    "PresetParamError",
    "adaptive_consistency",
    "adaptive_debate",
    "affirmative_critical",
    "call_preset",
    "chateval",
    "cisc",
    "direct",
    "filtered_vote",
    "free_mad",
    "get_preset",
    "get_preset_factory",
    "mad",
    "mad_conformist",
    "moderated",
    "moderated_extended",
    "panel",
    "preset_names",
    "register_preset",
    "select",
    "single",
    "society_of_minds",
    "usc",
    "vote",
    "weighted_vote",
]
