"""Help that folds a long word onto the next line rather than cutting it.

typer lays ``--help`` out in rich tables, whose columns cut a word too long for them with "…": at 80
columns, ``moot serve --help`` showed ``--max-conversation-by…``, ``postgresql://user:pass…`` and
``MODEL=INPUT,OUTPUT[,CA…``, and a reader could learn neither the option's name nor the format.
:func:`fold_long_words` makes typer's option tables fold such a word instead, and each option's help
one text that wraps (typer groups its parts in a ``Columns`` of its own, which cut them too).
Applied by :func:`moot.cli.main.main` when help is asked for; typer's layout is otherwise its own.
"""

from __future__ import annotations

from typing import Any

_applied = False


def fold_long_words() -> None:
    """Fold, not cut, the long words of typer's help tables (once per process; a typer laid out
    otherwise than 0.29's is left as it is)."""
    global _applied
    if _applied:
        return
    _applied = True
    from rich.columns import Columns
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    original = getattr(rich_utils, "_get_parameter_help", None)
    if getattr(rich_utils, "Table", None) is not Table or original is None:
        return

    class FoldingTable(Table):
        """A table whose columns fold a word too long for them."""

        def add_row(self, *renderables: Any, **options: Any) -> None:
            super().add_row(*renderables, **options)
            for column in self.columns:
                column.overflow = "fold"

    def parameter_help(**kwargs: Any) -> Any:
        made = original(**kwargs)
        parts = made.renderables if isinstance(made, Columns) else []
        texts = [part for part in parts if isinstance(part, Text)]
        if not texts or len(texts) != len(parts):
            return made  # (markdown help: typer's own layout)
        joined = Text(" ").join(texts)
        joined.overflow = "fold"
        return joined

    setattr(rich_utils, "Table", FoldingTable)  # noqa: B010 (typer's module exports no Table)
    rich_utils._get_parameter_help = parameter_help
