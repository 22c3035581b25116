"""The arbitrator's prompt: the seed's, generalised to N parties, with the source-authority ranking
and each finding's data freshness spelled out. The same pieces feed a debate preset (as the
question, the context passages and the judge's prompt)."""

from __future__ import annotations

from moot.apps.arbitration.detect import normalize_source, period_end
from moot.apps.arbitration.types import ArbitrationConfig, Contradiction, Party, actions, resolutions
from moot.core.types import ContextChunk, Persona

ARBITRATOR = Persona(
    name="Arbitrator",
    role="arbitrator",
    instructions=(
        "You are a neutral arbitrator. You settle contradictions between agents' findings on the evidence "
        "given: source authority, data freshness, citation completeness and the agents' confidence. Use only "
        "the data provided; never invent values or sources. Reply only with JSON."
    ),
)


def authority_rank(source: str, ranking: list[str]) -> int | None:
    """1-based rank of a source in the ranking (a ranked name contained in it counts:
    ``"World Bank WDI"`` ranks as ``"World Bank"``), or None when it is not ranked."""
    norm = normalize_source(source)
    for i, name in enumerate(ranking, 1):
        key = normalize_source(name)
        if key and key in norm:
            return i
    return None


def _value(p: Party) -> str:
    f = p.finding
    if f.value is None:
        return "no value"
    return f"{f.value:g}" + (f" {f.unit}" if f.unit else "")


def party_line(k: int, p: Party) -> str:
    f = p.finding
    parts = [f"Agent {k} ({p.agent}): {_value(p)}"]
    if f.interpretation:
        parts.append(f'interpretation: "{f.interpretation}"')
    c = f.citation
    if c is None:
        parts.append("citation: none given")
    else:
        cite = c.label() + (f", {c.url}" if c.url else "") + (f', "{c.quote}"' if c.quote else "")
        parts.append(f"citation: {cite}")
    parts.append(f"confidence: {f.confidence:g}")
    return "; ".join(parts)


def authority_text(c: Contradiction, cfg: ArbitrationConfig) -> str:
    if not cfg.source_authority:
        return "No source ranking is given: judge the reliability of each source yourself."
    lines = ["Most authoritative first: " + " > ".join(cfg.source_authority) + " > any other source."]
    for k, p in enumerate(c.parties, 1):
        cite = p.finding.citation
        if cite is None:
            lines.append(f"Agent {k}: no source given.")
            continue
        rank = authority_rank(cite.source, cfg.source_authority)
        where = f"ranks {rank} of {len(cfg.source_authority)}" if rank else "is not ranked (below the ranked sources)"
        lines.append(f"Agent {k}: {cite.source} {where}.")
    return "\n".join(lines)


def freshness_text(c: Contradiction, cfg: ArbitrationConfig) -> str:
    lines = []
    ends: dict[int, str] = {}
    for k, p in enumerate(c.parties, 1):
        period = p.finding.citation.period if p.finding.citation else None
        end = period_end(period)
        if end is not None:
            ends[k] = end.isoformat()
        lines.append(f"Agent {k}: " + (f"{period} (ends {end.isoformat()})" if end else period or "no period given"))
    if cfg.prefer_recent:
        lines.append("More recent data is preferred when the findings measure the same thing.")
        if ends:
            latest = max(ends.values())
            newest = [k for k, e in ends.items() if e == latest]
            if len(newest) == 1 and len(ends) > 1:
                lines.append(f"Most recent: Agent {newest[0]}.")
    else:
        lines.append("Freshness is given for context only; it is not a criterion here.")
    return "\n".join(lines)


def task_text(n: int) -> str:
    """The task and the output format (static text: no placeholders, safe as a template)."""
    res = " | ".join(f'"{r}"' for r in resolutions(n))
    act = " | ".join(f'"{a}"' for a in actions(n))
    every = "both" if n == 2 else f"all {n}"
    return (
        "TASK:\n"
        "1. Analyze the citations to determine source reliability.\n"
        "2. Check whether the values measure the same thing (same time period, same definition).\n"
        f"3. Determine whether {every} can be correct (different periods, methodologies or sources).\n"
        "4. If only one can be correct, determine which, based on: source authority (the ranking above), "
        "data freshness (more recent > older), citation completeness, agent confidence.\n"
        "Use only the data above. agentK_correct goes with use_agentK, both_valid "
        f"(meaning {every} findings are valid) with use_both, neither_valid with flag_for_review; "
        "flag_for_review may go with any resolution when you are unsure. recommended_value is the "
        "correct agent's value, or null.\n\n"
        "OUTPUT FORMAT (JSON):\n"
        "{\n"
        f'  "resolution": {res},\n'
        '  "explanation": "Detailed explanation of why",\n'
        '  "recommended_value": value or null,\n'
        '  "recommended_citation": "citation" or null,\n'
        '  "confidence": 0.0-1.0,\n'
        f'  "action": {act}\n'
        "}"
    )


def brief(c: Contradiction, cfg: ArbitrationConfig) -> str:
    lines = [
        f"CONTRADICTION ({c.kind.replace('_', ' ')}, severity {c.severity}):",
        f"- Metric: {c.metric}",
        *(f"- {party_line(k, p)}" for k, p in enumerate(c.parties, 1)),
    ]
    if c.details:
        lines.append(f"Detected: {c.details}.")
    lines += ["", "SOURCE AUTHORITY:", authority_text(c, cfg), "", "DATA FRESHNESS:", freshness_text(c, cfg)]
    return "\n".join(lines)


def arbitration_prompt(c: Contradiction, cfg: ArbitrationConfig) -> str:
    """The user message of a single arbitrator call."""
    n = len(c.parties)
    who = "two agents" if n == 2 else f"{n} agents"
    return (
        f"You are a neutral arbitrator conducting a structured debate between {who} who have conflicting "
        f"findings.\n\n{brief(c, cfg)}\n\n{task_text(n)}"
    )


def debate_question(c: Contradiction) -> str:
    options = "; ".join(f"agent {k} ({p.agent}): {_value(p)}" for k, p in enumerate(c.parties, 1))
    every = "both" if len(c.parties) == 2 else "all"
    return (
        f"The agents' findings on {c.metric} contradict each other ({options}). Which finding should be used, "
        f"or are {every} valid (different periods, definitions or sources)?"
    )


def debate_context(c: Contradiction, cfg: ArbitrationConfig) -> list[ContextChunk]:
    """The findings, one passage each, then the detection notes, the ranking and freshness."""
    chunks = [ContextChunk(text=party_line(k, p)) for k, p in enumerate(c.parties, 1)]
    if c.details:
        chunks.append(ContextChunk(text=f"Detected: {c.details}."))
    chunks.append(ContextChunk(text="Source authority. " + authority_text(c, cfg)))
    chunks.append(ContextChunk(text="Data freshness. " + freshness_text(c, cfg)))
    return chunks


def judge_prompt(n: int) -> str:
    """The debate's decision prompt: the engine fills ``{question}``, ``{context}``, ``{transcript}``."""
    return (
        "{question}\n\nThe findings and the arbitration rules:\n{context}\n\nThe debate:\n{transcript}\n\n"
        "Settle the contradiction on the evidence and the arguments.\n\n" + task_text(n)
    )
