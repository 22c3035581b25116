"""The ``moot`` command line: wiring and presentation only."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, ClassVar

import typer
from pydantic import ValidationError
from rich.markup import escape

import moot.apps.absa.protocols  # (registers the ABSA presets in every moot process)
import moot.quality.judge  # noqa: F401  (registers the quality judge's turn schema in every moot process)
from moot.cli.common import (
    ApiKeyOption,
    BaseUrlOption,
    PriceOption,
    PricesOption,
    TraceContentOption,
    TraceOption,
    UsageError,
    check_result_file,
    console,
    err_console,
    exit_codes,
    fail,
    on_screen,
    open_tracing,
    prices_from,
    show_progress_messages,
)
from moot.cli.context import load_context, load_images
from moot.cli.lazy import LazyGroup, Loader
from moot.cli.render import LiveRenderer, TranscriptWriter, quality_panel, summary_panel, write_atomic
from moot.core.budget import budget_for, input_problem
from moot.core.cost import debate_cost
from moot.core.engine import DebateTimeout, Engine
from moot.core.events import DebateStarted, Event
from moot.core.spec import ProtocolSpec
from moot.core.types import DebateResult, DebateTask
from moot.files import load_yaml
from moot.models.base import BaseChatModel
from moot.models.registry import default_spec, resolve_model
from moot.protocols.affirmative_critical import affirmative_critical
from moot.protocols.loader import load_run_file, resolve_protocol

#: How much of a long question the header shows.
HEADER_CHARS = 200


def _models() -> typer.Typer:
    from moot.cli.catalogue import models_app

    return models_app


def _protocols() -> typer.Typer:
    from moot.cli.catalogue import protocols_app

    return protocols_app


def _eval() -> typer.Typer:
    from moot.cli.eval import eval_app

    return eval_app


def _absa() -> typer.Typer:
    from moot.cli.absa import absa_app

    return absa_app


def _quality() -> typer.Typer:
    from moot.cli.quality import quality_app

    return quality_app


def _serve() -> typer.Typer:
    from moot.cli.serve import serve_app

    return serve_app


def _arbitrate() -> Callable[..., None]:
    from moot.cli.arbitrate import arbitrate_command

    return arbitrate_command


def _batch() -> Callable[..., None]:
    from moot.cli.batch import batch_command

    return batch_command


def _mcp() -> Callable[..., None]:
    from moot.cli.mcp import mcp_command

    return mcp_command


def _tune() -> Callable[..., None]:
    from moot.cli.tune import tune_command

    return tune_command


def _view() -> Callable[..., None]:
    from moot.cli.view import view_command

    return view_command


class MootCommands(LazyGroup):
    """moot's commands, in the order ``moot --help`` lists them; all but the debate's own imported
    when used (:mod:`moot.cli.lazy`)."""

    lazy: ClassVar[dict[str, Loader]] = {
        "eval": _eval,
        "tune": _tune,
        "serve": _serve,
        "mcp": _mcp,
        "batch": _batch,
        "view": _view,
        "quality": _quality,
        "arbitrate": _arbitrate,
        "absa": _absa,
        "models": _models,
        "protocols": _protocols,
    }
    order: ClassVar[list[str]] = [
        "debate", "run", "eval", "tune", "serve", "mcp", "batch", "view", "quality", "arbitrate", "absa",
        "models", "protocols", "version",
    ]  # fmt: skip


app = typer.Typer(
    name="moot",
    help="Structured multi-agent LLM debate: typed, budgeted, on any model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=MootCommands,
)


QualityOption = Annotated[
    bool,
    typer.Option(
        "--quality",
        help="Add seed 004's quality dimensions to the result (docs/quality.md); the judged ones by --judge-model.",
    ),
]
JudgeOption = Annotated[
    str | None,
    typer.Option(
        "--judge-model",
        help="The quality judge's model (default: the debate's model; 'none': only the measures without a model).",
        show_default=False,
    ),
]


@app.command()
def debate(
    question: Annotated[str, typer.Argument(help="The question to debate.")],
    context: Annotated[
        list[Path] | None,
        typer.Option(
            "--context",
            "-c",
            help="Context passages: a .json list or a .jsonl of them; any other file is one passage. Repeatable.",
        ),
    ] = None,
    image: Annotated[
        list[str] | None,
        typer.Option(
            "--image",
            help="An image shown with the question: a PNG, JPEG, GIF or WebP file, or an https address (the model's "
            "server fetches it). Repeatable; needs a model that reads images (openai:MODEL of a vision model).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="embedded[:NAME], openai:MODEL, langchain:MODULE:ATTR or scripted:FILE "
            "(default: $MOOT_MODEL or embedded).",
        ),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            "-p",
            help="A preset (see `moot protocols`), with parameters as NAME(key=value,...) or vote@K, or a protocol "
            "YAML file.",
        ),
    ] = "affirmative-critical",
    rounds: Annotated[
        int | None, typer.Option("--rounds", "-r", min=1, help="Most debate rounds (default: the protocol's).")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            "-t",
            min=0.001,
            help="Whole-debate timeout, seconds (default: the protocol's, else 120 per planned model call).",
        ),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Token budget of each turn (default: the protocol's).")
    ] = None,
    synthesize: Annotated[
        bool, typer.Option("--synthesis/--no-synthesis", help="End with a synthesis (affirmative-critical).")
    ] = True,
    max_calls: Annotated[int | None, typer.Option("--max-calls", min=1, help="Maximum model calls.")] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full result here (written as the debate grows).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final answer.")] = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    quality: QualityOption = False,
    judge_model: JudgeOption = None,
    prices: PricesOption = None,
    price: PriceOption = None,
    trace: TraceOption = False,
    trace_content: TraceContentOption = False,
) -> None:
    """Run a debate on a question and show it live (default: seed 000's affirmative/critical debate)."""

    def prepare() -> tuple[ProtocolSpec, DebateTask, Engine]:
        if (base_url or api_key) and not (model or default_spec()).startswith("openai:"):
            raise UsageError("--base-url and --api-key only apply to openai: models (use --model openai:NAME)")
        task = DebateTask(question=question, context=load_context(context or []), images=load_images(image or []))
        spec = build_spec(protocol, rounds, synthesize, timeout, max_tokens, max_calls)
        if (note := tuned_note(protocol, model or default_spec())) is not None:
            console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
        return spec, task, Engine(spec, model, base_url=base_url, api_key=api_key)

    options = {"base_url": base_url, "api_key": api_key} if (model or default_spec()).startswith("openai:") else {}
    execute(prepare, json_path, quiet, Extras(quality, judge_model, prices, price, options, trace, trace_content))


class Extras:
    """What a command adds to a debate: its cost (always), its quality and its trace (when asked)."""

    def __init__(
        self,
        quality: bool = False,
        judge: str | None = None,
        prices: str | None = None,
        price: list[str] | None = None,
        model_options: dict[str, Any] | None = None,
        trace: bool = False,
        trace_content: bool = False,
    ) -> None:
        self.quality, self.judge, self.prices, self.price = quality, judge, prices, price
        self.model_options = {k: v for k, v in (model_options or {}).items() if v}
        self.trace, self.trace_content = trace or trace_content, trace_content

    def tracer(self) -> tuple[Any, Callable[[], None]] | None:
        """The trace handler and the function that flushes it, or None without --trace (the
        exporters, sampler and resource from the standard OTEL_* environment: docs/tracing.md)."""
        tracing = open_tracing(self.trace, self.trace_content)
        return None if tracing is None else (tracing.handler(), tracing.shutdown)

    def judge_model(self, engine: Engine) -> BaseChatModel | None:
        """The judge: --judge-model, else the debate's decision model or first participant's model."""
        if not self.quality or (self.judge or "").lower() == "none":
            return None
        if self.judge is None:
            return engine.decision_model or next(iter(engine.models.values()))
        options = self.model_options if self.judge.startswith("openai:") else {}
        return resolve_model(self.judge, **options)


def tuned_note(protocol: str, model: str) -> str | None:
    """A warning when a ``tuned.yaml`` runs on another model than the one ``moot tune`` measured it
    on: its evidence (``tuned:``) says nothing about this one."""
    import yaml

    from moot.models.registry import canonical_spec
    from moot.protocols.tuned import TunedFile

    path = Path(protocol)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return None
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "tuned" not in data:
            return None  # a protocol file with no evidence
        tuned = TunedFile.from_data(data).tuned
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValidationError):
        return None  # the loader has refused it already, by name
    tuned_on, running = canonical_spec(tuned.model), canonical_spec(model)
    if tuned_on == running:
        return None
    return (
        f"{path} was tuned on {tuned_on}; this debate runs on {running}, on which its evidence (tuned:) was not "
        f"measured: give --model {tuned_on}, or tune again on {running}"
    )


def judge_note(judge: BaseChatModel | None, asked: str | None) -> str | None:
    """A warning when the quality judge defaulted to an embedded model, which measured at chance as a
    judge (docs/quality.md, the agreement with the hand labels)."""
    if judge is None or asked is not None or not judge.name.startswith("embedded"):
        return None
    return (
        f"the quality judge is the debate's model, {judge.name}; as a judge the shipped 1.5B model agrees with "
        "the hand labels at chance on reasoning depth (docs/quality.md): give --judge-model MODEL, or "
        "--judge-model none for the measures without a model"
    )


def execute(
    prepare: Callable[[], tuple[ProtocolSpec, DebateTask, Engine]],
    json_path: Path | None,
    quiet: bool,
    extras: Extras | None = None,
) -> None:
    """Run a prepared debate with live rendering and the growing transcript; one-line errors.

    Everything is checked before the first call (bad input exits 2); a failed or timed-out debate
    exits 1 with its partial transcript written; Ctrl-C writes what was finished, status
    ``interrupted``, and exits 130. Its cost is always computed; its quality and trace on request."""
    extras = extras or Extras()
    show_progress_messages()
    with exit_codes():
        if json_path is not None:
            check_result_file(json_path, "--json")
        prices = prices_from(extras.prices, extras.price)
        spec, task, engine = prepare()
        if (problem := spec.call_budget_problem()) is not None:
            raise UsageError(problem)
        if (problem := input_problem(spec, task, engine.models, engine.decision_model)) is not None:
            raise UsageError(problem)  # a context no budget can hold (a 50 MB file), before any call
        judge = extras.judge_model(engine)
        if (note := judge_note(judge, extras.judge)) is not None:
            console.print(f"[yellow]note:[/] {note}", highlight=False)
        tracing = extras.tracer()
    # The command's own key, redacted from the transcript as the keys moot knows are.
    secrets = [key] if (key := extras.model_options.get("api_key")) else []
    handlers: list[Any] = []
    if tracing is not None:
        handlers.append(tracing[0])
    if json_path is not None:
        handlers.append(TranscriptWriter(json_path, secrets))
    renderer = None if quiet else LiveRenderer(console, secrets)
    if renderer is not None:
        handlers.append(renderer)
    live: dict[str, Any] = {}

    def on_event(event: Event) -> None:
        if isinstance(event, DebateStarted):
            live.update(result=event.result, t0=time.perf_counter())
        for handler in handlers:
            handler(event)

    engine.on_event = on_event
    try:
        with exit_codes():
            if renderer is not None:
                where = ", ".join(sorted({m.name for m in engine.models.values()}))
                rounds = spec.rounds_to_run()
                asked = escape(on_screen(_shorten(task.question), secrets))
                console.print(
                    f"[bold]{asked}[/bold]  [dim]({escape(spec.name)}, {escape(where)}, "
                    f"up to {rounds} round{'s' if rounds != 1 else ''})[/dim]"
                )
                if spec.unread_rounds():
                    console.print(f"[yellow]note:[/yellow] {escape(spec.unread_rounds_note())}")
                with renderer:
                    result = _traced_run(engine, task, tracing)
            else:
                result = _traced_run(engine, task, tracing)
    except DebateTimeout as exc:
        exc.result.cost = debate_cost(exc.result, prices)
        _report(exc.result, quiet, json_path, secrets)
        raise fail(f"{exc} ({_kept(json_path)})") from None
    except KeyboardInterrupt:
        raise _interrupted(live, json_path, secrets) from None
    result.cost = debate_cost(result, prices)
    if extras.quality:
        from moot.quality import assess

        with exit_codes():
            result.quality = asyncio.run(assess(result, judge))
    _report(result, quiet, json_path, secrets)
    if result.status != "complete":
        raise fail(f"{result.error or 'the debate failed'} ({_kept(json_path)})")


def _kept(json_path: Path | None) -> str:
    """Where a debate that did not finish left its turns (with -q, nothing else says it)."""
    return f"partial transcript kept in {json_path}" if json_path else "--json FILE keeps its finished turns"


def _interrupted(live: dict[str, Any], json_path: Path | None, secrets: list[str]) -> typer.Exit:
    """Ctrl-C: the transcript says ``interrupted`` (not ``running``), with every turn it had."""
    result: DebateResult | None = live.get("result")
    if result is None:
        return fail("interrupted before the debate started", 130)
    result.status = "interrupted"
    result.stop_reason = "interrupted"
    result.error = "interrupted (Ctrl-C or SIGTERM) before the debate ended"
    result.elapsed_s = time.perf_counter() - live["t0"]
    for turn in [*result.turns(), *result.decision_turns]:
        if turn.error is not None and turn.error.startswith("cancelled:"):
            turn.error = "cancelled: the debate was interrupted during this call"
    finished = sum(1 for t in [*result.turns(), *result.decision_turns] if t.ok)
    if json_path is None:
        return fail(f"interrupted after {finished} finished turn(s); nothing written (--json FILE keeps them)", 130)
    write_atomic(json_path, result.to_json(secrets=secrets))
    return fail(f"interrupted: {finished} finished turn(s) written to {json_path} (status: interrupted)", 130)


def _shorten(text: str, limit: int = HEADER_CHARS) -> str:
    shown = " ".join(text.split())
    return shown if len(shown) <= limit else f"{shown[: limit - 1]}… ({len(text):,} characters)"


@app.command()
def run(
    path: Annotated[Path, typer.Argument(help="A run file: protocol, model(s), question, context.")],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full result here (written as the debate grows).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final answer.")] = False,
    quality: QualityOption = False,
    judge_model: JudgeOption = None,
    prices: PricesOption = None,
    price: PriceOption = None,
    trace: TraceOption = False,
    trace_content: TraceContentOption = False,
) -> None:
    """Run a whole debate described in a YAML file: protocol, model(s), question, context.

    The README's "A whole run fits in one file" shows one."""

    def prepare() -> tuple[ProtocolSpec, DebateTask, Engine]:
        run_file = load_run_file(path)
        spec = budget_for(run_file.spec())  # the protocol's own budget, else the default timeout
        task = DebateTask(question=run_file.question, context=list(run_file.context), reference=run_file.reference)
        return spec, task, Engine(spec, run_file.model, models=dict(run_file.models))

    execute(
        prepare, json_path, quiet, Extras(quality, judge_model, prices, price, trace=trace, trace_content=trace_content)
    )


def build_spec(
    protocol: str,
    rounds: int | None,
    synthesize: bool,
    timeout: float | None,
    max_tokens: int | None,
    max_calls: int | None,
) -> ProtocolSpec:
    """The protocol to run, its budget by the one rule of every front door (:mod:`moot.core.budget`):
    an option given on the command line, else the protocol's own ``budget:``, else the default
    timeout."""
    if protocol == "affirmative-critical":
        spec = affirmative_critical(synthesize=synthesize)
    elif not synthesize:
        raise UsageError("--no-synthesis only applies to the affirmative-critical protocol")
    else:
        spec = resolve_protocol(protocol)
    return budget_for(spec, rounds=rounds, timeout_s=timeout, max_calls=max_calls, max_tokens=max_tokens)


def _run(engine: Engine, task: DebateTask) -> DebateResult:
    return asyncio.run(engine.run(task))


def _traced_run(engine: Engine, task: DebateTask, tracing: tuple[Any, Callable[[], None]] | None) -> DebateResult:
    """Run the debate; with a tracer, flush its spans when the debate ends, however it ends."""
    if tracing is None:
        return _run(engine, task)
    try:
        return _run(engine, task)
    finally:
        tracing[1]()


def _report(result: DebateResult, quiet: bool, json_path: Path | None, secrets: list[str]) -> None:
    if json_path is not None:
        write_atomic(json_path, result.to_json(secrets=secrets))
    if quiet:
        if result.final_answer is not None:
            console.print(on_screen(result.final_answer, secrets), highlight=False, markup=False)
        elif result.error is None:  # (an error is printed by the command, once) standard output stays the
            # answer alone, none here: why there is none goes to stderr
            where = f"; its turns are in {json_path}" if json_path is not None else "; --json FILE keeps its turns"
            err_console.print(
                f"no decision: the protocol decides nothing (no synthesis, vote or judge){where}",
                markup=False,
                highlight=False,
            )
    else:
        console.print(summary_panel(result, secrets))
        if result.quality is not None:
            console.print(quality_panel(result.quality))


@app.command()
def version() -> None:
    """Print moot's version."""
    from moot._version import __version__

    console.print(__version__)


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (``kill``, ``timeout``, a job scheduler) stops a command as Ctrl-C does: the finished
    work is saved and marked interrupted, with the same one-line message and exit status 130. The
    handler Ctrl-C has at that moment is called (asyncio's runner cancels the running debate;
    outside it, Python raises KeyboardInterrupt). Where Ctrl-C is ignored (a background job of a
    shell script inherits SIGINT ignored, and asyncio then installs no handler of its own), the
    interrupt is raised from the event loop, which asyncio.run turns into the same cancellation."""
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    if callable(on_ctrl_c):
        on_ctrl_c(signal.SIGINT, frame)
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise KeyboardInterrupt from None
    # Raised by the event loop itself, not inside whichever task was running: asyncio.run then
    # cancels the tasks, each saves what it finished, and the command's Ctrl-C path reports it.
    loop.call_soon_threadsafe(_interrupt)


def _interrupt() -> None:
    raise KeyboardInterrupt


def main() -> None:
    with contextlib.suppress(ValueError):  # only the main thread may set it (main() called from a thread)
        signal.signal(signal.SIGTERM, _terminated)  # moot serve sets it back: uvicorn drains, then it ends
    if len(sys.argv) < 2 or "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        from moot.cli.help_width import fold_long_words

        fold_long_words()
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file the command had checked became unwritable meanwhile (a full disk, a mount gone): one
        # line naming it, not a traceback; what was written before it (a run's store) is kept.
        err_console.print(f"error: {exc.filename}: {exc.strerror or exc}", markup=False, highlight=False)
        sys.exit(1)


if __name__ == "__main__":  # python -m moot.cli.main
    main()
