"""What every command shares: the consoles, the one-line error, the exit codes, the path checks.

Exit codes are decided here and nowhere else (:func:`exit_codes`): bad input, found before any work
(an unknown model spec, a protocol or data file that is wrong, a path that cannot be used, a run
folder that holds another run or is in use) exits 2; a run that failed or timed out exits 1; an
interrupted one 130.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from moot.core.spec import SpecError
from moot.eval.datasets import DatasetError
from moot.eval.runner import EvalRunError
from moot.eval.store import RunConfigMismatch, RunLocked
from moot.files import InputFileError, first_error
from moot.models.base import ModelError, ModelSpecError
from moot.models.pricing import PriceError, PriceTable, price_table
from moot.protocols.loader import ProtocolFileError
from moot.protocols.refs import ProtocolRefError
from moot.secrets import redact

#: Width of the output when it is not a terminal (a pipe, a file): wide enough that tables are not
#: cut to 80 columns ("protoc…"); ``COLUMNS`` still wins.
PIPE_WIDTH = 160


def _width(stream: object) -> int | None:
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("COLUMNS") or (isatty is not None and isatty()):
        return None
    return PIPE_WIDTH


class _Console(Console):
    """A console that outlives its reader: when the pipe it writes to closes (``moot debate ... |
    head``), its output is dropped and the command goes on, so the run still finishes and writes
    its files (rich's default is ``SystemExit`` from inside whatever was printing: a traceback in
    the middle of a debate, and a ``--json`` file left saying ``running``)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        try:  # the interpreter's last flush must not fail on the closed pipe either
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # pragma: no cover - not a real file
            pass
        if self is not err_console:
            err_console.print("[dim]note: the output was closed (a pipe ended); the run goes on without it[/dim]")


# No emoji codes: what moot prints holds the user's and the models' text, and a spec's ":x" or a
# reply's ":ok:" is text (rich turned `--models nope:x:` into a cross mark).
console = _Console(width=_width(sys.stdout), emoji=False)
err_console = _Console(stderr=True, width=_width(sys.stderr), emoji=False)


class UsageError(Exception):
    """Bad input from the user: shown as one line, exit code 2."""


#: Bad input: exit 2. Everything here is raised before a model is called.
INPUT_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    InputFileError,
    ProtocolFileError,
    ProtocolRefError,
    SpecError,
    DatasetError,
    RunConfigMismatch,
    RunLocked,
    ModelSpecError,
    ValidationError,
)
#: A run that could not be done: exit 1.
RUN_ERRORS: tuple[type[Exception], ...] = (ModelError, EvalRunError)


#: Characters a terminal acts on rather than shows (C0 but tab and newline, DEL, C1): an escape
#: sequence in a model's reply or a question could retitle the terminal, recolour it, or worse.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def on_screen(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` as the terminal may show it: its secrets (``secrets``, the environment's, key shapes)
    as ``***``, as the ``--json`` file has them, and no control character (a ``\r`` ends a line, as
    ``\n`` does)."""
    return _CONTROLS.sub("", redact(text.replace("\r\n", "\n").replace("\r", "\n"), secrets))


def one_line(message: str) -> str:
    """A message on one line (YAML and pydantic errors span several)."""
    return " ".join(message.split())


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(on_screen(one_line(message)))}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


#: What is left on a command line after a command's own arguments (not shown in --help): a file given to
#: a ``--json`` that prints JSON, as ``moot debate --json FILE`` writes one, is then named with the fix,
#: not refused as click's "unexpected extra argument(s)".
ExtraArgs = Annotated[list[str] | None, typer.Argument(hidden=True, show_default=False)]


def refuse_extra(extra: list[str] | None, json_out: bool) -> None:
    """One line for what :data:`ExtraArgs` caught (exit 2), before anything is read or called."""
    if not extra:
        return
    if json_out:
        # (a file that exists is named in no advice to write over it: `--json OUT INPUT` leaves the
        # input here, and the command's own argument took OUT)
        target = "FILE" if Path(extra[0]).exists() else extra[0]
        raise fail(
            f"--json prints the JSON here and takes no file name ({extra[0]!r}); to keep it in a file: --json > "
            f"{target}",
            2,
        )
    raise fail(f"unexpected argument {extra[0]!r}; see --help", 2)


def message_of(exc: BaseException) -> str:
    """What an error says, without Python's wrapping (a KeyError's quotes, pydantic's layout)."""
    if isinstance(exc, ValidationError):
        first = first_error(exc)
        where = ".".join(str(x) for x in first["loc"]) or "input"
        return f"invalid {where}: {first['msg'].removeprefix('Value error, ')}"
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


@contextmanager
def exit_codes(
    *, input_errors: tuple[type[Exception], ...] = (), run_errors: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """Turn errors into one line and the exit code: bad input (:data:`INPUT_ERRORS`, and a
    command's own ``input_errors``) 2, a failed run (:data:`RUN_ERRORS`, and a command's own
    ``run_errors``) 1. Other exceptions are bugs and keep their traceback."""
    try:
        yield
    except typer.Exit:
        raise
    except (*INPUT_ERRORS, *input_errors) as exc:
        raise fail(message_of(exc), 2) from None
    except (*RUN_ERRORS, *run_errors) as exc:
        raise fail(message_of(exc), 1) from None


def check_output_file(path: Path, option: str) -> None:
    """Fail before any work, not after it, if a result file cannot be written at ``path``."""
    if str(path) == "-":  # (it wrote a file named "-": no output of moot's is standard output)
        raise UsageError(f"{option} -: give a file path; no moot command writes this output to standard output")
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a folder; give a file path")
    _check_folder(path.parent, option, path)


def check_result_file(path: Path, option: str) -> None:
    """:func:`check_output_file`, and a file already there is overwritten only if it is a debate's
    result as moot writes it (``{"schema_version": "moot.debate/...``, read from its first bytes
    alone), or holds nothing but whitespace: any other is refused before any work, so that ``--json``
    naming an input (a context file, the run or protocol file) loses nothing."""
    check_output_file(path, option)
    try:
        if not path.is_file():
            return
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        head = b"?"
    if head.strip() and not re.match(rb'\s*\{\s*"schema_version"\s*:\s*"moot\.debate/', head):
        raise UsageError(
            f"{option} {str(path)!r} exists and is not a debate's result (moot debate or moot run --json writes "
            "one): it may be one of this command's inputs; give a new path, or remove the file first"
        )


def check_ray_options(ray: str | None, workers: int | None, worker_cpus: float | None = None) -> None:
    """``--ray``'s address well formed, and ``--workers`` and ``--worker-cpus`` only with it: before any work."""
    from moot.scale.ray_backend import INSTALL_HINT, RayConnectError, cluster_address

    if ray is None:
        for flag, value in (("--workers", workers), ("--worker-cpus", worker_cpus)):
            if value is not None:
                raise UsageError(f"{flag} sets how Ray workers run: it needs --ray (e.g. --ray local)")
        return
    try:
        cluster_address(ray)
    except RayConnectError as exc:
        raise UsageError(str(exc)) from None
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # (said before the run starts: its progress line came first)
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}")


def check_output_folder(path: Path, option: str) -> None:
    """Fail before any work if ``path`` cannot be (or become) a folder that moot writes into."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a file; give a folder (it is created if missing)")
    _check_folder(path, option, path)


def _check_folder(folder: Path, option: str, given: Path) -> None:
    existing = next((p for p in [folder, *folder.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        raise UsageError(f"{option} {str(given)!r}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {str(given)!r}: {existing} is not writable")
    try:  # os.access says yes to root everywhere, on /sys or a read-only mount too: a file made and removed
        fd, probe = tempfile.mkstemp(prefix=".moot-probe-", dir=existing)
    except OSError as exc:
        raise UsageError(f"{option} {str(given)!r}: {existing} is not writable ({exc.strerror or exc})") from None
    os.close(fd)
    Path(probe).unlink(missing_ok=True)


class StatusLines(logging.Handler):
    """Shows progress messages (``logging`` at INFO from :data:`PROGRESS_LOGGERS`: weights being
    verified or assembled, a model being loaded, data downloaded) as dim status lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            err_console.print(f"[dim]{escape(record.getMessage())}[/dim]", highlight=False, soft_wrap=True)
        except Exception:  # pragma: no cover - a broken terminal must not break the run
            self.handleError(record)


class ProgressLines:
    """A run's progress where its bar cannot draw (output to a file or a pipe: a background run's
    log): a line on stderr at most every ``every_s`` seconds, and when the count completes, saying
    what is done of what and for how long. On a terminal it says nothing (the bar shows it)."""

    def __init__(self, every_s: float = 60.0, *, terminal: bool | None = None) -> None:
        self.every_s = every_s
        self.terminal = console.is_terminal if terminal is None else terminal
        self.started = time.monotonic()
        self.last: float | None = None

    def __call__(self, what: str, done: int, total: int | None, detail: str = "") -> None:
        if self.terminal:
            return
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and self.last is not None and now - self.last < self.every_s:
            return
        self.last = now
        minutes, seconds = divmod(int(now - self.started), 60)
        of = f"/{total}" if total is not None else ""
        extra = f", {detail}" if detail else ""
        err_console.print(f"{what}: {done}{of}{extra} ({minutes}:{seconds:02d} elapsed)", markup=False, highlight=False)


#: The loggers whose INFO messages are progress a user waits on: weights verified, assembled and
#: loaded (``moot.models``), benchmark data downloaded (``moot.eval.datasets``).
PROGRESS_LOGGERS = ("moot.models", "moot.eval.datasets")


def show_progress_messages() -> None:
    """Route the library's progress logging to the terminal as status lines (once per process)."""
    for name in PROGRESS_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, StatusLines) for h in logger.handlers):
            logger.addHandler(StatusLines(level=logging.INFO))
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)


#: Connection options of openai: models, shared by the commands that run models.
#: The options the run commands share (eval, batch, tune, absa), declared once.
ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="Model spec (default: $MOOT_MODEL or embedded).")
]
MaxTokensOption = Annotated[int | None, typer.Option("--max-tokens", min=1, help="Token budget of each turn.")]
TimeoutOption = Annotated[
    float | None, typer.Option("--timeout", "-t", min=0.001, help="Timeout of each debate, seconds.")
]
ConcurrencyOption = Annotated[
    int, typer.Option("--concurrency", "-j", min=1, help="Debates at once (with --ray: on each worker).")
]
BaseUrlOption = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible base URL (openai: models).")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (openai: models; default $OPENAI_API_KEY).", show_default=False),
]

#: Prices of models (seed 004's cost per debate), shared by the commands that report a cost.
PricesOption = Annotated[
    str | None,
    typer.Option(
        "--prices",
        help="Price file: YAML/JSON of MODEL: {input: USD, output: USD} per million tokens (default $MOOT_PRICES).",
        show_default=False,
    ),
]
#: The longest question a server takes (moot serve, moot mcp: the same setting).
MaxQuestionCharsOption = Annotated[
    int,
    typer.Option(
        "--max-question-chars",
        min=1,
        help="Longest question, characters (on the OpenAI routes: the last user message; earlier messages "
        "are context, bounded by the prompt budget).",
    ),
]
PriceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--price",
        help="A model's price, MODEL=INPUT,OUTPUT[,CACHED_INPUT] in USD per million tokens. Repeatable.",
        show_default=False,
    ),
]


TraceOption = Annotated[
    bool,
    typer.Option(
        "--trace",
        # (rich reads help as markup: an unescaped [otel] is taken for a tag and vanishes)
        help="OpenTelemetry spans, exported as the standard OTEL_* variables say (default: OTLP/HTTP to "
        "$OTEL_EXPORTER_OTLP_ENDPOINT; OTEL_TRACES_EXPORTER=console prints them on stderr). Needs "
        "pip install 'moot\\[otel]'; see docs/tracing.md.",
    ),
]
TraceContentOption = Annotated[
    bool, typer.Option("--trace-content", help="With --trace: record prompts and replies in the spans too.")
]


def open_tracing(trace: bool, trace_content: bool = False) -> Any:
    """The command's :class:`moot.integrations.otel.Tracing` from the OTEL_* environment, or None
    without ``--trace`` (or when the environment turns tracing off). A variable that cannot be used
    is one warning line on stderr, with what is done instead; the command goes on."""
    if not (trace or trace_content):
        return None
    try:
        from moot.integrations.otel import tracing_from_env
    except ImportError:
        raise UsageError("--trace needs OpenTelemetry's SDK and OTLP exporter: pip install 'moot[otel]'") from None

    def warn(message: str) -> None:
        err_console.print(f"[yellow]warning:[/yellow] {escape(redact(message))}", highlight=False, soft_wrap=True)

    return tracing_from_env(capture_content=trace_content or None, warn=warn, probe=True)


def prices_from(path: str | None, options: list[str] | None) -> PriceTable:
    """The price table of a command's --prices / --price options (bad input: a UsageError)."""
    try:
        return price_table(path, options)
    except PriceError as exc:
        raise UsageError(str(exc)) from None


#: Where a run's debates execute, shared by `moot batch`, `moot eval` and `moot absa eval`.
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        help="Run on Ray (pip install 'moot\\[ray]'): local (a Ray instance for this run), auto (the running "
        "cluster, $RAY_ADDRESS) or a cluster address (HOST:PORT, ray://HOST:10001).",
        show_default=False,
    ),
]
WorkersOption = Annotated[
    int | None, typer.Option("--workers", min=1, help="Ray workers (default: the cluster's CPUs / --worker-cpus).")
]
WorkerCpusOption = Annotated[
    float | None,
    typer.Option("--worker-cpus", min=0.01, help="CPUs of each Ray worker (an embedded model's threads; default 1)."),
]
