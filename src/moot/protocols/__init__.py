"""Presets: debate formats as data. ``get_preset(name)`` returns a fresh spec to adjust."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moot.core.spec import ProtocolSpec
from moot.protocols.affirmative_critical import affirmative_critical
from moot.protocols.presets import (
    adaptive_debate,
    chateval,
    cisc,
    direct,
    free_mad,
    mad,
    mad_conformist,
    moderated,
    moderated_extended,
    panel,
    single,
    society_of_minds,
    vote,
)

_PRESETS: dict[str, Callable[..., ProtocolSpec]] = {
    "affirmative-critical": affirmative_critical,
    "panel": panel,
    "moderated": moderated,
    "moderated-extended": moderated_extended,
    "society-of-minds": society_of_minds,
    "mad": mad,
    "chateval": chateval,
    "chateval-simultaneous": lambda **kw: chateval("simultaneous", **kw),
    "chateval-summarizer": lambda **kw: chateval("summarizer", **kw),
    "single": single,
    "vote": vote,
    "cisc": cisc,
    "direct": direct,
    "adaptive-debate": adaptive_debate,
    "mad-conformist": mad_conformist,
    "free-mad": free_mad,
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def get_preset_factory(name: str) -> Callable[..., ProtocolSpec]:
    try:
        return _PRESETS[name]
    except KeyError:
        raise KeyError(f"no protocol preset named {name!r}; known: {', '.join(preset_names())}") from None


def get_preset(name: str, **params: Any) -> ProtocolSpec:
    """A fresh spec of a preset; ``params`` go to its factory (``rounds``, ``agents``, ``k``, ...)."""
    return get_preset_factory(name)(**params)


def register_preset(name: str, factory: Callable[..., ProtocolSpec]) -> None:
    _PRESETS[name] = factory


__all__ = [
    "adaptive_debate",
    "affirmative_critical",
    "chateval",
    "cisc",
    "direct",
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
    "single",
    "society_of_minds",
    "vote",
]
