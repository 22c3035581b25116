"""The two debate variants of the ABSA pipeline, as moot protocol specs on the one engine.

- ``absa-panel`` (seed 001): analyst (neutral), critic (con), empath (pro) speak in the order
  analyst, critic, empath for 2 rounds; each turn plans, reflects, then speaks (``PanelTurn``,
  with the Stage 1 aspect terms it is about); a judge summarises (``PanelJudgeSummary``).
- ``absa-patch`` (seed 002, the default): EPM, TAN, CJ in that order, 1 round; each turn is only
  ``proposed_edits``; the history reads as the seed's ``- agent: op target=... value=...
  evidence=...`` lines (a registered turn view and the ``lines`` history style); the
  Consistency Judge returns ``PatchJudgeSummary`` (final patch, final tuples, sentence polarity,
  evidence spans).

Both read the sentence as ``[TOPIC]`` and the Stage 1 results as ``[SHARED_CONTEXT_JSON]`` (a
context passage holding their JSON); config can replace the rounds, the order and the personas.
"""

from __future__ import annotations

from typing import Any

from moot.apps.absa.patch import format_history
from moot.apps.absa.types import PanelJudgeSummary, PanelTurn, PatchJudgeSummary, PatchTurn
from moot.core.spec import Budget, JudgeDecision, Participant, Prompts, ProtocolSpec, TurnFormat, Visibility
from moot.core.types import Persona
from moot.protocols import register_preset
from moot.structured import register_schema, register_view

register_schema("absa-panel-turn", PanelTurn)
register_schema("absa-panel-summary", PanelJudgeSummary)
register_schema("absa-patch-turn", PatchTurn)
register_schema("absa-patch-summary", PatchJudgeSummary)


def edit_lines(parsed: dict[str, Any], speaker: str) -> str:
    """A patch turn as the seed's history lines, under the speaker's id (not whatever the model
    wrote in ``agent``)."""
    turn = PatchTurn.model_validate({**parsed, "agent": speaker})
    return format_history([turn])


register_view("absa-edit-lines", edit_lines)

SPEAKER_TEMPLATE = (
    "[TOPIC]\n{question}\n\n[PERSONA]\n{persona_json}\n\n[SHARED_CONTEXT_JSON]\n{context_json}\n\n[HISTORY]\n{history}"
)

PANEL_SPEAKER = (
    "You are a panelist in a structured debate about the sentiment of a review sentence (the TOPIC). "
    "Think in three steps: planning (what you will argue and why), reflection (what the others said and "
    "where you stand now), then your message. Stay in your persona's stance. Name the aspect terms from "
    "the shared context that you talk about in aspect_refs. Reply only with JSON: speaker, stance, planning, "
    "reflection, message, key_points, aspect_refs."
)
PANEL_PERSONAS: dict[str, Persona] = {
    "analyst": Persona(name="Analyst panel", role="analyst", goal="give a neutral, evidence-based judgement",
                       stance="neutral", style="dry and evidence-driven", instructions=PANEL_SPEAKER),
    "critic": Persona(name="Critic panel", role="critic", goal="strengthen the negative, critical reading",
                      stance="con", style="sharp and logical", instructions=PANEL_SPEAKER),
    "empath": Persona(name="Empath panel", role="empath", goal="strengthen the positive, supportive reading",
                      stance="pro", style="warm and emotional", instructions=PANEL_SPEAKER),
}  # fmt: skip

PATCH_SPEAKER = (
    "You are an annotation corrector in a debate about the aspect-based sentiment annotation of one review "
    "sentence (the TOPIC). The shared context holds the Stage 1 aspects and polarities. Output ONLY "
    "proposed_edits, as JSON: agent, proposed_edits (each: op, target, value, evidence, confidence). op is one "
    "of set_polarity, set_aspect_ref, merge_tuples, drop_tuple, confirm_tuple; target must be an aspect term "
    "from the shared context (its aspect_ref); value is the new polarity (positive, negative, neutral) for "
    "set_polarity, the new aspect term for set_aspect_ref, the other aspect term for merge_tuples; evidence "
    "is an exact quote from the TOPIC. Do not state a final label. "
)
PATCH_PERSONAS: dict[str, Persona] = {
    "epm": Persona(
        name="EPM", role="Evidence-Polarity Mapper",
        goal="Determine polarity only when supported by explicit textual evidence",
        instructions=PATCH_SPEAKER + "As EPM, check that each polarity is backed by words in the sentence: "
        "opinion spans left out or over-read, negation and irony read literally, polarity over-interpreted.",
    ),
    "tan": Persona(
        name="TAN", role="Target-Aspect Normalizer",
        goal="Resolve null, duplicate, or misaligned aspect targets",
        instructions=PATCH_SPEAKER + "As TAN, fix the targets: missing or null aspect terms, duplicates to "
        "merge, spans that do not match the aspect.",
    ),
    "cj": Persona(
        name="CJ", role="Consistency Judge",
        goal="Produce a single, consistent set of aspect-polarity tuples",
        instructions=PATCH_SPEAKER + "As CJ, keep one polarity per aspect, drop judgements without evidence, "
        "and prevent over-editing: confirm what is already right.",
    ),
}  # fmt: skip

PANEL_JUDGE = Persona(
    name="Judge",
    role="judge",
    instructions=(
        "You are the judge of a panel debate about the sentiment of a review sentence. Read every turn and "
        "summarise it: the winner (a panelist's name, or null if none), the consensus (say whether the "
        "sentence is positive, negative, neutral or mixed), key agreements, key disagreements and your "
        "rationale. Reply only with JSON."
    ),
)
PATCH_JUDGE = Persona(
    name="CJ",
    role="Consistency Judge",
    goal="Produce a single, consistent set of aspect-polarity tuples",
    instructions=(
        "You are the Consistency Judge (CJ). Read the TOPIC, the shared context and all proposed edits. Output "
        "JSON: final_patch (the edits to apply, Stage 2 ready), final_tuples (one consistent set of "
        "aspect_term + polarity), unresolved_conflicts, sentence_polarity (positive, negative, neutral or "
        "mixed), sentence_evidence_spans (at least one EXACT substring of the TOPIC that supports your "
        "conclusion, copied character for character), optional aspect_evidence and rationale."
    ),
)
JUDGE_TEMPLATE = "[TOPIC]\n{question}\n\n[SHARED_CONTEXT_JSON]\n{context_json}\n\n[ALL_TURNS]\n{transcript}"


def _participants(personas: dict[str, Persona], order: list[str]) -> list[Participant]:
    unknown = [k for k in order if k not in personas]
    if unknown:
        raise ValueError(f"debate.order names {', '.join(unknown)}, but the personas are {', '.join(personas)}")
    return [Participant(id=k, persona=personas[k]) for k in order]


def _sequential_debate(
    name: str,
    description: str,
    personas: dict[str, Persona],
    order: list[str],
    rounds: int,
    turn: TurnFormat,
    judge: JudgeDecision,
    max_tokens: int,
    **extra: Any,
) -> ProtocolSpec:
    """What both variants share: speakers in a fixed order seeing everything said so far, the
    TOPIC / PERSONA / SHARED_CONTEXT_JSON / HISTORY prompt, every Stage 1 passage, a judge."""
    return ProtocolSpec(
        name=name,
        description=description,
        participants=_participants(personas, order),
        rounds=rounds,
        order="sequential",
        visibility=Visibility(who="all", window=None, same_round=True),
        turn=turn,
        prompts=Prompts(opening=SPEAKER_TEMPLATE, rebuttal=SPEAKER_TEMPLATE),
        decision=judge,
        budget=Budget(max_tokens_per_turn=max_tokens),
        max_context_chunks=None,
        **extra,
    )


def absa_panel(
    rounds: int = 2, order: list[str] | None = None, personas: dict[str, Persona] | None = None
) -> ProtocolSpec:
    """Seed 001's persona panel over an ABSA sentence (the ``panel`` preset's format, with turns
    that name their aspects and a judge asked for the sentence's label)."""
    return _sequential_debate(
        "absa-panel",
        "Seed 001: analyst / critic / empath over a review sentence, planning-reflection-message turns with "
        "aspect refs, a judge summary.",
        {**PANEL_PERSONAS, **(personas or {})},
        order or ["analyst", "critic", "empath"],
        rounds,
        TurnFormat(schema="absa-panel-turn", show_field="message"),
        JudgeDecision(schema="absa-panel-summary", answer_field="consensus", persona=PANEL_JUDGE,
                      prompt=JUDGE_TEMPLATE, max_tokens=500),
        max_tokens=450,
    )  # fmt: skip


def absa_patch(
    rounds: int = 1, order: list[str] | None = None, personas: dict[str, Persona] | None = None
) -> ProtocolSpec:
    """Seed 002's patch debate (EPM -> TAN -> CJ, proposed edits only, a consistency judge)."""
    return _sequential_debate(
        "absa-patch",
        "Seed 002: EPM, TAN, CJ propose edits to the Stage 1 tuples; the Consistency Judge returns the final "
        "patch, tuples, sentence polarity and evidence spans.",
        {**PATCH_PERSONAS, **(personas or {})},
        order or ["epm", "tan", "cj"],
        rounds,
        TurnFormat(schema="absa-patch-turn", view="absa-edit-lines"),
        JudgeDecision(schema="absa-patch-summary", answer_field="sentence_polarity", persona=PATCH_JUDGE,
                      prompt=JUDGE_TEMPLATE, max_tokens=600),
        max_tokens=400,
        history_style="lines",
    )  # fmt: skip


register_preset("absa-panel", absa_panel)
register_preset("absa-patch", absa_patch)
