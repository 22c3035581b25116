"""The report as Markdown and as self-contained HTML: small renderers of an :class:`EvalReport`
(its form :mod:`moot.eval.report_model`, the analyses :mod:`moot.eval.analysis`; the figures
:mod:`moot.eval.plots`)."""

from __future__ import annotations

import statistics
from typing import NamedTuple

from moot.eval.goal import GOAL_POINTS, GOAL_TOKEN_SHARE, NON_INFERIORITY
from moot.eval.quality_render import render_quality_markdown
from moot.eval.render_cells import ci, pct, signed_pct
from moot.eval.render_pool import pool_sections, variant_section
from moot.eval.report_model import Comparison, EvalReport, ProtocolSummary
from moot.stats import total


def _share(count: int, of: int | None) -> str:
    return f"{count} ({pct(count / of)})" if of else str(count)


def _rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "protocol",
        "expected accuracy over tie-breaks (ties): what every difference uses",
        "accuracy, a tie to the answer given first [95% CI]",
        "completed",
        "failed",
        "unextractable answers (share of items)",
        "calls/item",
        "prompt tok/item",
        "completion tok/item",
        "latency/item in this run (cache hits take 0 s)",
        "parse failures (share of turns)",
    ]
    rows = []
    for s in report.protocols:
        name = s.label + (f" (k={s.k})" if s.k and "auto" in s.label else "")
        turns = s.turn_lengths.turns if s.turn_lengths is not None else None
        rows.append(
            [
                name,
                f"{pct(s.expected_accuracy)} ({s.ties})" if s.expected_accuracy is not None else "–",
                f"{pct(s.accuracy)} [{pct(s.ci_low)}, {pct(s.ci_high)}]" if s.finished else "– (none finished)",
                f"{s.finished - s.failed}/{report.items}",
                str(s.failed),
                _share(s.unextractable, s.finished),
                f"{s.mean_calls:.2f}",
                f"{s.mean_prompt_tokens:.0f}",
                f"{s.mean_completion_tokens:.0f}",
                f"{s.mean_latency_s:.1f} s",
                _share(s.parse_failures, turns),
            ]
        )
    if any(s.selection_fallbacks is not None for s in report.protocols):
        # Only in a run with a selection decision, so that other reports read as before.
        head.append("judge fell back to the vote")
        for row, s in zip(rows, report.protocols, strict=True):
            row.append("–" if s.selection_fallbacks is None else str(s.selection_fallbacks))
    return head, rows


FAILED_TEXT = (
    "Each protocol's failed items by the reason recorded, the most frequent first (a failed item counts as "
    "wrong); every item's is in `moot eval export`'s `error` column, and its transcript in `moot view`."
)


def _failure_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    rows = [
        [s.label, str(s.failed), "; ".join(f"{why} ({n})" for why, n in s.failure_reasons.items())]
        for s in report.protocols
        if s.failure_reasons
    ]
    return ["protocol", "failed", "why (items)"], rows


def _length_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "protocol",
        "turns",
        "token cap",
        "cut by the cap (share of turns)",
        "output tokens per turn: median / p90 / p95 / p98 / p99 / max",
        "reasoning at its character limit (share of turns)",
    ]
    rows = []
    for s in report.protocols:
        t = s.turn_lengths
        if t is None:
            continue
        rows.append(
            [
                s.label,
                str(t.turns),
                "–" if t.cap is None else str(t.cap),
                _share(t.cut, t.turns),
                f"{t.p50} / {t.p90} / {t.p95} / {t.p98} / {t.p99} / {t.max}",
                "–" if t.reasoning_limit is None else f"{_share(t.at_reasoning_limit, t.turns)} at {t.reasoning_limit}",
            ]
        )
    return head, rows


#: What the turn-length table says, and how to choose the cap from it.
LENGTHS_TEXT = (
    "Every turn that made a call (debate turns and LLM decisions): how many stopped at their token cap "
    "(`finish_reason: length`, also when the cut reply was then repaired with shorter fields; a cut reply "
    "is half an answer) and how many output tokens the replies took. To choose a cap that cuts fewer than "
    "2% of turns, run a pilot under a generous `--max-tokens` (one that cuts well under 2%) and take the "
    "largest p98 here: the cap that cuts 2% of that protocol's turns. A typed turn has a second cap: its "
    "reasoning field's length in characters (1,200 for a number, 600 otherwise), which grammar-constrained "
    "decoding enforces by closing the string there, with no finish_reason to say so: the last column counts "
    "the turns whose reasoning reached it."
)


def _comparison_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "debate",
        "vs baseline",
        "kind",
        "tokens vs baseline",
        "paired items",
        "difference in expected accuracy (points) [95% CI]",
        "items only the debate / only the baseline got right (a derived baseline: items the debate is ahead "
        "of / behind it)",
        "p",
        f"items for 80% power at +{100 * GOAL_POINTS:g} points",
    ]
    rows = []
    for s in report.protocols:
        if s.baseline:
            continue
        for why in s.missing_baselines:
            rows.append([s.label, why, "–", "–", "–", "–", "–", "–", "–"])
        for c in ([s.comparison] if s.comparison is not None else []) + s.other_comparisons:
            share = f"{s.mean_tokens / c.baseline_tokens:.2f}x" if c.baseline_tokens else "–"
            rows.append(
                [
                    s.label,
                    c.baseline + (" (derived)" if c.derived else ""),
                    c.kind,
                    share,
                    str(c.paired),
                    f"{signed_pct(c.diff)} [{signed_pct(c.ci_low)}, {signed_pct(c.ci_high)}]",
                    _discordant(c),
                    f"{c.p_value:.3f}",
                    f"{c.items_needed:,}" if c.items_needed is not None else "–",
                ]
            )
    return head, rows


def _discordant(c: Comparison) -> str:
    """Items right under one side only; for a baseline derived from the pool, whose value on an item
    is a mean over its k-subsets (rarely exactly right or wrong), the items the debate is ahead of
    and behind it instead (a report written before those were counted: nothing)."""
    if not c.derived:
        return f"{c.only_debate_right} / {c.only_baseline_right}"
    if c.debate_ahead is None or c.baseline_ahead is None:
        return "– (derived)"
    return f"ahead on {c.debate_ahead} / behind on {c.baseline_ahead}"


def _seed_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["debate", "against", "difference by draw (first seed: points [95% CI])", "mean", "SD", "range"]
    rows = [
        [
            sp.protocol,
            sp.kind,
            "; ".join(
                f"{seed}: {signed_pct(d)} [{signed_pct(lo)}, {signed_pct(hi)}]" for seed, d, lo, hi, _ in sp.draws
            ),
            signed_pct(sp.mean),
            f"{100 * sp.sd:.1f}",
            f"{signed_pct(sp.low)} to {signed_pct(sp.high)}",
        ]
        for sp in report.seed_spreads
    ]
    return head, rows


def _pairs_title(report: EvalReport) -> str:
    """The debate pairs' heading, naming the baselines the pairs hold (one answer, the 3-sample vote)."""
    against = {p.against for p in report.debate_pairs}
    named = [name for label, name in (("single", "one answer"), ("vote@3", "the 3-sample vote")) if label in against]
    return "Debates against each other" + (f", and against {' and '.join(named)}" if named else "")


def _pair_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["debate", "minus", "difference (points [95% CI])", "paired items"]
    rows = [
        [p.protocol, p.against, f"{signed_pct(p.diff)} [{signed_pct(p.ci_low)}, {signed_pct(p.ci_high)}]", str(p.items)]
        for p in report.debate_pairs
    ]
    return head, rows


def _conformity(s: ProtocolSummary) -> str:
    if not s.outvoted:
        return "–"
    return f"{s.adopted_peers} of {s.outvoted} ({pct((s.adopted_peers or 0) / s.outvoted)})"


def _dynamics_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "protocol",
        "majority accuracy by round",
        "agreement by round",
        "wrong → right",
        "right → wrong",
        "decision confidence",
        "consensus rate",
        "vs single, paired (points)",
        "stated confidence: ECE / Brier (turns)",
        "calls from the cache/item",
        "first round unanimous and wrong",
        "outvoted agents that took the peers' answer",
    ]
    rows = []
    for s in report.protocols:
        rows.append(
            [
                s.label,
                " → ".join(pct(r.majority_accuracy) for r in s.rounds) or "–",
                " → ".join(pct(r.agreement) for r in s.rounds) or "–",
                "–" if s.wrong_to_right is None else str(s.wrong_to_right),
                "–" if s.right_to_wrong is None else str(s.right_to_wrong),
                "–" if s.decision_confidence is None else f"{s.decision_confidence:.2f}",
                pct(s.consensus_rate),
                signed_pct(s.improvement_over_single),
                "–" if s.stated_ece is None else f"{s.stated_ece:.3f} / {s.stated_brier:.3f} ({s.stated_turns})",
                f"{s.mean_cached_calls:.2f}",
                "–" if s.unanimous_wrong_first is None else str(s.unanimous_wrong_first),
                _conformity(s),
            ]
        )
    return head, rows


def _pareto_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    return (
        [
            "protocol or derived rule",
            "accuracy (a protocol: a tie to the answer given first; a derived rule: expected over tie-breaks)",
            "tokens/item",
        ],
        [
            [p.name + (" (derived)" if p.derived else ""), pct(p.accuracy), f"{p.mean_tokens:.0f}"]
            for p in report.pareto
        ],
    )


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A table cell's text on one line, a ``|`` in it escaped (a failure's reason may hold either)."""
    return " ".join(text.split()).replace("|", "\\|") if "|" in text or "\n" in text else text


def _verdicts(report: EvalReport) -> list[str]:
    out = []
    for s in report.protocols:
        c = s.comparison
        if c is None:
            continue
        if c.p_value < 0.05:
            word = "beats" if c.diff > 0 else "loses to"
            out.append(
                f"- **{s.label}** {word} {c.baseline} (the vote at its calls) by {abs(100 * c.diff):.1f} "
                f"points of expected accuracy (p = {c.p_value:.3f}, before correction for the run's other "
                "comparisons)."
            )
        else:
            out.append(
                f"- **{s.label}** is not distinguishable from {c.baseline}, the vote at its calls "
                f"({signed_pct(c.diff)} points of expected accuracy, p = {c.p_value:.2f}), at {s.mean_calls:.1f} "
                "calls per item."
            )
    return out


def _goal(report: EvalReport) -> list[str]:
    """Does anything in this run reach the goal? The family of every paired comparison the report
    has (:func:`moot.eval.analysis.goal_family`), corrected as one."""
    out: list[str] = []
    goal = report.goal
    if goal is None:
        return out
    family, m = goal.comparisons, len(goal.comparisons)
    wins, cheaper = [f for f in family if f.beats], [f for f in family if f.cheaper]
    text = (
        f"The goal: at least {100 * GOAL_POINTS:g} points over the equal-budget baseline with a paired interval "
        f"above 0, or the baseline's accuracy (interval's low end no worse than -{100 * NON_INFERIORITY:g} points) "
        f"at no more than {GOAL_TOKEN_SHARE:g}x its tokens; the intervals are corrected for the {m} paired "
        f"comparisons of this run (Bonferroni: each at {100 * (1 - 0.05 / m):.2f}%), and p-values are "
        "Holm's. Of those comparisons:"
    )
    out.append(f"- {text}")
    for f in wins:
        out.append(
            f"  - **{f.name}**: {signed_pct(f.diff)} points {ci(f.low, f.high)} (Holm p = {f.p_holm:.3f}; beats it)."
        )
    for f in cheaper:
        out.append(f"  - **{f.name}**: {signed_pct(f.diff)} points {ci(f.low, f.high)} at {f.share:.2f}x its tokens.")
    if wins or cheaper:
        out.append("  - A result counts for the goal when the same comparison holds on a second benchmark.")
    else:
        best = max(family, key=lambda f: f.diff)
        uncorrected = [f for f in family if f.gains(corrected=False)]
        out.append(
            f"  - nothing reaches it. The largest gain is {best.name}: {signed_pct(best.diff)} points "
            f"{ci(best.low, best.high)} corrected ({ci(best.ci95_low, best.ci95_high)} at 95% alone)."
            + (
                f" {len(uncorrected)} comparison(s) would clear 0 at an uncorrected 95%; with {m} "
                f"comparisons about {m / 40:.1f} would by chance alone."
                if uncorrected
                else ""
            )
        )
    if needed := goal.items_needed:
        median = int(statistics.median(needed))
        out.append(
            f"- How many items a paired test needs: to detect a true {100 * GOAL_POINTS:g}-point gain with 80% "
            f"power (two-sided, 5%), at the share of items each comparison above got right under exactly one of "
            f"its two sides, from {needed[0]:,} to {needed[-1]:,} items (median {median:,}); "
            f"these comparisons paired {goal.paired} items. An interval that spans 0 at this n says the run is "
            "too small to tell, not that the two are equal."
        )
    if report.pareto:
        front = sorted(report.pareto, key=lambda p: -p.accuracy)
        out.append(
            f"- Pareto-best on accuracy against tokens (on the {report.pareto_items} items every protocol finished; "
            "a protocol's accuracy with a tie to the answer given first, a derived rule's expected over tie-breaks): "
            + ", ".join(f"{p.name} ({pct(p.accuracy)}, {p.mean_tokens:.0f} tokens)" for p in front)
            + "."
        )
    return out


def header_lines(report: EvalReport) -> list[str]:
    cfg = report.config
    subject = f" ({cfg.subject})" if cfg.subject else ""
    stride = (
        [
            f"seed stride {cfg.seed_stride}: every agent's seed on the item at position j of the run is shifted by "
            f"{cfg.seed_stride} x j (a first_seed=S below is seed S on the first item, S + {cfg.seed_stride} on the "
            "second, ...); the protocols of one item share their samples all the same"
        ]
        if cfg.seed_stride
        else []
    )
    return [
        f"dataset **{cfg.dataset}**{subject}, {report.items} items (seed {cfg.seed}"
        f"{f', after its first {cfg.skip}' if cfg.skip else ''}), model `{cfg.model}`"
        f"{model_title(cfg.model)}, max tokens per turn {cfg.max_tokens or 'protocol default'}",
        *stride,
        *_sessions(report),
        f"generated {report.generated_at}",
        *_saved(report),
    ]


def _endpoints(report: EvalReport) -> list[str]:
    """Where each session's replies came from (an ``openai:`` model's endpoint, which its spec does not
    name), and a warning when the sessions' differ: the run's replies are then from several servers."""
    known = [(n, sn, e) for n, sn in enumerate(report.sessions, 1) if (e := (sn.runtime or {}).get("endpoint"))]
    lines = [f"session {n} (started {sn.started_at}, moot {sn.moot_version}): endpoint {e}" for n, sn, e in known]
    if len({e for _, _, e in known}) > 1:
        lines.append(
            "the sessions' endpoints differ: this run's replies came from more than one server (a resume against "
            "another --base-url); compare them only if they serve the same model"
        )
    return lines


def _sessions(report: EvalReport) -> list[str]:
    """How the model ran in each session: a seed repeats a sample only under the same llama.cpp threads
    and slots (and not always then); the request cache is what reproduces one."""
    if not report.config.model.startswith("embedded:"):
        return _endpoints(report)
    if not report.sessions:
        return [
            "llama.cpp threads and slots: not recorded (a run from before moot recorded them); a seed does "
            "not reproduce a sample across them, the request cache does"
        ]
    lines = []
    for n, sn in enumerate(report.sessions, 1):
        rt = sn.runtime
        if rt is None:
            how = (
                "on Ray workers (their settings are not seen here)"
                if sn.where == "ray"
                else ("the model was not loaded (every call it asked was in the request cache)")
            )
        else:
            how = (
                f"llama.cpp {rt.get('threads')} thread(s) ({rt.get('threads_why')}), {rt.get('slots')} slots, "
                f"context {rt.get('ctx')}, weights SHA-256 {str(rt.get('sha256'))[:12]}…, "
                f"xllamacpp {rt.get('engine')}"
            )
        lines.append(f"session {n} (started {sn.started_at}, moot {sn.moot_version}): {how}")
    return lines


def model_title(spec: str) -> str:
    """An embedded model named for what it is (``embedded:qwen2.5-1.5b`` is a coder model)."""
    if not spec.startswith("embedded:"):
        return ""
    from moot.models.base import ModelConfigError
    from moot.models.weights import get_info

    try:
        title = get_info(spec.removeprefix("embedded:")).title
    except ModelConfigError:
        return ""
    return f" ({title}{', a coder model' if 'Coder' in title else ''})"


def _saved(report: EvalReport) -> list[str]:
    """The calls the run's request cache saved: reported, never subtracted from a protocol's cost."""
    calls = total(s.mean_calls * s.finished for s in report.protocols)
    cached = total(s.mean_cached_calls * s.finished for s in report.protocols)
    if not cached:
        return []
    return [
        f"calls saved by the run's request cache: {cached:,.0f} of {calls:,.0f} reported "
        f"({100 * cached / calls:.0f}%); "
        "every protocol's calls and tokens below are what it would have paid alone"
    ]


#: What the report's numbers mean, under every rendering.
NOTES = (
    "Accuracy counts a failed item as wrong; *unextractable* answers (no answer of the item's kind) are wrong "
    "too, and counted, never dropped. A numeric answer is read as a number (commas, units, currency, a final "
    "'the answer is N'; 18.0 is 18). Latency is per item under the run's concurrency. A tie of a vote goes to "
    "the answer given first; the expected accuracy credits a tie by the share of its tied answers that are "
    "right (a vote over numeric answers ties whenever two or more values share the most votes: three samples "
    "giving three different numbers are a three-way tie, credited 1/3 if one of them is right), and every "
    "comparison uses it on both sides. A debate's baselines are fixed by its budget before any accuracy is looked at: "
    "the vote at its calls, the vote at its tokens (tokens per sample: `single`'s, else the pool's), each the "
    "run's own when it has one, else derived from the pool's k-subsets (marked derived: its value on an item is "
    "a mean over k-subsets, so the comparison counts the items the debate is ahead of and behind it, not items "
    "right under one side only). Comparisons pair the "
    "items both finished; the interval is Agresti and Min's for paired proportions (Wald's after adding 1/2 "
    "to each cell; over fractional credits where a tie is), p its normal p-value; the goal's family is "
    "corrected (Bonferroni intervals, Holm p-values)."
)


class Part(NamedTuple):
    """One section of the report, whatever renders it: a title, a paragraph, bullets, a table."""

    title: str
    text: str = ""
    bullets: tuple[str, ...] = ()
    table: tuple[list[str], list[list[str]]] | None = None


def sections(report: EvalReport) -> list[Part]:
    """The report's body as a list of sections: the one source of every renderer (Markdown, HTML)."""
    out: list[Part] = []
    if verdicts := _verdicts(report) + _goal(report):
        # The goal's lines are nested bullets in Markdown: kept as they are, a renderer flattens them.
        out.append(Part("Does debate pay for itself?", bullets=tuple(verdicts)))
    out.append(Part("Accuracy and cost", table=_rows(report)))
    out.append(
        Part(
            "Paired comparisons: the votes at the debate's calls and tokens, the adaptive vote, dearer votes",
            table=_comparison_rows(report),
        )
    )
    if any(s.failure_reasons for s in report.protocols):  # (only then: other reports read as before)
        out.append(Part("Why items failed", FAILED_TEXT, table=_failure_rows(report)))
    lengths = _length_rows(report)
    if lengths[1]:
        out.append(Part("Turn lengths and the token cap", LENGTHS_TEXT, table=lengths))
    out.append(Part("Debate dynamics", table=_dynamics_rows(report)))
    if report.seed_spreads:
        out.append(
            Part(
                "Draws of round 1: the same debate on other seeds",
                "Each row is one debate run on several draws of its first round (`first_seed=`), each draw paired "
                "with its own draw's vote of that kind: how much of a paired difference is the draw, not the debate. "
                "Against its first round's vote (the vote of the same draw whose samples are the debate's first "
                "answers, agent for agent, on the expected accuracy): what the later rounds add to the answers the "
                "agents started from.",
                table=_seed_rows(report),
            )
        )
    if report.debate_pairs:
        out.append(
            Part(
                _pairs_title(report),
                "Paired on the expected accuracy over tie-breaks, the row's debate minus the other, 95% intervals, "
                "uncorrected: what an ablation changes (what the agents see, their history) and what the debate "
                "adds to its own first round. Descriptive; not part of the goal's family.",
                table=_pair_rows(report),
            )
        )
    out += [Part(title, text, table=table) for title, text, table in variant_section(report) + pool_sections(report)]
    if report.pareto:
        title = f"Pareto front: accuracy against tokens (on the {report.pareto_items} items every protocol finished)"
        out.append(Part(title, table=_pareto_rows(report)))
    return out


def render_markdown(report: EvalReport, figures: dict[str, str]) -> str:
    parts = [f"# moot eval: {report.config.dataset}", "", *[f"- {h}" for h in header_lines(report)], ""]
    for part in sections(report):
        parts += [f"## {part.title}", ""]
        if part.text:
            parts += [part.text, ""]
        if part.bullets:
            parts += [*part.bullets, ""]
        if part.table is not None:
            parts += [_md_table(*part.table), ""]
    if figures:
        parts += ["## Figures", ""] + [f"![{name}]({path})" for name, path in figures.items()] + [""]
    parts += render_quality_markdown(report.quality)
    parts += [NOTES, ""]
    return "\n".join(parts)
