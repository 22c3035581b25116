"""``moot quality``: seed 004's quality of a saved debate, and how far each measure agrees with hand
labels. Wiring and presentation only (the measures are in ``moot.quality``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from moot.cli.common import ExtraArgs, console, exit_codes, fail, refuse_extra, show_progress_messages
from moot.cli.render import quality_panel
from moot.core.types import load_result
from moot.files import InputFileError
from moot.models.base import BaseChatModel
from moot.models.registry import resolve_model

quality_app = typer.Typer(
    help="Seed 004's debate quality: score a saved debate, or check the measures against hand labels.",
    no_args_is_help=True,
)

JudgeModel = Annotated[
    str | None,
    typer.Option("--judge-model", help="The judge's model for the judged dimensions (default: none, no model call)."),
]


def _judge(spec: str | None) -> BaseChatModel | None:
    if spec is None or spec.lower() == "none":
        return None
    show_progress_messages()  # an embedded judge being loaded says so
    with exit_codes():  # an unusable spec is bad input (2)
        return resolve_model(spec)


@quality_app.command("score")
def score(
    path: Annotated[Path, typer.Argument(help="A debate result written by moot (--json).")],
    extra: ExtraArgs = None,
    judge_model: JudgeModel = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the quality as JSON (into a file: --json > FILE).")
    ] = False,
    write: Annotated[bool, typer.Option("--write", help="Store the quality in the result file too.")] = False,
) -> None:
    """The quality dimensions of a saved debate (the judged ones only with --judge-model)."""
    refuse_extra(extra, json_out)
    from moot.cli.render import write_atomic
    from moot.quality import assess, keep_judged

    try:
        result = load_result(path)
    except InputFileError as exc:  # missing, a folder, not UTF-8, not JSON
        raise fail(f"{exc}; give a result file written by moot debate --json", 2) from None
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise fail(
            f"{path} is not a moot debate result ({first}); give a file written by moot debate --json", 2
        ) from None
    quality = keep_judged(asyncio.run(assess(result, _judge(judge_model))), result.quality)
    if write:
        result.quality = quality
        write_atomic(path, result.to_json())
    if json_out:
        typer.echo(quality.model_dump_json(indent=2))
    else:
        console.print(quality_panel(quality))


@quality_app.command("agreement")
def agreement_command(
    judge_model: JudgeModel = None,
    labels: Annotated[
        Path | None, typer.Option("--labels", help="A labelled set (default: the one shipped with moot).")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the agreement as JSON (into a file: --json > FILE).")
    ] = False,
    extra: ExtraArgs = None,
) -> None:
    """How far each quality measure agrees with the hand-labelled debates (docs/quality.md)."""
    refuse_extra(extra, json_out)
    from moot.quality.agreement import agreement, load_labelled

    try:
        debates = load_labelled(labels)
    except (OSError, ValueError) as exc:
        raise fail(str(exc).splitlines()[0], 2) from None
    report = asyncio.run(agreement(debates, _judge(judge_model)))
    if json_out:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
        return
    table = Table(title=f"quality measures against {report.debates} hand-labelled debates"
                  + (f" (judge {report.judge})" if report.judge else ""))  # fmt: skip
    for col in ("dimension", "method", "labelled", "measured", "Kendall tau-b", "concordance", "pairs"):
        table.add_column(col, justify="left" if col in ("dimension", "method") else "right")
    for d in report.dimensions:
        table.add_row(
            d.dimension, d.method, str(d.labelled), str(d.measured),
            "–" if d.tau_b is None else f"{d.tau_b:+.2f}",
            "–" if d.concordance is None else f"{100 * d.concordance:.0f}%", str(d.pairs),
        )  # fmt: skip
    console.print(table)
    console.print(
        "concordance: of the pairs of debates labelled differently, the share the measure orders alike (50%: chance)"
    )


@quality_app.command("validate")
def validate_command(
    run: Annotated[
        Path, typer.Argument(help="A moot eval run: its folder, its run.sqlite, or a gzipped copy (run.sqlite.gz).")
    ],
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Bootstrap resamples of the 95% intervals.")
    ] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap (numpy's default generator).")] = 0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the validation as JSON (into a file: --json > FILE).")
    ] = False,
    extra: ExtraArgs = None,
) -> None:
    """How well each quality dimension predicts that a debate's decision is right, per protocol (AUROC with
    a bootstrap 95% interval over items): the measures against something they did not define."""
    refuse_extra(extra, json_out)
    from moot.eval.loaded import RunReadError, load_run
    from moot.eval.quality import validate
    from moot.eval.quality_render import validation_table

    try:
        report = validate(load_run(run), resamples=resamples, seed=seed)
    except RunReadError as exc:
        raise fail(str(exc), 2) from None
    except ImportError:
        raise fail("moot quality validate needs numpy: pip install 'moot[eval]'", 2) from None
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
        return
    title, head, rows, notes = validation_table(report)
    table = Table(title=f"{report.dataset}, {report.model}: {title}")
    for col in head:
        table.add_column(col, justify="left" if col == "protocol" else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(note, markup=False, highlight=False)
