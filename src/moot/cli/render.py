"""Rendering of engine events for the terminal, and the transcript file that grows with them."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from moot.cli.common import on_screen
from moot.core.events import DebateDone, Event, RoundDone, TokenDelta, TurnDone, TurnRetry, TurnStarted
from moot.core.types import DebateQuality, DebateResult, Turn

_STYLES = ["cyan", "magenta", "yellow", "green", "blue", "red"]


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a file beside it, then renamed); an OSError names
    ``path`` (a full disk's or a file-size limit's write error names no file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a transcript is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TranscriptWriter:
    """Writes the whole result as JSON as it grows, so an interrupted debate leaves what it had: at
    the end of every round and of the debate, and after a turn, but at most once every ``every_s``:
    a turn that comes sooner is written when that time is up (a vote of thousands of samples
    rewrote its whole growing file after each one: quadratic, 11 s to stop on Ctrl-C at 20,000).
    Secrets are redacted (``DebateResult.to_json``): those moot knows and ``secrets``, the
    command's own key (``--api-key``)."""

    def __init__(self, path: Path, secrets: Sequence[str] = (), every_s: float = 0.5) -> None:
        self.path = path
        self.secrets = list(secrets)
        self.every_s = every_s
        self._written = -math.inf
        self._pending: DebateResult | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, TurnDone):
            wait = self.every_s - (time.monotonic() - self._written)
            if wait > 0:
                self._pending = event.result
                if self._timer is None:
                    with contextlib.suppress(RuntimeError):  # (no loop: the round's end writes it)
                        self._timer = asyncio.get_running_loop().call_later(wait, self._flush)
                return
        if isinstance(event, TurnDone | RoundDone | DebateDone):
            self.write(event.result)

    def _flush(self) -> None:
        self._timer = None
        pending = self._pending
        if pending is None:
            return
        try:
            self.write(pending)
        except OSError:  # (in a timer, it would be a traceback): kept, so the next event's write says it
            self._pending = pending

    def write(self, result: DebateResult) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = None
        write_atomic(self.path, result.to_json(secrets=self.secrets))
        self._written = time.monotonic()


#: Turns in flight shown as panels at once (a vote of hundreds would redraw hundreds 8 times a second).
MAX_PANELS = 12


class LiveRenderer:
    """Shows turns streaming in (one panel per speaker in flight) and keeps finished turns."""

    def __init__(self, console: Console, secrets: Sequence[str] = ()) -> None:
        self.console = console
        #: The command's own key: as the --json file, the screen shows no secret.
        self.secrets = list(secrets)
        self.live: Live | None = None
        self.buffers: dict[tuple[str, int], list[str]] = {}
        self.names: dict[tuple[str, int], str] = {}
        self.colors: dict[str, str] = {}
        #: Decision turns (a synthesis, a judge's verdict), printed when the debate ends: one whose
        #: text is the final answer then says so, and the answer is printed once, below.
        self.decisions: list[Turn] = []

    def color(self, speaker: str) -> str:
        if speaker not in self.colors:
            self.colors[speaker] = "bold white" if speaker == "decision" else _STYLES[len(self.colors) % len(_STYLES)]
        return self.colors[speaker]

    def __enter__(self) -> LiveRenderer:
        self.live = Live(get_renderable=self._in_flight, console=self.console, refresh_per_second=8, transient=True)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._print_decisions(None)  # a debate stopped before its end: what it decided, whole
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def _in_flight(self) -> RenderableType:
        # Rich's refresh thread calls this while the event loop adds and removes turns: a copy first
        # (iterating the dict itself raised "dictionary changed size during iteration").
        flying = list(self.buffers.items())
        panels: list[RenderableType] = []
        for key, parts in flying[:MAX_PANELS]:
            text = "".join(list(parts))
            tail = "\n".join(text.splitlines()[-6:]) if text else "…"
            panels.append(
                Panel(
                    Text(on_screen(tail, self.secrets)),
                    title=f"{self.names.get(key, key[0])} · round {key[1]} (speaking)",
                    border_style=self.color(key[0]),
                )
            )
        if len(flying) > MAX_PANELS:
            panels.append(Text(f"… and {len(flying) - MAX_PANELS} more speaking", style="dim"))
        return Group(*panels)

    def __call__(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            key = (event.speaker, event.round)
            self.buffers[key] = []
            self.names[key] = event.name
        elif isinstance(event, TokenDelta):
            buf = self.buffers.get((event.speaker, event.round))
            if buf is not None:
                buf.append(event.text)
        elif isinstance(event, TurnRetry):
            buf = self.buffers.get((event.speaker, event.round))
            if buf is not None:
                buf.clear()  # the failed attempt's tokens are not part of the answer
        elif isinstance(event, TurnDone):
            turn = event.turn
            self.buffers.pop((turn.speaker, turn.round), None)
            if turn.kind == "debate":
                self.console.print(turn_panel(turn, self.color(turn.speaker), secrets=self.secrets))
            else:
                self.decisions.append(turn)
        elif isinstance(event, RoundDone):
            self.console.rule(f"round {event.round.index} done", style="dim")
        elif isinstance(event, DebateDone):
            self._print_decisions(event.result.final_answer)

    def _print_decisions(self, final_answer: str | None) -> None:
        for turn in self.decisions:
            self.console.print(turn_panel(turn, self.color(turn.speaker), final_answer, self.secrets))
        self.decisions.clear()


def _is_the_answer(turn: Turn, final_answer: str | None) -> bool:
    return final_answer is not None and turn.ok and (turn.text or "").strip() == final_answer.strip()


def turn_panel(turn: Turn, color: str, final_answer: str | None = None, secrets: Sequence[str] = ()) -> Panel:
    """A finished turn; one whose text is ``final_answer`` (a synthesis) keeps its name and numbers
    and points to the final answer, printed once below it (as the viewer does). What a model wrote is
    shown :func:`on_screen`."""
    if _is_the_answer(turn, final_answer):
        body = Text("final answer below", style="dim")
    elif turn.error:
        body = Text(on_screen(f"failed: {turn.error}", secrets), style="red")
    elif turn.parse_failure:
        failure = turn.parse_failure
        body = Text(on_screen(f"unparsed reply ({failure.error}):\n{failure.raw}", secrets), style="red")
    else:
        body = Text(on_screen(turn.text or "", secrets))
    flags = " · trimmed to budget" if turn.trimmed else ""
    if turn.finish_reason == "length":  # the model stopped at max_tokens: the text may end mid-sentence
        flags += " · cut at its token limit"
    title = f"{turn.name} · round {turn.round}" if turn.kind == "debate" else f"{turn.name} · decision"
    subtitle = f"{turn.usage.completion_tokens} tokens out · {turn.latency_s:.1f} s · {turn.model}{flags}"
    return Panel(body, title=title, subtitle=subtitle, border_style=color)


def summary_panel(result: DebateResult, secrets: Sequence[str] = ()) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", f"{result.status} ({result.stop_reason})")
    table.add_row("rounds", str(len(result.rounds)))
    table.add_row("model calls", str(result.llm_calls))
    u = result.usage
    cached = f", {u.cached_prompt_tokens} of them from the server's prompt cache" if u.cached_prompt_tokens else ""
    table.add_row("tokens", f"{u.total_tokens} ({u.prompt_tokens} in{cached}, {u.completion_tokens} out)")
    table.add_row("time", f"{result.elapsed_s:.1f} s")
    if result.cost is not None:
        table.add_row("cost", result.cost.describe())
    for w in result.warnings:
        table.add_row("warning", Text(on_screen(w, secrets)))
    answer = result.final_answer if result.final_answer is not None else (result.error or "(no decision)")
    return Panel(
        Group(Text(on_screen(answer, secrets)), Text(""), table),
        title="final answer",
        border_style="green" if result.status == "complete" else "red",
    )


def quality_panel(quality: DebateQuality) -> Panel:
    """Seed 004's dimensions: each score with how it was measured, or why it was not."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    for name, score in quality.scores.items():
        how = f"judge {quality.judge}" if score.method == "judge" else "measured, no model"
        table.add_row(name, f"{score.value:.2f}", Text(how, style="dim"))
    for name, reason in quality.unmeasured.items():
        table.add_row(name, "–", Text(on_screen(f"not measured: {reason}"), style="dim"))
    if quality.judge is not None:
        tokens = quality.judge_usage.total_tokens
        table.add_row(
            "judge", "", Text(f"{quality.judge}: {quality.judge_calls} call(s), {tokens} tokens", style="dim")
        )
    return Panel(table, title="debate quality (seed 004; 0 worst, 1 best)", border_style="blue")
