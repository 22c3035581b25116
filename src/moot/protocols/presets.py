"""The debate formats of the seeds and the literature, each a short spec on the one engine.

Every factory takes its few parameters (rounds, agents, ...) and returns a fresh
:class:`~moot.core.spec.ProtocolSpec`; ``moot protocols show NAME`` prints it as YAML.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from moot.core.schemas import AnswerForm, Confidence, answer_schema_name
from moot.core.spec import (
    Budget,
    Decision,
    JudgeDecision,
    Participant,
    Probe,
    Prompts,
    ProtocolSpec,
    RuleDecision,
    SelectDecision,
    Stage,
    TurnFormat,
    Visibility,
    VoteDecision,
)
from moot.core.stop import Consensus, ModeratorVerdict, Settled
from moot.core.types import Persona
from moot.structured import register_schema

# ----------------------------------------------------------------------------- shared schemas


class PanelTurn(BaseModel):
    """Seed 001's DebateTurn: plan, reflect, then speak."""

    speaker: str = Field(max_length=40)
    stance: str = Field(max_length=20)
    planning: str = Field(max_length=600)
    reflection: str = Field(max_length=600)
    message: str = Field(max_length=1200)
    key_points: list[str] = Field(default_factory=list, max_length=5)


class PanelSummary(BaseModel):
    """Seed 001's DebateSummary, the judge's output."""

    winner: str | None = Field(default=None, max_length=40)
    consensus: str = Field(max_length=600)
    key_agreements: list[str] = Field(default_factory=list, max_length=5)
    key_disagreements: list[str] = Field(default_factory=list, max_length=5)
    rationale: str = Field(max_length=800)


class Argument(BaseModel):
    """Seed 004's DebateArgument (the round is the turn's own)."""

    content: str = Field(max_length=1200)
    confidence: Confidence = Field(ge=0, le=1)
    supporting_evidence: list[str] = Field(default_factory=list, max_length=5)


class ModeratorEvaluation(BaseModel):
    """Seed 004's moderator: scores both sides and its own confidence in the current understanding."""

    pro_score: float = Field(ge=0, le=1, description="strength of the arguments FOR, 0 to 1")
    con_score: float = Field(ge=0, le=1, description="strength of the arguments AGAINST, 0 to 1")
    confidence: Confidence = Field(ge=0, le=1, description="confidence in the current understanding, 0 to 1")
    key_points: list[str] = Field(default_factory=list, max_length=5)


class MadModeration(BaseModel):
    """MAD's moderator: does it prefer one side yet?"""

    preference: bool
    supported_side: Literal["affirmative", "negative", ""] = ""
    reason: str = Field(default="", max_length=600)
    debate_answer: str = Field(default="", max_length=200)


class Summary(BaseModel):
    """ChatEval's summarizer output."""

    summary: str = Field(max_length=1200)


_SCHEMAS: dict[str, type[BaseModel]] = {
    "panel-turn": PanelTurn,
    "panel-summary": PanelSummary,
    "argument": Argument,
    "moderator-evaluation": ModeratorEvaluation,
    "mad-moderation": MadModeration,
    "summary": Summary,
}
for _name, _schema in _SCHEMAS.items():
    register_schema(_name, _schema)

ANSWER_OPENING = (
    "Question: {question}\n\nContext:\n{context}\n\n"
    "Answer with brief reasoning, the answer itself (a number, a letter, yes/no or a few words) and "
    "your confidence from 0 to 1, as JSON."
)
ANSWER_REBUTTAL = (
    "Question: {question}\n\nContext:\n{context}\n\nThese are the other agents' recent answers:\n\n{history}\n\n"
    "Using their answers as additional advice, give your updated answer with brief reasoning and your "
    "confidence from 0 to 1, as JSON."
)
ANSWER_PROMPTS = Prompts(opening=ANSWER_OPENING, rebuttal=ANSWER_REBUTTAL)

#: How an answer turn is asked for: ``brief`` (moot's wording: "brief reasoning", the committed
#: runs') or ``du`` (Du et al.'s: "Can you solve the following problem? ... Explain your reasoning.").
Wording = Literal["brief", "du"]

#: Du et al.'s opening (``gsm/gen_gsm.py``, the task words "math problem" made "problem"), the
#: answer asked as JSON instead of "in the form \\boxed{answer}, at the end of your response".
DU_OPENING = "Can you solve the following problem? {question}{context_block} Explain your reasoning. {reply}"
#: Du et al.'s later-round message of ``gsm/gen_gsm.py`` (it restates the problem), likewise.
DU_GSM_REBUTTAL = (
    "These are the solutions to the problem from other agents:\n\n{history}\n\n"
    "Using the solutions from other agents as additional information, can you provide your answer to the "
    "problem?\nThe original problem is {question}. {reply}"
)
#: ``history=together``: the same message, the agent's own previous solution quoted first.
DU_TOGETHER = DU_GSM_REBUTTAL.replace(
    "These are the solutions to the problem from other agents:",
    "Here are your previous solution and the solutions to the problem from other agents:",
)


def _du_reply(confidence: bool) -> str:
    then = ", then your confidence from 0 to 1" if confidence else ""
    return f"Give your reasoning first, then your final answer alone as the answer{then}, as JSON."


#: What each brief prompt says about confidence, and what it says without (``confidence=false``).
_CONFIDENCE_ASKS = [
    (" the answer itself (a number, a letter, yes/no or a few words) and your confidence from 0 to 1, as JSON.",
     " and the answer itself (a number, a letter, yes/no or a few words), as JSON."),
    ("with brief reasoning and your confidence from 0 to 1, as JSON.", "with brief reasoning, as JSON."),
]  # fmt: skip


def without_confidence(text: str) -> str:
    """A brief prompt with its request for a confidence taken out (the first asks ", ... and your
    confidence"; every later one "with brief reasoning and your confidence")."""
    out = text.replace(
        "Answer with brief reasoning," + _CONFIDENCE_ASKS[0][0], "Answer with brief reasoning" + _CONFIDENCE_ASKS[0][1]
    )
    out = out.replace(*_CONFIDENCE_ASKS[1])
    if out == text:
        raise ValueError("this prompt asks for no confidence to take out")
    return out


def answer_turn(exchange: str | None, *, wording: Wording, confidence: bool) -> TurnFormat:
    """An answer turn whose reasoning is required (non-empty, before the answer: issue 39, S6):
    brief reasoning (1,200 characters) with moot's wording, room for a worked solution (6,000)
    with Du et al.'s, which asks to explain it; a confidence only when asked for."""
    form = AnswerForm("explained" if wording == "du" else "brief", confidence)
    return TurnFormat(schema=answer_schema_name(form), show_field=exchange)


def answer_prompts(wording: Wording = "brief", confidence: bool = True) -> Prompts:
    """The independent answer's prompts (a vote's samples, round 1 of a debate)."""
    if wording == "du":
        opening = DU_OPENING.replace("{reply}", _du_reply(confidence))
        return Prompts(opening=opening, rebuttal=opening)
    if confidence:
        return ANSWER_PROMPTS
    return Prompts(opening=without_confidence(ANSWER_OPENING), rebuttal=without_confidence(ANSWER_REBUTTAL))


def _agents(
    n: int,
    *,
    temperature: float | None,
    prefix: str = "agent",
    models: list[str] | None = None,
    first_seed: int = 1,
) -> list[Participant]:
    """n solver agents with distinct seeds (independent samples): the i-th samples with seed
    s = ``first_seed + i - 1`` and is Agent s, so another ``first_seed`` is another draw, and Agent s
    asks exactly what sample s of a vote or a pool asks (one request in a run's cache). With
    ``models``, the i-th runs on ``models[(i - 1) % len(models)]``: a heterogeneous panel."""
    return [
        Participant(
            id=f"{prefix}{s}",
            persona=Persona(
                name=f"Agent {s}",
                role="solver",
                instructions=f"You are Agent {s}, a careful problem solver. Think step by step, then answer.",
            ),
            model=models[(i - 1) % len(models)] if models else None,
            temperature=temperature,
            seed=s,
        )
        for i, s in enumerate(range(first_seed, first_seed + n), start=1)
    ]


def _models(models: list[str] | str | None) -> list[str] | None:
    """``models=`` as a list or a ``+``-separated string (``embedded:qwen2.5-1.5b+openai:gpt-4o-mini``)."""
    if isinstance(models, str):
        models = [m.strip() for m in models.split("+") if m.strip()]
    return list(models) if models else None


# -------------------------------------------------------------------------------- baselines


def single(*, max_tokens: int = 400, wording: Wording = "brief", confidence: bool = True) -> ProtocolSpec:
    """One call, one typed answer: the cheapest baseline."""
    return ProtocolSpec(
        name="single",
        description="Baseline: one agent, one call, a typed answer.",
        participants=_agents(1, temperature=None),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording=wording, confidence=confidence),
        prompts=answer_prompts(wording, confidence),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


DIRECT_OPENING = "Question: {question}\n\nContext:\n{context}\n\nGive the answer only, as JSON."


def direct(*, max_tokens: int = 20) -> ProtocolSpec:
    """One call, the answer alone with no reasoning: for multiple choice about as accurate as
    reasoning first unless the question needs computation, at a fraction of the tokens."""
    return ProtocolSpec(
        name="direct",
        description="Baseline: one call, the typed answer alone (no reasoning).",
        participants=_agents(1, temperature=None),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=TurnFormat(schema="direct", show_field="answer"),
        prompts=Prompts(opening=DIRECT_OPENING, rebuttal=DIRECT_OPENING),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def vote(
    k: int = 5,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Self-consistency: k independent samples (distinct seeds), majority vote. k calls. With
    ``models``, the samples cycle through them: the fair baseline of a heterogeneous debate. With
    ``first_seed``, another draw of samples (the seeds ``first_seed`` to ``first_seed + k - 1``).
    ``wording`` and ``confidence`` as in :func:`society_of_minds`: sample s asks exactly what agent
    s of a debate of the same options asks in its first round."""
    return ProtocolSpec(
        name="vote",
        description=f"Baseline: {k} independent samples, majority vote (self-consistency).",
        participants=_agents(k, temperature=temperature, models=_models(models), first_seed=first_seed),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording=wording, confidence=confidence),
        prompts=answer_prompts(wording, confidence),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def usc(
    k: int = 3,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Universal Self-Consistency (Chen et al. 2023): exactly ``vote(k)``'s samples (the same
    requests: a run's cache shares them with ``vote@k``), then one greedy call in which the model
    reads them all and picks the most consistent; its answer is the decision. k + 1 calls. A pick
    that names no sample falls back to the vote, recorded."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens, models=models, first_seed=first_seed,
                wording=wording, confidence=confidence)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "usc",
            "description": f"Universal Self-Consistency: {k} samples, the model picks the most consistent one.",
            "decision": SelectDecision(mode="consistency"),
        }
    )


def select(
    k: int = 3,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Judge-select: ``vote(k)``'s samples, then one greedy judge call that checks them and picks the
    one it finds correct (not the most common); its answer is the decision. k + 1 calls."""
    spec = usc(k, temperature=temperature, max_tokens=max_tokens, models=models, first_seed=first_seed,
               wording=wording, confidence=confidence)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "select",
            "description": f"Judge-select: {k} samples, a judge picks the one it finds correct.",
            "decision": SelectDecision(mode="judge"),
        }
    )


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


# ------------------------------------------------------------------------------ literature


#: Du et al.'s later-round message (``construct_message`` in the authors' code), with the reply
#: asked for as typed JSON instead of "(X) at the end of your response". The question is not
#: repeated: it is in the agent's own conversation.
DU_REBUTTAL = (
    "These are the solutions to the problem from other agents:\n\n{history}\n\n"
    "Using the reasoning from other agents as additional advice, can you give an updated answer? "
    "Examine your solution and that of the other agents step by step. Give your answer with brief "
    "reasoning and your confidence from 0 to 1, as JSON."
)

#: What the others see of an agent's typed turn: ``full`` (its whole reply, reasoning and answer,
#: as the papers share it), ``answer`` (only the answer: the herding ablation) or ``reasoning``.
Exchange = Literal["full", "answer", "reasoning"]
#: How a later round reaches an agent: see :func:`_debate_view`.
History = Literal["conversation", "prompt", "together"]
#: How a Society-of-Minds-style debate is decided: the last round's majority (``vote``), or a judge
#: that picks one of its replies: ``usc`` (Universal Self-Consistency), ``select`` (judge-select).
Decide = Literal["vote", "usc", "select"]

#: ``history=together`` with moot's brief wording: the question, then every previous reply (the
#: agent's own first, marked), then Du et al.'s instruction.
BRIEF_TOGETHER = (
    "Question: {question}\n\nContext:\n{context}\n\n"
    "Here are your previous solution and the solutions to the problem from other agents:\n\n{history}\n\n"
    "Using the reasoning from other agents as additional advice, can you give an updated answer? "
    "Examine your solution and that of the other agents step by step. Give your answer with brief "
    "reasoning and your confidence from 0 to 1, as JSON."
)


def _debate_prompts(history: History, wording: Wording, confidence: bool) -> Prompts:
    """The prompts of a Society-of-Minds-style debate for a history rendering, a wording and
    whether a confidence is asked (the brief wording's defaults are the committed runs' prompts)."""
    opening = answer_prompts(wording, confidence).opening
    if wording == "du":
        if history == "prompt":
            raise TypeError(  # what a front door reports as a bad preset parameter
                "history=prompt is moot's first rendering, kept to reproduce its runs, in the brief wording only: "
                "use history=conversation or history=together with wording=du"
            )
        rebuttal = (DU_TOGETHER if history == "together" else DU_GSM_REBUTTAL).replace("{reply}", _du_reply(confidence))
        return Prompts(opening=opening, rebuttal=rebuttal)
    rebuttal = {"conversation": DU_REBUTTAL, "together": BRIEF_TOGETHER, "prompt": ANSWER_REBUTTAL}[history]
    return Prompts(opening=opening, rebuttal=rebuttal if confidence else without_confidence(rebuttal))


def _debate_view(
    exchange: Exchange, history: History, wording: Wording = "brief", confidence: bool = True
) -> dict[str, object]:
    """The spec fields of a Society-of-Minds-style exchange: what is shared and how it is kept.

    ``conversation`` (the papers'): each agent keeps its own chat (its earlier replies as assistant
    messages) and each later round adds one user message with the others' replies of the previous
    round, quoted as in Du et al.'s code. ``together``: no replayed chat; one user message with the
    question and every agent's previous reply, the agent's own first and marked as its own ("Your
    previous solution: ```...```", then "One agent solution: ```...```" for each other), and Du et
    al.'s instruction. ``prompt``: one user message that restates the question and quotes the others'
    previous turns, the agent's own earlier turn not shown: moot's first version of these presets,
    kept so that its runs can be reproduced (``exchange=answer, history=prompt`` is exactly the
    protocol of the first published results)."""
    return {
        "visibility": Visibility(
            who="all" if history == "together" else "others",
            window=1,
            history="conversation" if history == "conversation" else "prompt",
        ),
        "turn": answer_turn(None if exchange == "full" else exchange, wording=wording, confidence=confidence),
        "prompts": _debate_prompts(history, wording, confidence),
        "history_style": "quoted" if history == "prompt" else "solutions",
    }


def _decision(decide: Decide) -> Decision:
    if decide == "vote":
        return VoteDecision()
    return SelectDecision(mode="consistency" if decide == "usc" else "judge")


def society_of_minds(
    agents: int = 3,
    rounds: int = 2,
    *,
    temperature: float = 0.7,
    models: list[str] | str | None = None,
    exchange: Exchange = "full",
    history: History = "conversation",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
    decide: Decide = "vote",
) -> ProtocolSpec:
    """Du et al. (ICML 2024): agents answer independently; in each later round every agent, in its
    own continuing conversation, reads the other agents' whole previous replies and gives an
    updated answer; majority vote of the last round. agents x rounds calls. ``exchange`` says what
    the others see (``answer``: the herding ablation), ``history`` how it is kept (see
    :func:`_debate_view`). With ``models`` the agents run on different models (a heterogeneous
    society); ``first_seed`` draws other samples. ``wording``: ``brief`` (moot's prompts) or ``du``
    (Du et al.'s words, their GSM8K code's, with room for a worked solution); ``confidence=false``:
    no confidence asked, in the turn or shown to the others. ``max_tokens``: each turn's cap (the
    vote's 400 by default, so round 1 is a vote's samples). ``decide``: the last round's majority
    (``vote``), or a judge that picks one of its replies (``usc``, ``select``: one more call)."""
    shown = {"full": "whole replies", "answer": "answers only", "reasoning": "reasoning only"}[exchange]
    decided = {"vote": "majority vote", "usc": "the most consistent reply picked (USC)",
               "select": "a judge picks a reply"}[decide]  # fmt: skip
    return ProtocolSpec(
        name="society-of-minds",
        description=f"Du et al.: independent answers, then rounds in which each agent reads the others' {shown} "
        f"and updates; {decided}.",
        participants=_agents(agents, temperature=temperature, models=_models(models), first_seed=first_seed),
        rounds=rounds,
        decision=_decision(decide),
        # The vote's budget: round 1 is then exactly a vote's first samples (one request, computed
        # once when both run in one eval).
        budget=Budget(max_tokens_per_turn=max_tokens),
        **_debate_view(exchange, history, wording, confidence),  # type: ignore[arg-type]
    )


MAD_DEBATER = (
    "You are a debater. Hello and welcome to the debate. It's not necessary to fully agree with each other's "
    "perspectives, as our objective is to find the correct answer."
)


def mad(rounds: int = 3, *, temperature: float = 0.0) -> ProtocolSpec:
    """Liang et al. (EMNLP 2024): an affirmative and a negative debater, each in its own continuing
    conversation, answering the other's latest argument ("You disagree with my answer", then "Do
    you agree with my perspective?"); a moderator that ends the debate once it prefers a side; a
    two-step judge (list the candidate answers, then pick one). Greedy, as the authors ran it."""
    moderator = _round_reviewer(
        "moderator",
        "Moderator",
        "You are a moderator. There will be two debaters involved in a debate. They will present their answers and "
        "discuss their perspectives. At the end of each round, you will evaluate answers and decide which is correct: "
        "say whether there is a clear preference for an answer candidate (preference), the side you support, your "
        "reason and the answer (debate_answer).",
        "mad-moderation",
        label="Debate topic",
        shown="",
        ask="The round of debate for both sides has ended. Your evaluation",
    )
    debaters = Visibility(who="others", window=None, same_round=True, only=["affirmative", "negative"],
                          history="conversation")  # fmt: skip
    return ProtocolSpec(
        name="mad",
        description="Liang et al.: affirmative vs negative, a moderator that can end early, a two-step judge.",
        participants=[
            Participant(
                id="affirmative",
                persona=Persona(name="Affirmative", role="affirmative", instructions=MAD_DEBATER),
                prompts=Prompts(
                    opening="The debate topic: {question}\n\nContext:\n{context}\n\nGive your answer and your reasons.",
                    rebuttal="{history}\n\nDo you agree with my perspective? Please provide your reasons and answer.",
                ),
            ),
            Participant(
                id="negative",
                persona=Persona(name="Negative", role="negative", instructions=MAD_DEBATER),
                prompts=Prompts(
                    opening="The debate topic: {question}\n\nContext:\n{context}\n\nGive your answer and your reasons.",
                    joining="The debate topic: {question}\n\nContext:\n{context}\n\n{history}\n\nYou disagree "
                    "with my answer. Provide your answer and reasons.",
                    rebuttal="{history}\n\nDo you agree with my perspective? Please provide your reasons and answer.",
                ),
            ),
            moderator,
        ],
        rounds=rounds,
        stages=[Stage(speakers=["affirmative", "negative"], order="sequential"), Stage(speakers=["moderator"])],
        visibility=debaters,
        history_style="lines",
        temperature=temperature,
        stop=ModeratorVerdict("moderator", "preference"),
        decision=JudgeDecision(
            schema="verdict",
            extract_candidates=True,
            persona=Persona(
                name="Judge",
                role="judge",
                instructions="You are a moderator. There will be two debaters involved in a debate. They will "
                "present their answers and discuss their perspectives. You will evaluate the answers and decide "
                "which is correct.",
            ),
            prompt="Debate topic: {question}\n\nThe debate:\n{transcript}\n\nCandidate answers:\n{candidates}\n\n"
            "Therefore, {question}\nPlease summarize your reasons and give the final answer that you think is "
            "correct, as JSON.",
        ),
        budget=Budget(max_tokens_per_turn=400),
    )


#: ChatEval's referee personas (Chan et al., ICLR 2024, Table 1), their task turned from grading
#: two assistants' answers to answering the question.
CHATEVAL_PERSONAS = [
    (
        "public",
        "General Public",
        "You are now General Public, one of the referees in this task. You are interested in the question and "
        "look at it as a member of the general public. Please think critically by yourself and note that it's "
        "your responsibility to choose the answer you find best.",
    ),
    (
        "critic",
        "Critic",
        "You are now Critic, one of the referees in this task. Your job is to question the others' judgement to "
        "make sure it is well-considered, and to offer an alternative answer when theirs is not convincing.",
    ),
    (
        "scientist",
        "Scientist",
        "You are now Scientist, one of the referees in this task. You are a professional engaged in systematic "
        "study who possesses a strong background in the scientific method, critical thinking, and "
        "problem-solving abilities. Please help the other people determine which answer is the right one.",
    ),
]
CHATEVAL_OPENING = (
    "[Question]\n{question}\n\n[Context]\n{context}\n\n[System]\nThere are a few other referees assigned the "
    "same task; it's your responsibility to discuss with them and think critically before you make your final "
    "judgement.\n\nNow it's your time to talk, please make your talk short and clear, {name}! Give your answer "
    "with brief reasoning and your confidence from 0 to 1, as JSON."
)
CHATEVAL_JOINING = (
    "[Question]\n{question}\n\n[Context]\n{context}\n\n[System]\nThere are a few other referees assigned the "
    "same task; it's your responsibility to discuss with them and think critically before you make your final "
    "judgement.\n\n{history}\n\nNow it's your time to talk, please make your talk short and clear, {name}! Give "
    "your answer with brief reasoning and your confidence from 0 to 1, as JSON."
)
CHATEVAL_FOLLOWUP = (
    "{history}\n\nNow it's your time to talk, please make your talk short and clear, {name}! Remember that you "
    "are not required to give the same answer as the other referees. Give your answer with brief reasoning and "
    "your confidence from 0 to 1, as JSON."
)


def chateval(
    mode: Literal["one-by-one", "simultaneous", "summarizer"] = "one-by-one",
    rounds: int = 2,
    *,
    temperature: float = 0.0,
    exchange: Exchange = "full",
) -> ProtocolSpec:
    """ChatEval (Chan et al., ICLR 2024): persona referees discuss, each in its own chat that holds
    its earlier turns and everything the others said since (their whole utterances, by name);
    majority vote of their last answers. Three communication strategies:

    - ``one-by-one`` (the paper's default): agents speak in turn and see what was said before them;
    - ``simultaneous``: all speak at once each round and see the previous rounds;
    - ``summarizer``: as simultaneous, and a summarizer condenses each round; its summary is added
      to what the agents see (the authors' code appends it to the agents' memory).
    """
    agents = [
        Participant(id=pid, persona=Persona(name=name, role=pid, instructions=text))
        for pid, name, text in CHATEVAL_PERSONAS
    ]
    spec = ProtocolSpec(
        name=f"chateval-{mode}" if mode != "one-by-one" else "chateval",
        description=f"ChatEval, {mode} mode: persona referees in a shared discussion, typed answers, majority vote.",
        participants=agents,
        rounds=rounds,
        order="sequential" if mode == "one-by-one" else "simultaneous",
        visibility=Visibility(who="others", window=None, same_round=mode == "one-by-one", history="conversation"),
        turn=answer_turn(None if exchange == "full" else exchange, wording="brief", confidence=True),
        prompts=Prompts(opening=CHATEVAL_OPENING, joining=CHATEVAL_JOINING, rebuttal=CHATEVAL_FOLLOWUP),
        history_style="named",
        temperature=temperature,
        decision=VoteDecision(speakers=[p.id for p in agents]),
    )
    if mode == "summarizer":
        summarizer = _round_reviewer(
            "summarizer",
            "Summarizer",
            "You summarise a discussion round: each position, its reasons, and where they disagree.",
            "summary",
            label="Question",
            shown="summary",
            ask="Your summary",
        )
        spec = spec.model_copy(
            update={
                "participants": [*agents, summarizer],
                "stages": [
                    Stage(speakers=[p.id for p in agents], order="simultaneous"),
                    Stage(speakers=["summarizer"]),
                ],
            }
        )
    return spec


# ------------------------------------------------------------------- protocols that beat the vote


def cisc(k: int = 8, *, temperature: float = 0.7, softmax_t: float = 0.2, max_tokens: int = 400) -> ProtocolSpec:
    """Confidence-informed self-consistency (Taubenfeld et al., ACL Findings 2025): k samples as in
    ``vote``, each followed by a one-token self-check whose P(True) weighs it: the answer with the
    largest sum of softmax(P(True) / T) wins. 2k calls (each check is one token, mostly read from the
    prompt cache). Fit T per model on held-out items (``moot eval report`` does, never on the items
    it scores); 0.2 is the authors' value for a 2B model."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "cisc",
            "description": f"CISC: {k} samples weighted by their self-checked P(True) (softmax T={softmax_t:g}).",
            "probe": Probe(self_check=True),
            "decision": VoteDecision(signal="p_true", softmax_temperature=softmax_t),
        }
    )


def adaptive_debate(
    agents: int = 3,
    rounds: int = 2,
    *,
    threshold: float = 1.0,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Debate only when it matters: round 1 is ``agents`` independent answers (a vote); if at least
    ``threshold`` of them agree the vote decides there, otherwise the agents debate (as Society of
    Minds) up to ``rounds``. The same spec as Society of Minds plus one composable stop condition."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                           wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "adaptive-debate",
            "description": f"{agents} independent answers; a Society of Minds debate follows only when fewer "
            f"than {threshold:.0%} of them agree.",
            "stop": Consensus(threshold),
        }
    )


def mad_conformist(
    agents: int = 3,
    rounds: int = 2,
    *,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Choi et al.'s MAD-Conformist: a debate that protects the majority. After round 1 an agent that
    holds the majority answer keeps it (no call); only the others are asked to reconsider, as in
    Society of Minds (the others' whole replies, in their own conversation)."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                           wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "mad-conformist",
            "description": "Society of Minds where agents holding the majority keep it; only the others reconsider.",
            "reconsider": "minority",
        }
    )


#: Free-MAD's anti-conformity instruction for the debate round, in substance (the authors' code is
#: not public; this follows a reconstruction of the paper's prompt): analyse the others' reasoning
#: for concrete errors, check your own, and keep your conclusion unless shown it is wrong.
ANTI_CONFORMITY_REBUTTAL = (
    "These are the solutions to the problem from other agents:\n\n{history}\n\n"
    "Some agents may give incorrect answers, so reason as follows. 1. Restate the steps and conclusion of your "
    "own solution. 2. Analyse the other agents' reasoning: say which is correct and which is flawed, naming "
    "concrete errors; the correct answer may not be among them. 3. Check whether you made a similar mistake. "
    "4. Decide whether to revise your conclusion: revise only for a concrete error you can name; if you cannot "
    "show that the others are right, keep your own conclusion. You may not rely on conformity: what the majority "
    "says is not a reason. Give your answer with brief reasoning and your confidence from 0 to 1, as JSON."
)

#: Free-MAD's trajectory score (Algorithm 1 as reconstructed: W = [20, 25, 30, 20], f(k) = 1/(k+1)).
FREE_MAD_WEIGHTS = {"initial": 20.0, "abandon": 25.0, "switch": 30.0, "keep": 20.0, "decay": True}


def free_mad(
    agents: int = 3,
    rounds: int = 2,
    *,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Free-MAD (Cui et al. 2025): one debate round after the first answers, in which each agent,
    in its own conversation, reads the others' whole replies under an anti-conformity instruction;
    the decision scores the whole trajectory of answers (the ``trajectory`` rule with the paper's
    weights and decay), not the last round's majority. ``wording`` and ``confidence`` as in
    :func:`society_of_minds` (the anti-conformity steps are the same in both wordings)."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                            wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    rebuttal = ANTI_CONFORMITY_REBUTTAL
    if wording == "du":
        rebuttal = rebuttal.replace(
            "Give your answer with brief reasoning and your confidence from 0 to 1, as JSON.", _du_reply(confidence)
        )
    elif not confidence:
        rebuttal = without_confidence(rebuttal)
    return spec.model_copy(
        update={
            "name": "free-mad",
            "description": "Free-MAD: an anti-conformity debate round, decided on the whole trajectory of answers.",
            "prompts": Prompts(opening=spec.prompts.opening, rebuttal=rebuttal),
            "decision": RuleDecision(name="trajectory", params=dict(FREE_MAD_WEIGHTS)),
        }
    )


# ------------------------------------------------------------ the report's rules, as protocols
#
# Each is the rule ``moot eval report`` derives from a pool of samples, made runnable: the same
# samples (agent s samples with seed s, as sample s of a vote), the same decision, so on a pool the
# protocol decides exactly what the report derived.

Signal = Literal["answer_prob", "seq_prob", "p_true", "stated"]


def adaptive_consistency(
    k: int = 8, *, threshold: float = 0.95, temperature: float = 0.7, max_tokens: int = 400
) -> ProtocolSpec:
    """Adaptive-Consistency (Aggarwal et al., EMNLP 2023): one sample a round, until the Beta rule
    says the leading answer is the mode with probability ``threshold`` (``settled``), at most k;
    the vote counts every sample. Between 2 and k calls (the rule cannot settle on one sample
    below a threshold of 0.75)."""
    return ProtocolSpec(
        name="adaptive-consistency",
        description=f"Adaptive-Consistency: samples one at a time until the plurality is settled (P >= {threshold:g}), "
        f"at most {k}.",
        participants=_agents(k, temperature=temperature),
        rounds=k,
        round_robin=True,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording="brief", confidence=True),
        prompts=ANSWER_PROMPTS,
        stop=Settled(threshold),
        decision=VoteDecision(rounds="all"),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def weighted_vote(
    k: int = 8, *, signal: Signal = "answer_prob", softmax_t: float = 0.2, temperature: float = 0.7,
    max_tokens: int = 400,
) -> ProtocolSpec:  # fmt: skip
    """k samples, each answer weighted by softmax(confidence / T) over the question's samples: the
    answer tokens' own probability (``answer_prob``), the whole reply's (``seq_prob``) or the stated
    confidence (``stated``). T = 0.2 is CISC's authors' value; ``moot tune`` fits it on your items.
    Needs a model that returns log-probabilities (except ``stated``)."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "weighted-vote",
            "description": f"{k} samples, a vote weighted by softmax({signal} / {softmax_t:g}).",
            "probe": Probe() if signal != "stated" else None,
            "decision": VoteDecision(signal=signal, softmax_temperature=softmax_t),
        }
    )


def filtered_vote(
    k: int = 8, *, keep: float = 0.5, signal: Signal = "seq_prob", temperature: float = 0.7, max_tokens: int = 400
) -> ProtocolSpec:
    """Confidence-filtered voting (DeepConf, ICLR 2026, on short answers): k samples; only the most
    confident ``keep`` share of them (by the whole reply's probability, default) votes. DeepConf
    keeps 10% or 90% of hundreds of long traces; at 8 samples 0.5 keeps 4. Needs log-probabilities
    (except ``stated``)."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "filtered-vote",
            "description": f"{k} samples; the most confident {keep:.0%} by {signal} vote.",
            "probe": Probe() if signal != "stated" else None,
            "decision": VoteDecision(keep=keep, filter_signal=signal),
        }
    )
