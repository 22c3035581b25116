"""``moot tune``: a thin adapter over :mod:`moot.eval.tune` (no loop, no statistics of its own)."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from moot.cli.common import (
    MaxTokensOption,
    ModelOption,
    PriceOption,
    PricesOption,
    ProgressLines,
    check_output_folder,
    console,
    err_console,
    exit_codes,
    fail,
    prices_from,
    show_progress_messages,
)
from moot.eval.goal import NON_INFERIORITY
from moot.eval.runner import Progress as RunProgress
from moot.eval.tune import (
    DEFAULT_CANDIDATES,
    TuneConfig,
    TuneError,
    TuneRunError,
    check,
    free_budget_note,
    parse_budget,
    run_tune,
)
from moot.eval.tune.analyse import TuneReport
from moot.eval.tune.markdown import render_markdown
from moot.models.registry import default_spec
from moot.protocols.refs import split_protocols


def tune_command(
    data: Annotated[
        str,
        typer.Option(
            "--dataset",
            "--data",
            "-d",
            help="Your labelled items: a JSONL file as moot eval reads, or a dataset name (--data is an alias).",
        ),
    ],
    model: ModelOption = None,
    candidates: Annotated[
        str | None,
        typer.Option(
            "--candidates",
            "--protocols",
            "-p",
            "-c",
            help="Protocols to choose from, comma-separated, as moot eval's -p/--protocols (default: a set of "
            "votes, the report's rules and the debates; see docs/tune.md).",
        ),
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="The most a protocol may spend an item: tokens=N, calls=N or usd=X.")
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="accuracy (the most accurate within the budget) or cheapest (the "
            "cheapest not worse than the plain vote by more than --margin).",
        ),
    ] = "accuracy",
    margin: Annotated[
        float, typer.Option("--margin", min=0.0, max=0.5, help="Points (as a fraction) that count as no worse.")
    ] = NON_INFERIORITY,
    holdout: Annotated[
        float | None,
        typer.Option(
            "--holdout", min=0.05, max=0.95, help="The share of items held out to confirm the choice (default 0.5)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split.")] = 0,
    max_tokens: MaxTokensOption = None,
    labels: Annotated[
        str | None, typer.Option("--labels", help="The label set of the answers, comma-separated.")
    ] = None,
    tuning_n: Annotated[
        int | None, typer.Option("--tuning-n", min=1, help="Tune on the first N items of the seeded order...")
    ] = None,
    holdout_n: Annotated[
        int | None, typer.Option("--holdout-n", min=1, help="...and confirm on the next M (instead of --holdout).")
    ] = None,
    cache_from: Annotated[
        list[Path] | None,
        typer.Option("--cache-from", help="A run whose request cache the tuning run may use (repeatable)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="The tune's folder (it resumes there).")] = Path("runs/tune"),
    concurrency: Annotated[int, typer.Option("--concurrency", "-j", min=1, help="Debates at once.")] = 4,
    prices: PricesOption = None,
    price: PriceOption = None,
) -> None:
    """Choose the best protocol for your task and budget on a labelled sample; confirm it on held-out items.

    Writes tuned.yaml: `moot debate -p tuned.yaml`, `moot serve --tuned tuned.yaml`."""
    show_progress_messages()
    with exit_codes(input_errors=(TuneError,), run_errors=(TuneRunError,)):
        if objective not in ("accuracy", "cheapest"):
            raise TuneError(f"--objective {objective!r}: use accuracy or cheapest")
        if holdout is not None and (tuning_n is not None or holdout_n is not None):
            raise TuneError(
                "--holdout splits the items by a share, --tuning-n/--holdout-n by counts: give one or the other"
            )
        check_output_folder(out, "--out")
        config = TuneConfig(
            data=str(data), model=model or default_spec(),
            candidates=split_protocols(candidates) if candidates is not None else list(DEFAULT_CANDIDATES),
            budget=parse_budget(budget), objective=objective, margin=margin, holdout=holdout or 0.5, seed=seed,  # type: ignore[arg-type]
            max_tokens=max_tokens, labels=[x.strip() for x in labels.split(",")] if labels is not None else None,
            tuning_n=tuning_n, holdout_n=holdout_n, cache_from=[str(c) for c in cache_from or []],
        )  # fmt: skip
        table = prices_from(prices, price)
        check(config, table)  # bad input is refused before the progress bar exists (run_tune checks again)
        if (note := free_budget_note(config, table)) is not None:
            err_console.print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("tune", total=None)

            lines = ProgressLines()  # a background tune's log gets a line a minute at most
            phase_now = ["tune"]

            def on_progress(p: RunProgress) -> None:
                bar.update(task, total=p.total, completed=p.done)
                lines(phase_now[0], p.done, p.total)

            def on_phase(phase: str) -> None:  # each part's run counts its results (items x protocols)
                phase_now[0] = f"{phase} (results)"
                bar.update(task, description=phase_now[0], total=None, completed=0)

            try:
                asyncio.run(
                    run_tune(
                        config, out, prices=table, concurrency=concurrency, on_progress=on_progress, on_phase=on_phase
                    )
                )
            except KeyboardInterrupt:
                raise fail(
                    f"interrupted: what finished is saved in {out}; run the same command to resume", 130
                ) from None
    # tune.md names tuned.yaml as its neighbour; shown here, by its path from where the command ran
    report = TuneReport.model_validate_json((out / "tune.json").read_text(encoding="utf-8"))
    shown = render_markdown(report, tuned=shlex.quote(str(out / "tuned.yaml")))
    console.print(shown, markup=False, highlight=False)
    console.print(f"wrote {out / 'tuned.yaml'}, {out / 'tune.md'}, {out / 'tune.json'}", markup=False)
