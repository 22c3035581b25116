"""The formats of seeds 001 and 004: the panel, the moderated debate and its extended form."""

from __future__ import annotations

from moot.core.spec import (
    Budget,
    JudgeDecision,
    Participant,
    Prompts,
    ProtocolSpec,
    RuleDecision,
    Stage,
    TurnFormat,
    Visibility,
)
from moot.core.stop import ModeratorVerdict
from moot.core.types import Persona

# ----------------------------------------------------------------------- seeds 001 and 004


PANEL_SPEAKER = (
    "You are a panelist in a structured debate. Think in three steps: planning (what you will argue "
    "and why), reflection (what the others said and where you stand now), then your message. Stay in "
    "your persona's stance. Reply only with JSON: speaker, stance, planning, reflection, message, "
    "key_points."
)
PANEL_TEMPLATE = (
    "[TOPIC]\n{question}\n\n[PERSONA]\n{persona_json}\n\n[SHARED_CONTEXT_JSON]\n{context_json}\n\n[HISTORY]\n{history}"
)


def panel(rounds: int = 2, *, order: tuple[str, ...] = ("analyst", "critic", "empath")) -> ProtocolSpec:
    """Seed 001: analyst (neutral), critic (con), empath (pro) speak in turn; a judge summarises."""
    personas = {
        "analyst": Persona(
            name="Analyst panel", role="analyst", goal="give a neutral, evidence-based judgement",
            stance="neutral", style="dry and evidence-driven", instructions=PANEL_SPEAKER,
        ),
        "critic": Persona(
            name="Critic panel", role="critic", goal="strengthen the negative, critical reading",
            stance="con", style="sharp and logical", instructions=PANEL_SPEAKER,
        ),
        "empath": Persona(
            name="Empath panel", role="empath", goal="strengthen the positive, supportive reading",
            stance="pro", style="warm and emotional", instructions=PANEL_SPEAKER,
        ),
    }  # fmt: skip
    return ProtocolSpec(
        name="panel",
        description="Seed 001: three personas in a fixed order, planning-reflection-message turns, a judge summary.",
        participants=[Participant(id=k, persona=personas[k]) for k in order],
        rounds=rounds,
        order="sequential",
        visibility=Visibility(who="all", window=None, same_round=True),
        turn=TurnFormat(schema="panel-turn", show_field="message"),
        prompts=Prompts(opening=PANEL_TEMPLATE, rebuttal=PANEL_TEMPLATE),
        decision=JudgeDecision(
            schema="panel-summary",
            answer_field="consensus",
            persona=Persona(
                name="Judge",
                role="judge",
                instructions=(
                    "You are the judge of a panel debate. Read every turn and summarise it: the winner "
                    "(a panelist's name, or null if none), the consensus, key agreements, key "
                    "disagreements and your rationale. Reply only with JSON."
                ),
            ),
            prompt="[TOPIC]\n{question}\n\n[SHARED_CONTEXT_JSON]\n{context_json}\n\n[ALL_TURNS]\n{transcript}",
        ),
        budget=Budget(max_tokens_per_turn=600),
    )


def _arguer(pid: str, name: str, role: str, task: str) -> Participant:
    return Participant(
        id=pid,
        persona=Persona(
            name=name,
            role=role,
            instructions=f"You are the {name} in a moderated debate. {task} Be factual and logical.",
        ),
    )


ARGUE_OPENING = (
    "Proposition: {question}\n\nContext:\n{context}\n\nGive your argument with its supporting evidence "
    "and your confidence from 0 to 1, as JSON."
)
ARGUE_REBUTTAL = (
    "Proposition: {question}\n\nContext:\n{context}\n\nPrevious arguments:\n\n{history}\n\n"
    "Address the arguments raised, then give your argument with its supporting evidence and your "
    "confidence from 0 to 1, as JSON."
)


def _round_reviewer(
    pid: str, name: str, instructions: str, schema: str, *, label: str, shown: str, ask: str
) -> Participant:
    """A speaker who comes after the others in a round and reviews only that round, in a typed
    reply: the moderator, MAD's moderator, the refiner, ChatEval's summarizer."""
    return Participant(
        id=pid,
        persona=Persona(name=name, role=pid, instructions=instructions),
        turn=TurnFormat(schema=schema, show_field=shown or None),
        visibility=Visibility(who="others", window=0, same_round=True),
        prompts=Prompts(
            opening=f"{label}: {{question}}",
            rebuttal=f"{label}: {{question}}\n\nThis round:\n\n{{history}}\n\n{ask} as JSON.",
        ),
    )


MODERATOR = _round_reviewer(
    "moderator",
    "Moderator",
    "You moderate a debate. Evaluate the arguments of the current round objectively, on logic, evidence and "
    "reasoning: score the case FOR and the case AGAINST from 0 to 1, list the key points, and give your overall "
    "confidence in the current understanding from 0 to 1.",
    "moderator-evaluation",
    label="Proposition",
    shown="",
    ask="Your evaluation",
)


def moderated(rounds: int = 2) -> ProtocolSpec:
    """Seed 004 phase 1: proponent, opponent, then a moderator each round; ends when the moderator's
    confidence exceeds 0.8 or after 2 rounds; SUPPORT / OPPOSE / UNCERTAIN by argument strength."""
    return ProtocolSpec(
        name="moderated",
        description="Seed 004 phase 1: pro/con arguments, a scoring moderator, argument-strength decision.",
        participants=[
            _arguer("proponent", "Proponent", "proponent", "You argue FOR the proposition."),
            _arguer("opponent", "Opponent", "opponent", "You argue AGAINST the proposition."),
            MODERATOR,
        ],
        rounds=rounds,
        stages=[Stage(speakers=["proponent", "opponent"], order="sequential"), Stage(speakers=["moderator"])],
        visibility=Visibility(who="others", window=None, same_round=True),
        turn=TurnFormat(schema="argument", show_field="content"),
        prompts=Prompts(opening=ARGUE_OPENING, rebuttal=ARGUE_REBUTTAL),
        stop=ModeratorVerdict("moderator", "confidence", 0.8),
        decision=RuleDecision(name="argument-strength"),
    )


def moderated_extended(rounds: int = 3) -> ProtocolSpec:
    """Seed 004 phase 2: proponent, opponent, advocate and critic in parallel, a refiner
    synthesises the round, then the moderator; up to 3 rounds."""
    refiner = _round_reviewer(
        "refiner",
        "Refiner",
        "You synthesise and refine a debate round: integrate the valid points of every side, name agreements and "
        "disagreements, suggest resolution paths. Do not take sides.",
        "summary",
        label="Proposition",
        shown="summary",
        ask="Your synthesis",
    )
    spec = moderated(rounds)
    return spec.model_copy(
        update={
            "name": "moderated-extended",
            "description": "Seed 004 phase 2: four arguers in parallel, a refiner, a moderator; up to 3 rounds.",
            "participants": [
                *spec.participants[:2],
                _arguer("advocate", "Advocate", "advocate", "You advocate practical implementation: benefits, "
                        "stakeholders, implementation and risk mitigation."),
                _arguer("critic", "Critic", "critic", "You analyse every position critically: fallacies, "
                        "missing evidence, biases, alternative frameworks."),
                refiner,
                MODERATOR,
            ],
            "stages": [
                Stage(speakers=["proponent", "opponent", "advocate", "critic"], order="simultaneous"),
                Stage(speakers=["refiner"]),
                Stage(speakers=["moderator"]),
            ],
        }
    )  # fmt: skip
