"""``moot batch``: one debate per input line, stored as each finishes, resumable. Wiring only."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from moot.batch.items import BatchInputError
from moot.batch.results import BatchResult, check_export_path, export
from moot.batch.runner import run_batch
from moot.cli.common import (
    ApiKeyOption,
    BaseUrlOption,
    ConcurrencyOption,
    MaxTokensOption,
    ModelOption,
    PriceOption,
    PricesOption,
    ProgressLines,
    RayOption,
    TimeoutOption,
    TraceContentOption,
    TraceOption,
    UsageError,
    WorkerCpusOption,
    WorkersOption,
    check_output_file,
    check_output_folder,
    check_ray_options,
    console,
    exit_codes,
    fail,
    open_tracing,
    prices_from,
    show_progress_messages,
)
from moot.eval.runner import Progress as RunProgress
from moot.eval.store import DB_NAME
from moot.scale.ray_backend import RayConnectError, RayUnavailable


def batch_command(
    inputs: Annotated[
        Path, typer.Argument(help="A .jsonl file (question, optional id, context, overrides) or one question per line.")
    ],
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            "-p",
            help="A preset (see `moot protocols`), with parameters as NAME(key=value,...) or vote@K, a protocol YAML "
            "file, or vote@uab(budget=B,cap=K): B samples per input on average, moved to the inputs that need them.",
        ),
    ] = "affirmative-critical",
    model: ModelOption = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run folder (default: runs/INPUT-NAME).")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", "-r", min=1, help="Most debate rounds.")] = None,
    max_tokens: MaxTokensOption = None,
    max_calls: Annotated[int | None, typer.Option("--max-calls", min=1, help="Most model calls per debate.")] = None,
    timeout: TimeoutOption = None,
    concurrency: ConcurrencyOption = 4,
    export_path: Annotated[
        Path | None,
        typer.Option("--export", help="Also write one row per input to this .jsonl or .csv file."),
    ] = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
    worker_cpus: WorkerCpusOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    prices: PricesOption = None,
    price: PriceOption = None,
    trace: TraceOption = False,
    trace_content: TraceContentOption = False,
) -> None:
    """Run one debate per input; re-running the same command resumes (appended lines extend it)."""
    folder = out or Path("runs") / inputs.stem
    options = {k: v for k, v in {"base_url": base_url, "api_key": api_key}.items() if v}
    show_progress_messages()
    with exit_codes(input_errors=(BatchInputError,)):  # every path checked before any work
        check_ray_options(ray, workers, worker_cpus)
        check_output_folder(folder, "--out")
        if export_path is not None:
            check_export_path(export_path)
            check_output_file(export_path, "--export")
            if export_path.exists() and inputs.exists() and export_path.samefile(inputs):
                # (the export replaced the questions, and the re-run that resumes it was then refused)
                raise UsageError(f"--export {str(export_path)!r} is the input file: give the export another path")
        tracing = open_tracing(trace, trace_content)
    columns = (
        # (a file gets the counts without the bar's drawing: docs/eval.md, "a line when it completes")
        TextColumn("[bold]{task.description}"), *((BarColumn(),) if console.is_terminal else ()), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    )  # fmt: skip
    counts = {"ok": 0, "failed": 0}
    table = prices_from(prices, price)
    spent = Spent()

    bar = Progress(*columns, console=console, transient=False)
    task = bar.add_task(f"{inputs.name} x {protocol}", total=None, info="", start=False)

    def on_start(where: str) -> None:
        console.print(where, markup=False, highlight=False, soft_wrap=True)
        bar.start_task(task)  # the clock and the ETA start when the workers are ready
        bar.start()

    lines = ProgressLines()  # a background run's log gets a line a minute at most

    def on_progress(p: RunProgress) -> None:
        failed = f"{p.failed} failed, " if p.failed else ""
        what = f"{inputs.name} x {protocol}" + (f" ({p.stage})" if p.stage else "")
        bar.update(task, description=what, total=p.total, completed=p.done, info=f"{failed}{p.tokens:,} tokens")
        lines(what, p.done, p.total, f"{failed}{p.tokens:,} tokens")

    async def drive() -> None:
        # With --trace: a span for the run, and under it each debate's tree, made from its transcript
        # when it comes back (it may have run on a Ray worker); those an earlier run finished are not.
        run_span = tracing.span(f"moot batch {inputs.name}", {"moot.protocol": protocol}) if tracing else None
        with run_span or contextlib.nullcontext() as parent:
            traced = tracing.handler(parent=parent) if tracing is not None else None
            async for result in run_batch(
                inputs, out=folder, protocol=protocol, model=model, rounds=rounds, max_tokens=max_tokens,
                timeout_s=timeout, max_calls=max_calls, concurrency=concurrency, ray=ray, workers=workers,
                worker_cpus=worker_cpus or 1.0, model_options=options, on_progress=on_progress, on_start=on_start,
                prices=table,
            ):  # fmt: skip
                counts["ok" if result.status == "ok" else "failed"] += 1
                spent.add(result)
                if traced is not None and result.transcript is not None and not result.resumed:
                    traced.record(result.transcript)

    try:
        # Bad input (the file, a line, the model spec, a busy or different run folder) exits 2; a
        # run that could not be done 1.
        with exit_codes(input_errors=(BatchInputError, RayUnavailable)):
            asyncio.run(drive())
    except RayConnectError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise fail(
            f"interrupted: finished items are saved in {folder / DB_NAME}; re-run the same command to resume", 130
        ) from None
    finally:
        if bar.live.is_started:  # (stopping a bar that never started prints an empty line)
            bar.stop()
        if tracing is not None:
            tracing.shutdown()  # the spans buffered, exported however the run ended
    console.print(f"{counts['ok']} ok, {counts['failed']} failed; {spent.describe()}; results in {folder / DB_NAME}")
    if export_path is not None:
        rows = export(folder, export_path, table)
        console.print(f"wrote {rows} rows to {export_path}")


class Spent:
    """What a batch cost so far: money where every debate was priced, else tokens and why."""

    def __init__(self) -> None:
        self.usd = 0.0
        self.tokens = 0
        self.debates = 0
        self.unpriced = 0

    def add(self, row: BatchResult) -> None:
        if row.transcript is None:
            return
        self.debates += 1
        self.tokens += row.tokens
        if row.cost_usd is None:
            self.unpriced += 1
        else:
            self.usd += row.cost_usd

    def describe(self) -> str:
        if not self.debates:
            return "nothing spent"
        if self.unpriced:
            return (
                f"{self.tokens:,} tokens (no money figure: {self.unpriced} debates used a model without a price; "
                "give --prices FILE or --price MODEL=INPUT,OUTPUT[,CACHED_INPUT])"
            )
        return f"${self.usd:.4f} (${self.usd / self.debates:.6f} a debate), {self.tokens:,} tokens"
