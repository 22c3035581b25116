"""Subcommands imported when they are used (:class:`LazyGroup`): ``moot debate`` does not import the
evaluation harness, the ABSA pipeline, the server or the MCP door, only what it runs (about 0.3 s of
every start, docs/benchmarks.md). ``moot --help`` and a mistyped command still see every name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_group_from_info
from typer.models import CommandInfo, TyperInfo

if TYPE_CHECKING:
    from typer._click import Command  # (typer vendors click; the pin in pyproject.toml is one that does)

#: What a lazy subcommand's loader returns: a Typer app (a command group) or a command's function.
Loader = Callable[[], "typer.Typer | Callable[..., Any]"]


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name: those built with it, and those of ``lazy``, each built from its
    loader on first use. Listed in ``order`` (the names it does not give after it, as added)."""

    def __init__(
        self, built: MutableMapping[str, Command], lazy: dict[str, Loader], group: TyperGroup, order: list[str]
    ):
        self._built = dict(built)
        self._lazy = lazy
        self._group = group
        self._order = order

    def __getitem__(self, name: str) -> Command:
        if name in self._built:
            return self._built[name]
        target = self._lazy[name]()  # (KeyError: no such command, as in a dict)
        group = self._group
        if isinstance(target, typer.Typer):
            command: Command = get_group_from_info(
                TyperInfo(target, name=name),
                pretty_exceptions_short=True,
                suggest_commands=group.suggest_commands,
                rich_markup_mode=group.rich_markup_mode,
            )
        else:
            command = get_command_from_info(
                CommandInfo(name=name, callback=target),
                pretty_exceptions_short=True,
                rich_markup_mode=group.rich_markup_mode,
            )
        self._built[name] = command
        return command

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        found = name in self._built or name in self._lazy
        self._built.pop(name, None)
        self._lazy = {k: v for k, v in self._lazy.items() if k != name}
        if not found:
            raise KeyError(name)

    def _names(self) -> list[str]:
        names = [*self._built, *(n for n in self._lazy if n not in self._built)]
        ranked = [n for n in self._order if n in names]
        return ranked + [n for n in names if n not in ranked]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._lazy


class LazyGroup(TyperGroup):
    """A Typer group (``typer.Typer(cls=...)``) whose subclass names its lazy subcommands (``lazy``:
    name -> loader, a function that imports the command's module) and the order they are listed in."""

    lazy: ClassVar[dict[str, Loader]] = {}
    order: ClassVar[list[str]] = []

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(self.commands, dict(self.lazy), self, self.order)
