"""``moot absa``: the ABSA debate pipeline of seeds 001 and 002 on one sentence or a dataset."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from moot.apps.absa.pipeline import AbsaConfig
from moot.cli.common import (
    ModelOption,
    RayOption,
    UsageError,
    WorkerCpusOption,
    WorkersOption,
    check_output_file,
    check_output_folder,
    check_ray_options,
    console,
    exit_codes,
    fail,
    on_screen,
    show_progress_messages,
)
from moot.cli.render import write_atomic
from moot.files import csv_text
from moot.scale import open_executor
from moot.scale.jobs import JobFailed
from moot.scale.ray_backend import RayConnectError, RayUnavailable
from moot.secrets import redact_json

absa_app = typer.Typer(help="Aspect-based sentiment with a debate layer (seeds 001 and 002).", no_args_is_help=True)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Pipeline config YAML (seed keys; default: full, patch debate).")
]


#: The ABSA layer reports bad input (a config, a data file, a sentence) as ValueError.
ABSA_INPUT = (ValueError, RayUnavailable)


def _config(path: Path | None) -> AbsaConfig:
    with exit_codes(input_errors=ABSA_INPUT):
        return AbsaConfig.load(path) if path is not None else AbsaConfig()


@absa_app.command("run")
def absa_run(
    sentence: Annotated[str, typer.Argument(help="A review sentence (English or Korean).")],
    config: ConfigOpt = None,
    model: ModelOption = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the whole result here.")] = None,
) -> None:
    """Run every stage on one sentence and show what each did."""
    from moot.apps.absa.pipeline import AbsaPipeline

    show_progress_messages()
    cfg = _config(config)
    with exit_codes(input_errors=ABSA_INPUT):
        if json_path is not None:
            check_output_file(json_path, "--json")
        if not sentence.strip():
            raise UsageError("the sentence is blank: give a review sentence")
        pipeline = AbsaPipeline(cfg, model)
        try:
            result = asyncio.run(pipeline.run(sentence))
        except KeyboardInterrupt:
            raise fail("interrupted: nothing was written", 130) from None
    s1 = result.stage1
    console.rule("Stage 1")
    # (model and user text throughout: printed as it is, never read as rich markup)
    terms = [a.term for a in s1.ate.aspects]
    console.print(f"ATE: {terms} -> {s1.ate.sentence_label} ({s1.ate.confidence:.2f})", markup=False)
    console.print(
        "ATSA: "
        + ", ".join(f"{s.aspect_term}={s.polarity} ({s.confidence:.2f})" for s in s1.atsa.aspect_sentiments)
        + f" -> {s1.atsa.sentence_label} ({s1.atsa.confidence:.2f})",
        markup=False,
    )
    if s1.validator is not None:
        issues = ", ".join(f"{i.type}/{i.severity}" for i in s1.validator.issues) or "none"
        console.print(f"Validator: issues {issues}; suggests {s1.validator.suggested_label}; "
                      f"{len(s1.validator.correction_proposals)} proposals", markup=False)  # fmt: skip
    console.rule(f"Debate ({result.debate.variant})" if result.debate else "Debate (off)")
    if result.debate is not None:
        d = result.debate
        for t in d.transcript.turns():
            said = shown(t.text or t.error or "(no reply)")
            console.print(f"[bold]{shown(t.name)}[/bold] (round {t.round}): {said}", markup=True)
        console.print(f"judge: {json.dumps(d.summary, ensure_ascii=False) if d.summary else '(none)'}", markup=False)
        if d.judge_problems:
            console.print(f"[yellow]judge problems:[/yellow] {shown('; '.join(d.judge_problems))}")
        for inj in d.injections:
            console.print(f"memory injected after round {inj.round}: {len(inj.cases)} past cases")
    console.rule("Stage 2")
    for e in result.stage2.applied.log:
        console.print(f"{e.kind}: {e.aspect_term} {e.before} -> {e.after}", markup=False)
    if result.stage2.override is not None:
        st = result.stage2.override.stats
        console.print(f"debate override: applied {st.applied}, skipped low signal {st.skipped_low_signal}, "
                      f"conflict {st.skipped_conflict}, already confident {st.skipped_already_confident}")  # fmt: skip
        for e in result.stage2.override.log:
            console.print(f"{e.kind}: {e.aspect_term} {e.before} -> {e.after}", markup=False)
    console.rule("Moderator")
    m = result.moderator
    rules = shown(str(m.applied_rules))
    console.print(f"[bold]{shown(str(m.final_label))}[/bold] ({m.confidence:.2f}), {m.selected_stage}, rules {rules}")
    console.print(f"rationale: {m.rationale}", markup=False)
    console.print("aspects: " + ", ".join(f"{a.aspect_term}={a.polarity}" for a in m.final_aspects), markup=False)
    console.print(
        f"{result.calls} calls, {result.prompt_tokens + result.completion_tokens} tokens, {result.elapsed_s:.1f} s"
    )
    for err in result.errors:
        console.print(f"[yellow]warning:[/yellow] {shown(err)}")
    if json_path is not None:
        write_atomic(json_path, redact_json(result.model_dump_json(indent=2), indent=2))


@absa_app.command("eval")
def absa_eval(
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder (results.jsonl, metrics.json).")],
    data: Annotated[
        Path | None,
        typer.Option(
            "--dataset", "--data", "-d", help="Annotated JSONL (default: the shipped set; --data is an alias)."
        ),
    ] = None,
    config: ConfigOpt = None,
    model: ModelOption = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="How many sentences (seeded sample).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-j", min=1, help="Sentences at once (with --ray: on each worker).")
    ] = 2,
    ray: RayOption = None,
    workers: WorkersOption = None,
    worker_cpus: WorkerCpusOption = None,
    from_run: Annotated[
        Path | None,
        typer.Option("--from", help="Derive from a finished run whose config makes the same calls (no new call)."),
    ] = None,
) -> None:
    """Run a config over a dataset; re-running resumes. Prints the task and debate metrics."""
    from moot.apps.absa.evaluate import (
        DEFAULT_DATA,
        RunSummary,
        derive_run,
        load_items,
        render_comparison,
        run_eval,
        select,
    )
    from moot.apps.absa.pipeline import AbsaPipeline

    show_progress_messages()
    cfg = _config(config)
    with exit_codes(input_errors=ABSA_INPUT):
        check_ray_options(ray, workers, worker_cpus)
        check_output_folder(out, "--out")
        items = select(load_items(data or DEFAULT_DATA), n, seed)
        if from_run is not None:
            console.print(render_comparison([derive_run(from_run, cfg, items, out)]), markup=False)
            return
        pipeline = AbsaPipeline(cfg, model)  # the model spec and the config's files, checked before the folder
        done = {"n": 0}
        with Progress(TextColumn(f"[bold]{cfg.name}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console) as bar:  # fmt: skip
            task = bar.add_task("absa", total=len(items))

            def on_done(finished: int, total: int) -> None:
                done["n"] = finished
                bar.update(task, completed=finished)

            async def run() -> RunSummary:
                if ray is None:
                    return await run_eval(cfg, pipeline, items, out, concurrency=concurrency, on_done=on_done)
                async with open_executor(
                    pipeline.model.name,
                    ray=ray,
                    concurrency=concurrency,
                    workers=workers,
                    worker_cpus=worker_cpus or 1.0,
                ) as executor:
                    console.print(executor.describe(), markup=False, highlight=False, soft_wrap=True)
                    return await run_eval(cfg, pipeline, items, out, on_done=on_done, executor=executor)

            try:
                try:
                    summary = asyncio.run(run())
                except BaseException:
                    bar.update(task, visible=False)
                    raise
            except (RayConnectError, JobFailed) as exc:
                raise fail(str(exc)) from None
            except KeyboardInterrupt:
                if not done["n"]:  # (results.jsonl is written with the first finished sentence)
                    raise fail(
                        "interrupted before any sentence finished: nothing was saved; re-run the same command to "
                        "start the run",
                        130,
                    ) from None
                raise fail(
                    f"interrupted: {done['n']} of {len(items)} sentences are saved in {out / 'results.jsonl'}; "
                    "re-run the same command to resume",
                    130,
                ) from None
    console.print(render_comparison([summary]), markup=False)


@absa_app.command("report")
def absa_report(
    runs: Annotated[list[Path], typer.Argument(help="Run folders of `moot absa eval` (e.g. the three ablations).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the Markdown table here.")] = None,
    stage1: Annotated[
        bool,
        typer.Option(
            "--stage1/--no-stage1",
            help="Add a column of Stage 1's answers alone, read from the first run (no calls): what the later "
            "stages add.",
        ),
    ] = True,
    csv_out: Annotated[
        Path | None,
        typer.Option("--csv", help="Also write one row per sentence of every run here (no sentence text)."),
    ] = None,
) -> None:
    """Compare runs side by side: what the debate and the override add, at what cost."""
    from moot.apps.absa.evaluate import (
        SENTENCE_COLUMNS,
        render_comparison,
        run_folder_problem,
        sentence_rows,
        summarise,
    )

    with exit_codes():
        for path, option in ((out, "--out"), (csv_out, "--csv")):
            if path is not None:
                check_output_file(path, option)
    summaries, rows = [], []
    for folder in runs:
        if (problem := run_folder_problem(folder)) is not None:
            raise fail(problem, 2)
        cfg_file = folder / "config.json"
        name = json.loads(cfg_file.read_text()).get("name", folder.name)
        summaries.append(summarise(folder, name))
        rows += sentence_rows(folder, name)
    if csv_out is not None:
        write_atomic(csv_out, csv_text(SENTENCE_COLUMNS, rows))  # formula cells neutralised (OWASP)
    if stage1 and summaries:
        summaries.append(summarise(runs[0], summaries[0].config, stage1=True))
    text = render_comparison(summaries)
    if out is not None:
        write_atomic(out, text + "\n")
    console.print(text, markup=False)


def shown(text: str) -> str:
    """Text from a file or a model as the terminal may show it: no markup, no control character, no
    secret (:func:`~moot.cli.common.on_screen`)."""
    return escape(on_screen(text))
