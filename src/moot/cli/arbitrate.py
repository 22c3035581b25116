"""``moot arbitrate REPORTS.json``: detect contradictions among agent reports, arbitrate them, print
the contradictions, the verdicts and the adjusted reports. Wiring and presentation only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from moot.apps.arbitration import (
    AgentReport,
    ArbitrationConfig,
    ArbitrationResult,
    Contradiction,
    Finding,
    arbitrate,
    detect_contradictions,
)
from moot.cli.common import (
    ExtraArgs,
    UsageError,
    console,
    exit_codes,
    fail,
    on_screen,
    refuse_extra,
    show_progress_messages,
)
from moot.files import InputFileError, check_text, first_error, load_json, read_text
from moot.protocols.loader import resolve_protocol
from moot.secrets import redact_json

FORMAT_HINT = 'give a JSON list of agent reports, or {"reports": [...], "config": {...}} (see examples/reports.json)'
_REPORTS = TypeAdapter(list[AgentReport])
_SEVERITY = {"high": "red", "medium": "yellow", "low": "dim"}


def load_reports(path: Path) -> tuple[list[AgentReport], dict[str, Any]]:
    """The reports and the optional ``config`` block of a reports file; bad input is a UsageError."""
    try:
        text = read_text(path, "reports file")
        data = load_json(text)
        check_text(data, str(path), text)  # a "\udfff" escape: named with its fix, not pydantic's words
    except InputFileError as exc:
        raise UsageError(f"{exc}; {FORMAT_HINT}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); {FORMAT_HINT}") from None
    config: dict[str, Any] = {}
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"reports", "config"})
        if unknown or "reports" not in data:
            what = f"unknown key(s) {', '.join(unknown)}" if unknown else "no 'reports' key"
            raise UsageError(f"{path}: {what}; {FORMAT_HINT}")
        config = data.get("config") or {}
        if not isinstance(config, dict):
            raise UsageError(f"{path}: 'config' must be an object of arbitration settings")
        data = data["reports"]
    if not isinstance(data, list):
        raise UsageError(f"{path}: {FORMAT_HINT}")
    try:
        reports = _REPORTS.validate_python(data)
    except ValidationError as exc:
        raise UsageError(f"{path}: {_first_error(exc, 'reports')}; {FORMAT_HINT}") from None
    if not reports:  # (an empty list read as "the agents agree")
        raise UsageError(f"{path} holds no reports: nothing to compare; {FORMAT_HINT}")
    return reports, config


#: The option that sets each field of the arbitration's config.
_FLAGS = {
    "model": "--model", "protocol": "--protocol", "tolerance": "--tolerance", "concurrency": "--concurrency",
    "max_calls": "--max-calls", "timeout_s": "--timeout", "source_authority": "--authority",
}  # fmt: skip


def _blamed(exc: ValidationError, path: Path, file_config: dict[str, Any], given: dict[str, Any]) -> str:
    """Where a refused config came from: the option that set the field, the file's config, or (a
    check of two fields together) the options given, with the file's config if it has one."""
    loc = first_error(exc)["loc"]
    flags = [_FLAGS[k] for k in given if k in _FLAGS]
    if loc and str(loc[0]) in given:
        return f"{_FLAGS[str(loc[0])]} {given[str(loc[0])]}"
    if not loc and flags:
        return f"{path}'s config with {' and '.join(flags)}" if file_config else " and ".join(flags)
    return str(path)


def _first_error(exc: ValidationError, prefix: str) -> str:
    first = first_error(exc)
    where = ".".join(str(x) for x in (prefix, *first["loc"]))
    return f"invalid {where}: {first['msg']}"


def arbitrate_command(
    path: Annotated[Path, typer.Argument(help="Agent reports: a JSON list, or {reports, config}.")],
    extra: ExtraArgs = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the whole result as JSON (into a file: --json > FILE).")
    ] = False,
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
        str | None,
        typer.Option("--protocol", "-p", help="Debate each contradiction with this preset or protocol file."),
    ] = None,
    tolerance: Annotated[
        float | None, typer.Option("--tolerance", min=0.0, help="Relative difference that counts (default 0.05).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", "-j", min=1, help="Contradictions arbitrated at once (default 10)."),
    ] = None,
    authority: Annotated[
        str | None, typer.Option("--authority", help="Source ranking, most authoritative first: 'GCC-STAT,World Bank'.")
    ] = None,
    max_calls: Annotated[int | None, typer.Option("--max-calls", min=1, help="Most model calls in all.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", "-t", min=0.001, help="Timeout, seconds.")] = None,
    detect_only: Annotated[bool, typer.Option("--detect-only", help="Only detect; no model is called.")] = False,
) -> None:
    """Find contradictions among agent reports, arbitrate them, print verdicts and adjusted reports (seed 003)."""
    refuse_extra(extra, json_out)
    show_progress_messages()
    with exit_codes():
        reports, file_config = load_reports(path)
        overrides = {
            "model": model,
            "protocol": protocol,
            "tolerance": tolerance,
            "concurrency": concurrency,
            "max_calls": max_calls,
            "timeout_s": timeout,
            "source_authority": [s.strip() for s in authority.split(",") if s.strip()] if authority else None,
        }
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            cfg = ArbitrationConfig.model_validate(file_config | given)
        except ValidationError as exc:
            raise UsageError(f"{_blamed(exc, path, file_config, given)}: {_first_error(exc, 'config')}") from None
        if detect_only:
            unused = [flag for flag, value in (("--model", model), ("--protocol", protocol), ("--max-calls", max_calls))
                      if value is not None]  # fmt: skip
            if unused:  # silently unused, a wrong one was never found out
                raise UsageError(f"--detect-only calls no model: {' and '.join(unused)} would be unused; drop it")
            found = detect_contradictions(reports, cfg)
            if json_out:
                text = json.dumps([c.model_dump(mode="json") for c in found], indent=2, ensure_ascii=False)
                typer.echo(redact_json(text, indent=2))
            else:
                console.print(contradictions_table(found))
            return
        if cfg.protocol is not None:
            resolve_protocol(cfg.protocol)  # a bad protocol is bad input, found before any call
        try:
            result = asyncio.run(arbitrate(reports, cfg))
        except KeyboardInterrupt:
            raise fail("interrupted: nothing was kept (the result is written when the arbitration ends)", 130) from None
    if json_out:
        typer.echo(result.to_json())
    else:
        show(result)
    if result.status == "partial":
        missing = [o for o in result.verdicts if o.verdict is None]
        first = missing[0].flag_reason if missing else "no verdict"
        raise fail(f"{len(missing)} of {len(result.verdicts)} contradictions got no verdict ({first})")


# ------------------------------------------------------------------------------- rendering


def _value(f: Finding) -> str:
    if f.value is None:
        return "-"
    return f"{f.value:g}" + (f" {f.unit}" if f.unit else "")


def _cite(f: Finding) -> str:
    return f.citation.label() if f.citation is not None else "no citation"


def contradictions_table(found: list[Contradiction]) -> Table | Text:
    if not found:
        return Text("No contradictions: the agents agree.", style="green")
    table = Table(title=f"contradictions ({len(found)})", show_lines=True)
    for col in ("id", "metric", "kind", "severity"):
        table.add_column(col, no_wrap=col != "metric", overflow="fold")
    table.add_column("parties", overflow="fold")
    table.add_column("details", overflow="fold")
    for c in found:
        parties = "\n".join(
            f"{k}. {shown(p.agent)}: {shown(_value(p.finding))} ({shown(_cite(p.finding))}, "
            f"conf {p.finding.confidence:g})"
            for k, p in enumerate(c.parties, 1)
        )
        table.add_row(
            c.id,
            shown(c.metric),
            c.kind,
            f"[{_SEVERITY[c.severity]}]{c.severity}[/]",
            parties,
            shown(c.details),
        )
    return table


def verdicts_table(result: ArbitrationResult) -> Table:
    table = Table(title="verdicts", show_lines=True)
    for col in ("id", "status", "resolution", "action", "winner", "conf."):
        table.add_column(col, no_wrap=col in ("id", "conf."), overflow="fold")
    table.add_column("explanation / reason", overflow="fold")
    for o in result.verdicts:
        v = o.verdict
        status = "[green]resolved[/]" if o.status == "resolved" else "[yellow]flagged[/]"
        text = o.flag_reason if o.status == "flagged" else (v.explanation if v else "")
        if o.status == "flagged" and v is not None and v.explanation:
            text = f"{o.flag_reason}. {v.explanation}"
        table.add_row(
            o.contradiction_id,
            status,
            v.resolution if v else "-",
            v.action if v else "-",
            shown(o.winner or "-"),
            f"{o.confidence:g}",
            shown(text or ""),
        )
    return table


def adjusted_table(result: ArbitrationResult) -> Table:
    table = Table(title="adjusted reports (findings touched by arbitration)", show_lines=True)
    for col in ("agent", "metric", "value", "citation", "arbitration"):
        table.add_column(col, overflow="fold")
    for report in result.adjusted_reports:
        for f in report.findings:
            note = f.arbitration
            if note is None:
                continue
            value = _value(f)
            if note.action == "replaced" and note.original_value != f.value:
                original = "-" if note.original_value is None else f"{note.original_value:g}"
                value = f"{value} (was {original})"
            style = {"replaced": "cyan", "confirmed": "green", "kept_both": "green", "flagged": "yellow"}[note.action]
            table.add_row(
                shown(report.agent),
                shown(f.metric),
                shown(value),
                shown(_cite(f)),
                f"[{style}]{note.action}[/]: {shown(note.note)}",
            )
    return table


def summary(result: ArbitrationResult) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("status", result.status)
    grid.add_row("contradictions", str(len(result.contradictions)))
    grid.add_row("resolved", str(result.resolved_count))
    grid.add_row("flagged for review", str(result.flagged_count))
    grid.add_row("model calls", str(result.calls))
    grid.add_row("tokens", f"{result.tokens} ({result.usage.prompt_tokens} in, {result.usage.completion_tokens} out)")
    grid.add_row("time", f"{result.latency_ms / 1000:.1f} s")
    for w in result.warnings:
        grid.add_row("warning", shown(w))
    colour = {"complete": "green", "skipped": "green", "partial": "red"}[result.status]
    narrative = Text(on_screen(result.consensus_narrative))
    return Panel(Group(narrative, Text(""), grid), title="consensus", border_style=colour)


def show(result: ArbitrationResult) -> None:
    console.print(contradictions_table(result.contradictions))
    if result.verdicts:
        console.print(verdicts_table(result))
        console.print(adjusted_table(result))
    console.print(summary(result))


def shown(text: str) -> str:
    """Text from a file or a model as the terminal may show it: no markup, no control character, no
    secret (:func:`~moot.cli.common.on_screen`)."""
    return escape(on_screen(text))
