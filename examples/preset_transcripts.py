"""Run three presets on an embedded model and write docs/transcripts.md (calls, tokens, time, turns).

.venv/bin/python examples/preset_transcripts.py [--model embedded:qwen2.5-1.5b] [--out docs/transcripts.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import textwrap
from datetime import date
from pathlib import Path

from moot._version import __version__
from moot.core import DebateResult, DebateTask, Engine
from moot.protocols import get_preset

RUNS = [
    ("panel", "The battery lasts all day, but the screen is too dim to read outdoors.", None),
    ("moderated", "Remote work improves the productivity of software teams.", None),
    ("society-of-minds", "A shop sells pens at 3 for $2. How much do 12 pens cost, in dollars?", "8"),
]


def excerpt(text: str | None, width: int = 400) -> str:
    if not text:
        return "(nothing)"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def render(result: DebateResult, question: str) -> str:
    lines = [
        f"## `{result.protocol}`",
        "",
        f"> {question}",
        "",
        f"- model calls: **{result.llm_calls}**, tokens: **{result.usage.total_tokens}** "
        f"({result.usage.prompt_tokens} in, {result.usage.completion_tokens} out), time: **{result.elapsed_s:.1f} s**",
        f"- status: {result.status}, stop reason: `{result.stop_reason}`",
        f"- final answer: {excerpt(result.final_answer, 300)}",
    ]
    if result.decision:
        shown = {k: v for k, v in result.decision.items() if k not in ("ballots",)}
        lines.append(f"- decision: `{excerpt(str(shown), 300)}`")
    if result.dynamics and any(r.agreement is not None for r in result.dynamics.rounds):
        per_round = ", ".join(f"round {r.round}: {r.answers} (agreement {r.agreement})" for r in result.dynamics.rounds)
        lines.append(f"- answers by round: {per_round}")
    lines += ["", "| round | speaker | tokens out | s | what it said |", "|---|---|---:|---:|---|"]
    for t in [*result.turns(), *result.decision_turns]:
        said = (
            excerpt(t.text)
            if t.ok
            else f"**{'parse failure' if t.parse_failure else 'error'}**: "
            + excerpt(t.parse_failure.error if t.parse_failure else t.error, 200)
        )
        rnd = "decision" if t.kind == "decision" else str(t.round)
        lines.append(
            f"| {rnd} | {t.name} | {t.usage.completion_tokens} | {t.latency_s:.1f} | {said.replace('|', '/')} |"
        )
    return "\n".join(lines)


async def run_all(model: str) -> list[str]:
    sections = []
    for name, question, reference in RUNS:
        result = await Engine(get_preset(name), model).run(DebateTask(question=question, reference=reference))
        print(f"{name}: {result.status} {result.llm_calls} calls {result.elapsed_s:.1f} s")
        sections.append(render(result, question))
    return sections


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded:qwen2.5-1.5b")
    parser.add_argument("--out", default="docs/transcripts.md")
    args = parser.parse_args()
    sections = asyncio.run(run_all(args.model))
    Path(args.out).write_text(header(args.model) + "\n" + "\n\n".join(sections) + "\n", encoding="utf-8")


def header(model: str) -> str:
    """The page's title and how it was made: the command, the day, moot's version, the machine."""
    return textwrap.dedent(
        f"""\
        # Transcripts: three presets on `{model}`

        Produced by `.venv/bin/python examples/preset_transcripts.py --model {model}` on {date.today()} (moot
        {__version__}), on {platform.machine()} with {os.cpu_count()} cores, greedy decoding (the vote presets
        sample at temperature 0.7 with one seed per agent). Turns are excerpts; the full transcripts are the
        JSON results. Nothing here is edited: a small model's weak or wrong turns are shown as they came.
        """
    )


if __name__ == "__main__":
    main()
