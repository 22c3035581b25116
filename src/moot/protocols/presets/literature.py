"""The literature's debates: Du et al.'s society of minds, MAD (Liang et al.), ChatEval (Chan et al.)."""

from __future__ import annotations

from typing import Literal

from moot.core.spec import (
    Budget,
    Decision,
    JudgeDecision,
    Participant,
    Prompts,
    ProtocolSpec,
    SelectDecision,
    Stage,
    Visibility,
    VoteDecision,
)
from moot.core.stop import ModeratorVerdict
from moot.core.types import Persona
from moot.protocols.presets.seeds import (
    _round_reviewer,
)
from moot.protocols.presets.shared import (
    ANSWER_REBUTTAL,
    DU_GSM_REBUTTAL,
    DU_TOGETHER,
    Wording,
    _agents,
    _du_reply,
    _models,
    answer_prompts,
    answer_turn,
    without_confidence,
)

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
