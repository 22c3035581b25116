"""The protocol spec: a debate format as data. One engine runs any spec.

A spec says who takes part (participants: persona + optional model), who speaks when (order),
who sees what (visibility), what a turn is (free text or a registered schema), how the debate
ends (rounds, budget) and how it is decided (decision). A new format is a new spec, not a new
round loop.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator, model_validator

import moot.core.schemas  # noqa: F401  (registers the built-in schemas)
from moot.core.decision_spec import JUDGE_SELECT_PROMPT as JUDGE_SELECT_PROMPT
from moot.core.decision_spec import USC_PROMPT as USC_PROMPT
from moot.core.decision_spec import ActionVote as ActionVote
from moot.core.decision_spec import Decision as Decision
from moot.core.decision_spec import JudgeDecision as JudgeDecision
from moot.core.decision_spec import NoDecision as NoDecision
from moot.core.decision_spec import RuleDecision as RuleDecision
from moot.core.decision_spec import SelectDecision as SelectDecision
from moot.core.decision_spec import SynthesizeDecision as SynthesizeDecision
from moot.core.decision_spec import VoteDecision as VoteDecision
from moot.core.decision_spec import _LLMDecision
from moot.core.decision_spec import decision_noun as decision_noun
from moot.core.spec_base import CITE as CITE
from moot.core.spec_base import DECISION_FIELDS as DECISION_FIELDS
from moot.core.spec_base import MAX_PARTICIPANTS as MAX_PARTICIPANTS
from moot.core.spec_base import PLACEHOLDER as PLACEHOLDER
from moot.core.spec_base import TURN_FIELDS as TURN_FIELDS
from moot.core.spec_base import RoutingError as RoutingError
from moot.core.spec_base import SpecError as SpecError
from moot.core.spec_base import check_participant_count
from moot.core.spec_base import check_template as check_template
from moot.core.spec_base import render as render
from moot.core.stop import StopCondition, coerce_stop
from moot.core.types import Persona
from moot.secrets import redact


class Participant(BaseModel):
    """An agent in the debate: a persona bound to a model (None: the debate's default model).

    ``turn``, ``prompts``, ``visibility`` and ``max_tokens`` override the spec's defaults for this
    participant only (a moderator answers in its own schema, sees the current round, ...).
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_\-]+$")
    persona: Persona
    model: str | None = None
    #: (A NaN or an infinity is refused: JSON has neither, and a backend would be sent null.)
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    #: Sampling seed of this participant's calls (distinct seeds make independent samples).
    seed: int | None = None
    turn: TurnFormat | None = None
    prompts: Prompts | None = None
    visibility: Visibility | None = None
    max_tokens: int | None = Field(default=None, ge=1)

    @field_validator("id")
    @classmethod
    def _not_key_shaped(cls, value: str) -> str:
        # Everything moot stores or serves is redacted of key-shaped text: such an id would turn into
        # *** in transcripts and events while its turns' token deltas kept it.
        if redact(value) != value:
            raise ValueError(
                f"participant id {value!r} has the shape of an API key (sk-...), which moot redacts from "
                "transcripts and events: give the participant another id"
            )
        return value


class Stage(BaseModel):
    """One step of a round: these participants speak, together or one after another.

    A round is its stages in order; a later stage can see what earlier ones said this round
    (``Visibility.same_round``). Without stages a round is one stage of every participant.
    """

    model_config = ConfigDict(extra="forbid")

    speakers: list[str] = Field(min_length=1)
    order: Literal["simultaneous", "sequential"] | None = None


class Visibility(BaseModel):
    """Who sees what of the history when they speak.

    - ``who``: ``all`` (everyone's turns, own included), ``others`` (not own), ``self`` (only own),
      ``none`` (independent answers every round);
    - ``window``: how many past rounds are visible (1: only the previous one; 0: none; None: all);
    - ``same_round``: whether a speaker sees the turns already given in the current round (by
      earlier speakers of a sequential stage, or by earlier stages);
    - ``topology``: ``full`` (everyone), ``ring`` (the neighbours before and after in the
      participant list), ``star`` (the ``hub`` sees everyone, the others only the hub);
    - ``only``: see only these speakers' turns (a summarizer's, say: ChatEval's summary mode);
    - ``history``: how the seen turns reach the speaker. ``prompt``: rendered into one user message
      (``{history}`` of the rebuttal template), the speaker's own earlier turns only as that text;
      ``conversation``: a multi-turn chat, as the papers' code keeps one per agent (Du et al.'s
      ``agent_contexts``): the speaker's previous request and its own reply as an assistant
      message, then one user message (the rebuttal template) with what it now sees of the others.
      Its own turns are then never repeated in ``{history}``.
    """

    model_config = ConfigDict(extra="forbid")

    who: Literal["all", "others", "self", "none"] = "all"
    window: int | None = Field(default=1, ge=0)
    same_round: bool = False
    topology: Literal["full", "ring", "star"] = "full"
    hub: str | None = None
    only: list[str] | None = None
    history: Literal["prompt", "conversation"] = "prompt"


class TurnFormat(BaseModel):
    """Free text, or a typed reply following a registered schema (see ``moot.structured``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_name: str | None = Field(default=None, alias="schema")
    #: What the others (and the decision) see of a typed turn: one schema field's value (``answer``:
    #: the answer only, an answer-herding exchange; ``reasoning``: the argument without its
    #: conclusion), or None: the whole reply, reasoning and answer, as the papers' debates share it.
    show_field: str | None = None
    #: A registered view (``moot.structured.register_view``) that renders the whole typed turn
    #: for the others, e.g. seed 002's ``- agent: op target=... value=...`` edit lines.
    view: str | None = None


class Prompts(BaseModel):
    """Templates of the user message of a turn. The system message is the persona's prompt."""

    model_config = ConfigDict(extra="forbid")

    opening: str = "Question: {question}\n\nContext:\n{context}\n\nGive your answer."
    rebuttal: str = (
        "Question: {question}\n\nContext:\n{context}\n\nThe debate so far:\n{history}\n\nGive your improved answer."
    )
    #: With ``visibility.history: conversation``, the first message of an agent whose conversation
    #: starts after others have spoken (a later speaker of a sequential first round): the question
    #: and ``{history}``. None: the opening, then the rebuttal.
    joining: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Prompts:
        check_template(self.opening, TURN_FIELDS, "prompts.opening")
        check_template(self.rebuttal, TURN_FIELDS, "prompts.rebuttal")
        if self.joining is not None:
            check_template(self.joining, TURN_FIELDS, "prompts.joining")
        return self


class Probe(BaseModel):
    """Confidence read from token log-probabilities for every typed turn (``moot.core.probes``):
    ``answer_prob`` from the reply's own log-probabilities (no extra call), and with ``self_check``
    CISC's P(True), one more call per turn that continues the reply. The signals are recorded in
    each turn's ``signals``; backends that return no log-probabilities leave them absent."""

    model_config = ConfigDict(extra="forbid")

    answer_prob: bool = True
    self_check: bool = False
    top_logprobs: int = Field(default=10, ge=1, le=20)
    answer_field: str = "answer"


class Budget(BaseModel):
    """Limits that are enforced, not just measured: ``max_calls`` before each round (a round, and the
    decision, that would pass it is not started); ``max_total_tokens`` before each round too (a round
    starts while the debate's tokens are below it; its calls then run to their turn limit, so the
    total may pass it by up to a round and a decision, said in the result's warnings);
    ``max_tokens_per_turn`` and ``max_prompt_tokens`` on every call; ``timeout_s`` on the whole."""

    model_config = ConfigDict(extra="forbid")

    max_tokens_per_turn: int = Field(default=500, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    #: The most prompt tokens a turn may send (None: the model's context window, when it has one).
    #: A history that would not fit loses its oldest exchanges first, and the turn records how
    #: many messages or turns were left out (``Turn.history_trimmed``, and a warning).
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)


StopField = Annotated[
    StopCondition | None,
    BeforeValidator(coerce_stop),
    PlainSerializer(lambda c: c.expr() if c is not None else None, return_type=str | None),
]


class ProtocolSpec(BaseModel):
    """A debate format as data."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)

    name: str
    description: str = ""
    participants: list[Participant] = Field(min_length=1)
    #: The most rounds the debate may run (always enforced).
    rounds: int = Field(default=2, ge=1)
    #: What else ends the debate between rounds (``MaxRounds(2) | Consensus(0.8)``, or the same
    #: as a string); the result's ``stop_reason`` names the condition that fired.
    stop: StopField = None
    order: Literal["simultaneous", "sequential"] = "simultaneous"
    stages: list[Stage] | None = None
    #: Each round is one participant's turn, in order (round r: the r-th participant, cycling):
    #: one more sample a round, as sequential sampling does (Adaptive-Consistency: ``rounds`` is
    #: the cap, a ``settled(...)`` stop condition ends it, the vote counts every round).
    round_robin: bool = False
    visibility: Visibility = Field(default_factory=Visibility)
    turn: TurnFormat = Field(default_factory=TurnFormat)
    prompts: Prompts = Field(default_factory=Prompts)
    decision: Decision = Field(default_factory=SynthesizeDecision)
    budget: Budget = Field(default_factory=Budget)
    #: How many context passages the debaters get (the first N); None: all.
    max_context_chunks: int | None = Field(default=3, ge=1)
    #: Default sampling temperature of every turn (None: the backend's default; finite).
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    #: How earlier turns appear in ``{history}`` and ``{transcript}``: ``quoted`` blocks labelled
    #: in words, or ``lines``: each turn's shown text as it is, one after the other (for views
    #: that already name the speaker, such as seed 002's edit lines).
    #: ``solutions``: each turn as Du et al.'s code quotes it, anonymous ("One agent solution:
    #: ```...```"); ``named``: ``Name: text``, as ChatEval's code labels each utterance.
    history_style: Literal["quoted", "lines", "solutions", "named"] = "quoted"
    #: Who answers again after the first round: everyone, or only the agents that do not hold the
    #: previous round's majority answer (the others keep theirs without a call: Choi et al.'s
    #: MAD-Conformist). With no strict plurality everyone answers again.
    reconsider: Literal["all", "minority"] = "all"
    #: Confidence signals read from log-probabilities for typed turns (None: none).
    probe: Probe | None = None

    @field_validator("participants", mode="before")
    @classmethod
    def _not_too_many(cls, value: object) -> object:
        """The count checked before any participant is validated (a million would take minutes)."""
        if isinstance(value, list | tuple):
            check_participant_count(len(value), "the spec")
        return value

    @model_validator(mode="after")
    def _check(self) -> ProtocolSpec:
        ids = [p.id for p in self.participants]
        known = set(ids)
        dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
        if dupes:
            raise SpecError(f"participant ids must be unique; repeated: {', '.join(dupes)}")
        if isinstance(self.decision, JudgeDecision):
            _check_turn_format(TurnFormat(schema=self.decision.schema_name), "decision")
        for where, fmt in [("turn", self.turn)] + [
            (f"participants.{p.id}.turn", p.turn) for p in self.participants if p.turn is not None
        ]:
            _check_turn_format(fmt, where)
        for p in self.participants:
            vis = self.visibility_for(p)
            if vis.topology == "star" and vis.hub not in known:
                raise SpecError(f"participants.{p.id}: a star topology needs hub: one of {', '.join(ids)}")
            if vis.only and set(vis.only) - known:
                raise SpecError(
                    f"participants.{p.id}: visibility.only names unknown {', '.join(sorted(set(vis.only) - known))}"
                )
        speakers = getattr(self.decision, "speakers", None)
        if speakers is not None and set(speakers) - known:
            raise SpecError(
                f"decision.speakers: unknown participant(s) {', '.join(sorted(set(speakers) - known))}; "
                f"known: {', '.join(ids)}"
            )
        if isinstance(self.decision, VoteDecision):
            self._check_voters(self.decision)
        if self.stop is not None:
            self._check_stop_names(self.stop, known, ids)
        if self.round_robin and self.stages is not None:
            raise SpecError("round_robin gives each round to one participant in turn; it takes no stages")
        if self.stages is not None:
            named = [sid for st in self.stages for sid in st.speakers]
            unknown = sorted(set(named) - known)
            if unknown:
                raise SpecError(f"stages name unknown participant(s): {', '.join(unknown)}; known: {', '.join(ids)}")
            twice = sorted(sid for sid, n in Counter(named).items() if n > 1)
            if twice:
                raise SpecError(f"a participant may speak once per round; stages repeat: {', '.join(twice)}")
        return self

    def _check_stop_names(self, stop: StopCondition, known: set[str], ids: list[str]) -> None:
        """A stop condition that names a participant (a moderator's verdict) names one of this
        spec's, and a field its turn's schema has: one misspelt would never fire, and the debate
        would run to its last round without a word."""
        from moot.core.stop import AllOf, AnyOf, ModeratorVerdict
        from moot.structured import get_schema

        if isinstance(stop, AnyOf | AllOf):
            for part in stop.conditions:
                self._check_stop_names(part, known, ids)
            return
        if not isinstance(stop, ModeratorVerdict):
            return
        if stop.speaker not in known:
            raise SpecError(f"stop: {stop.expr()} names unknown participant {stop.speaker!r}; known: {', '.join(ids)}")
        p = next(p for p in self.participants if p.id == stop.speaker)
        name = self.turn_for(p).schema_name
        if name is None:
            raise SpecError(
                f"stop: {stop.expr()} reads {stop.speaker}'s typed {stop.field!r}, but its turns are free text: "
                "give it a turn schema with that field (turn: {schema: moderator-evaluation}, as moderated's has)"
            )
        try:
            fields = get_schema(name).model_fields
        except KeyError:
            return  # a schema given as a value (a request's own): checked when the engine has it
        if stop.field not in fields:
            raise SpecError(
                f"stop: {stop.expr()} reads {stop.field!r}, which {stop.speaker}'s turn schema {name!r} has not; "
                f"it has: {', '.join(fields)}"
            )

    def _check_voters(self, vote: VoteDecision) -> None:
        """A vote counts typed answers: some voter's turn must have a schema with its answer field
        (free-text turns never vote, and the debate would fail after all its calls)."""
        from moot.structured import get_schema

        field = vote.answer_field
        voters = [p for p in self.participants if vote.speakers is None or p.id in vote.speakers]
        for p in voters:
            name = self.turn_for(p).schema_name
            if name is not None and field in get_schema(name).model_fields:
                return
        raise SpecError(
            f"decision: a vote counts each voter's typed {field!r}, but no voter's turn has a schema with that "
            f"field (free text never votes): give the participants `turn: {{schema: answer}}`, or a schema of your "
            "own with it, or decide another way (synthesize, judge)"
        )

    def round_stages(self, round_index: int = 1) -> list[Stage]:
        """The stages of round ``round_index`` (one stage of everyone, in ``order``, if none are
        given; with ``round_robin``, the one participant whose turn it is)."""
        if self.round_robin:
            return [Stage(speakers=[self.participants[(round_index - 1) % len(self.participants)].id])]
        if self.stages is not None:
            return [st if st.order is not None else st.model_copy(update={"order": self.order}) for st in self.stages]
        return [Stage(speakers=[p.id for p in self.participants], order=self.order)]

    def speakers_per_round(self) -> int:
        return sum(len(st.speakers) for st in self.round_stages())

    def turn_for(self, p: Participant) -> TurnFormat:
        return p.turn or self.turn

    def prompts_for(self, p: Participant) -> Prompts:
        return p.prompts or self.prompts

    def visibility_for(self, p: Participant) -> Visibility:
        return p.visibility or self.visibility

    def max_tokens_for(self, p: Participant) -> int:
        return p.max_tokens or self.budget.max_tokens_per_turn

    def with_turn_tokens(self, n: int) -> ProtocolSpec:
        """This spec with every turn's token budget set to ``n``: the budget's, each participant's own,
        and an LLM decision's (a user's ``--max-tokens`` means each turn, the synthesis included)."""
        decision = self.decision
        if isinstance(decision, _LLMDecision):
            decision = decision.model_copy(update={"max_tokens": n})
        return self.model_copy(
            update={
                "budget": self.budget.model_copy(update={"max_tokens_per_turn": n}),
                "participants": [
                    p.model_copy(update={"max_tokens": n}) if p.max_tokens else p for p in self.participants
                ],
                "decision": decision,
            }
        )

    def stop_condition(self) -> StopCondition:
        """Everything that ends the debate between rounds, as one condition checked in this order
        (the first that fires names the ``stop_reason``): every turn of the last round failed, the
        round cap, the call budget (another round and the decision would not fit), the token
        budget, then the spec's own ``stop``. One mechanism: the limits are conditions like any."""
        from moot.core.stop import AllFailed, AnyOf, CallBudget, MaxRounds, TokenBudget

        conditions: list[StopCondition] = [AllFailed(), MaxRounds(self.rounds_to_run())]
        if self.budget.max_calls is not None:
            conditions.append(CallBudget(self.budget.max_calls))
        if self.budget.max_total_tokens is not None:
            conditions.append(TokenBudget(self.budget.max_total_tokens))
        if self.stop is not None:
            conditions.append(self.stop)
        return AnyOf(conditions)

    def participant(self, pid: str) -> Participant:
        for p in self.participants:
            if p.id == pid:
                return p
        raise KeyError(pid)

    @property
    def decision_calls(self) -> int:
        if isinstance(self.decision, SynthesizeDecision):
            return 1
        if isinstance(self.decision, JudgeDecision):
            return 2 if self.decision.extract_candidates else 1
        if isinstance(self.decision, SelectDecision):
            return 1
        return 0

    def planned_calls(self) -> int:
        """Model calls the debate makes when no turn needs a repair and nothing stops it early (a
        probe's self-check, CISC's P(True), is one more call per typed turn)."""
        per_turn = 2 if self.probe is not None and self.probe.self_check else 1
        return self.rounds_to_run() * self.speakers_per_round() * per_turn + self.decision_calls

    def planned_turns(self) -> int:
        """Turns the debate takes when nothing stops it early: the rounds' and the decision's (a
        self-check is a call, not a turn)."""
        return self.rounds_to_run() * self.speakers_per_round() + self.decision_calls

    def self_check_needed(self) -> bool:
        """Whether the decision cannot decide without the turns' self-checks: a vote weighed, or
        filtered, by their P(True). (Otherwise a self-check only uses the budget beyond the turns.)"""
        vote = self.decision
        if self.probe is None or not self.probe.self_check or not isinstance(vote, VoteDecision):
            return False
        return vote.signal == "p_true" or (vote.keep is not None and vote.filter_signal == "p_true")

    def round_calls(self) -> int:
        """The calls one round needs: a turn each, and each turn's self-check when the decision
        needs it (:meth:`self_check_needed`)."""
        return self.speakers_per_round() * (2 if self.self_check_needed() else 1)

    def unread_rounds(self) -> bool:
        """Whether the rounds before the last would be read by nothing: no participant sees an
        earlier round (visibility ``who: none`` or ``window: 0``), nobody keeps a previous answer,
        no stop condition reads answers, and the decision votes on the last round only. Then a
        round is all a debate can use (``vote`` with ``rounds: 3`` would pay for 3 rounds of
        samples and count 1)."""
        if self.rounds < 2 or self.reconsider != "all" or self.round_robin:
            return False
        if not isinstance(self.decision, VoteDecision) or self.decision.rounds != "last":
            return False
        if self.stop is not None and self.stop.reads_answers:
            return False
        return all((vis := self.visibility_for(p)).who == "none" or vis.window == 0 for p in self.participants)

    def rounds_to_run(self) -> int:
        """The rounds the engine runs at most: ``rounds``, or 1 when the earlier rounds would be
        read by nothing (:meth:`unread_rounds`)."""
        return 1 if self.unread_rounds() else self.rounds

    def unread_rounds_note(self) -> str:
        return (
            f"{self.name}: rounds is {self.rounds}, but no participant sees an earlier round and the decision "
            "votes on the last one only, so 1 round is run (the others would be paid for and never read); "
            "for more samples add participants, or let them see earlier rounds (visibility) or vote on every "
            "round (decision.rounds: all)"
        )

    def call_budget_problem(self) -> str | None:
        """Why ``budget.max_calls`` cannot fit one round and the decision (None if it can): a debate
        under it could only fail, without a call."""
        limit = self.budget.max_calls
        round_calls, decision = self.round_calls(), self.decision_calls
        if limit is None or limit >= round_calls + decision:
            return None
        calls = "call" if limit == 1 else "calls"
        return (
            f"the call budget of {limit} {calls} cannot fit one round ({round_calls} calls) plus the decision "
            f"({decision}): give at least {round_calls + decision}"
        )


def _check_turn_format(fmt: TurnFormat, where: str) -> None:
    if fmt.schema_name is None:
        return
    from moot.structured import get_schema

    try:
        schema = get_schema(fmt.schema_name)
    except KeyError as exc:
        raise SpecError(f"{where}: {exc.args[0]}") from None
    if fmt.show_field and fmt.show_field not in schema.model_fields:
        raise SpecError(f"{where}.show_field {fmt.show_field!r} is not a field of schema {fmt.schema_name!r}")
    if fmt.view is not None:
        from moot.structured import get_view

        try:
            get_view(fmt.view)
        except KeyError as exc:
            raise SpecError(f"{where}: {exc.args[0]}") from None


Participant.model_rebuild()
SelectDecision.model_rebuild()
