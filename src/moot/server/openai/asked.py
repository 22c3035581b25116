"""What one OpenAI request asks of its debate and of the reply (:class:`Asked`): the protocol as the
request changes it, and the reply a finished debate gives it (:class:`Reply`), cut at the request's
token bound and stop sequences (:class:`StopCut`, as it streams)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from moot.core.answers import answer_of
from moot.core.decision_step import DECISION_FAILED
from moot.core.spec import (
    JudgeDecision,
    ProtocolSpec,
    RuleDecision,
    SelectDecision,
    SpecError,
    SynthesizeDecision,
    VoteDecision,
)
from moot.core.tools import Tool, ToolCall, action_schema, decided_call, with_tools
from moot.core.types import ContextChunk, DebateResult
from moot.models.base import approx_tokens, trim_to_tokens
from moot.models.images import ImageInput
from moot.server.limits import SEED_RANGE
from moot.server.openai.conversation import (
    instructed,
)
from moot.server.openai.refusals import FieldRefusal, refuse_unless
from moot.server.openai.reply_format import (
    ACTION_SCHEMA,
    REPLY_SCHEMA,
    JsonFormat,
    schema_model,
    typed_decision,
)
from moot.server.schemas import DebateOptions

#: At most this many stop sequences, as OpenAI's API allows.
MAX_STOPS = 4


# ------------------------------------------------------------------------------- what is asked


@dataclass
class Asked:
    """What one request asks of its debate and of the reply: the one object its wire shape is read
    into, once (:func:`~moot.server.openai.fields.chat_asked`,
    :func:`~moot.server.openai.responses_request.responses_asked`), which its debate is prepared
    from (:func:`~moot.server.openai.submission.prepared_debate`) and its reply made by."""

    #: The protocol the model name names (a preset's name, or the tuned protocol's spec).
    protocol: str | dict[str, Any] = ""
    #: The question (the last user message of substance) and its context as the debate reads them: the
    #: caller's instructions taken out, a bare nudge moved after the question's context
    #: (:func:`~moot.server.openai.submission.conversation`, when the request is read).
    question: str = ""
    context: list[ContextChunk] = field(default_factory=list)
    #: The images the user messages show, in order: shown with the question to every agent.
    images: list[ImageInput] = field(default_factory=list)
    #: moot's own options (the ``moot`` body field).
    options: DebateOptions = field(default_factory=DebateOptions)

    #: The bound on the reply's tokens, and the field that gave it.
    max_tokens: int | None = None
    max_tokens_field: str = "max_tokens"
    temperature: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json: JsonFormat | None = None
    #: Stream (and return) the debate's turns as reasoning.
    trace: bool = False
    #: The request's own schemas its debate's spec names, by name (:data:`REPLY_SCHEMA`,
    #: :data:`ACTION_SCHEMA`): given to its engine as values
    #: (:func:`~moot.server.openai.submission.prepared_debate`), never registered.
    schemas: dict[str, type[BaseModel]] = field(default_factory=dict)
    #: The schemas this request's debate will use, built by :meth:`compile` (off the event loop).
    reply_model: type[BaseModel] | None = None
    action_model: type[BaseModel] | None = None
    #: Whether the decision's own call carries the token bound (a synthesis, a typed reply): its reply
    #: is then never trimmed again here (the engine trims by the model's own token count).
    bound_by_call: bool = False
    #: Whether the caller's token bound is the one the decision's call stops at (not its own, lower).
    caller_binds: bool = False
    #: Whether the oldest messages are left out of a conversation that does not fit the prompt budget
    #: (the Responses API's ``truncation: auto``, moot's default), else refused (``disabled``).
    truncate: bool = True
    recorded: dict[str, Any] = field(default_factory=dict)
    #: The request's function tools: each agent proposes a call or an answer, the debate votes.
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "auto"
    #: The typed field a decision that picks one of the agents' answers (a vote, a selection, a
    #: rule) reads: the reply is then the agent's own (:func:`picked_reply`), not the bare field.
    picked_field: str | None = None
    #: The caller's own instructions (its system and developer messages, ``instructions``): appended
    #: to each debater's instructions, and to a synthesis' or judge's (:meth:`adjust`).
    instructions: str = ""
    #: The reply worked out for a result, with that result (:meth:`reply`).
    _replied: tuple[DebateResult, Reply] | None = field(default=None, init=False, repr=False, compare=False)

    def compile(self) -> Asked:
        """Build the schemas the debate will use (the tools' action union, the reply's model): the
        costly part of a request with tools or a schema, done once, before :meth:`adjust`."""
        if self.tools and self.action_model is None:
            self.compile_actions()
        if self.json is not None and self.json.checked is not None and self.reply_model is None:
            self.reply_model = schema_model(self.json.name, self.json.checked)
        return self

    def compile_actions(self) -> None:
        """The agents' action union: a call of one of the tools, or the answer (typed to the
        caller's schema when one is asked for: the answer the vote picks is then the typed reply)."""
        answer = None
        if self.json is not None:
            answer = Tool(name="answer", description=self.json.description or "", parameters=self.json.schema)
        try:
            self.action_model = action_schema(self.tools, self.tool_choice, answer)
        except SpecError as exc:
            # (its message names its field already: tools, or tool_choice)
            said = str(exc)
            field = "tool_choice" if said.startswith("tool_choice:") else "tools"
            raise FieldRefusal(said if said.startswith(f"{field}:") else f"tools: {said}", field) from None

    def bind(self, spec: ProtocolSpec) -> Asked:
        """Say whether the decision's own call carries the token bound, and which field a decision
        that picks an answer reads, for a debate of ``spec``: once, by :meth:`adjust`, on the spec it
        makes (the reply forms read what it said)."""
        decision = spec.decision
        self.bound_by_call = isinstance(decision, SynthesizeDecision) or (
            isinstance(decision, JudgeDecision) and decision.answer_field is None
        )
        picks = isinstance(decision, VoteDecision | SelectDecision | RuleDecision)
        if isinstance(decision, RuleDecision):
            self.picked_field = str(decision.params.get("answer_field", "answer")) if picks else None
        else:
            self.picked_field = decision.answer_field if isinstance(decision, VoteDecision | SelectDecision) else None
        return self

    def adjust(self, spec: ProtocolSpec) -> ProtocolSpec:
        """The protocol as this request asks for it (before its engine is built)."""
        update: dict[str, Any] = {}
        participants = list(spec.participants)
        if self.temperature is not None:
            update["temperature"] = self.temperature
            participants = [p.model_copy(update={"temperature": self.temperature}) for p in participants]
        if self.seed is not None:
            span = SEED_RANGE[1] + 1
            participants = [p.model_copy(update={"seed": (self.seed + i) % span}) for i, p in enumerate(participants)]
        if self.instructions:
            participants = [
                p.model_copy(update={"persona": instructed(p.persona, self.instructions)}) for p in participants
            ]
            decision = spec.decision
            if isinstance(decision, SynthesizeDecision | JudgeDecision):
                update["decision"] = decision.model_copy(
                    update={"persona": instructed(decision.persona, self.instructions)}
                )
        update["participants"] = participants
        spec = spec.model_copy(update=update)
        # A vote's agents answer in the caller's schema (with tools or not): the vote picks a typed answer.
        typed_vote = self.json is not None and isinstance(spec.decision, VoteDecision)
        if self.tools and self.json is not None and not typed_vote:
            # A synthesis or a judge writes the typed answer when the agents' action vote is to answer.
            spec = self.typed(spec)
        if self.tools or typed_vote:
            if self.action_model is None:
                self.compile_actions()
            assert self.action_model is not None
            self.schemas[ACTION_SCHEMA] = self.action_model
            try:
                # Every earlier message (the tool calls and their results) is in every agent's context.
                spec = with_tools(spec, self.tools, self.tool_choice, schema=ACTION_SCHEMA)
                spec = spec.model_copy(update={"max_context_chunks": None})
            except SpecError as exc:
                field_name = "tools" if self.tools else (self.json.where if self.json else "tools")
                raise FieldRefusal(f"{field_name}: {exc}", field_name) from None
        elif self.json is not None:
            spec = self.typed(spec)
        decision = spec.decision
        # The reply is the decision call's own text when it synthesizes or is typed to the client's schema.
        if self.bind(spec).bound_by_call and self.max_tokens is not None:
            assert isinstance(decision, SynthesizeDecision | JudgeDecision)
            self.caller_binds = self.max_tokens <= decision.max_tokens
            spec = spec.model_copy(
                update={
                    "decision": decision.model_copy(update={"max_tokens": min(decision.max_tokens, self.max_tokens)})
                }
            )
        return spec

    def typed(self, spec: ProtocolSpec) -> ProtocolSpec:
        """``spec`` whose decision writes the reply in the caller's schema (:func:`typed_decision`)."""
        assert self.json is not None
        self.compile()
        assert self.reply_model is not None
        self.schemas[REPLY_SCHEMA] = self.reply_model
        return typed_decision(spec, self.json, REPLY_SCHEMA)

    # ---------------------------------------------------------------------------------- reply

    def cut(self, text: str) -> tuple[str, bool]:
        """``text`` up to its first stop sequence (OpenAI leaves the sequence out), and whether one was found."""
        found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return (text[: min(found)], True) if found else (text, False)

    def reply(self, result: DebateResult) -> Reply:
        """The reply a finished debate gives: its text and finish reason (``length``: cut at a token
        bound, the client's or the decision's own), or the tool call it decided on (a request with
        tools; finish reason ``tool_calls``), as a value both APIs' forms are written from. Worked
        out once for a result (a stored response's stream and its final form read the same one)."""
        if self._replied is not None and self._replied[0] is result:
            return self._replied[1]
        reply = self._reply(result)
        self._replied = (result, reply)
        return reply

    def cut_at_bound(self, result: DebateResult) -> str | None:
        """The decision's own text when the caller's token bound cut it before it was whole (its
        typed reply then fails to parse, and the debate fails): a reply all the same, as OpenAI's
        API gives a cut structured output, with finish reason ``length``. None otherwise: another
        call cut (a judge's list of candidates), or a bound of the protocol's own."""
        if not self.bound_by_call or not self.caller_binds or result.status != "failed" or self.tools:
            return None
        if not (result.error or "").startswith(DECISION_FAILED):
            return None
        last = result.decision_turns[-1] if result.decision_turns else None
        if last is None or last.finish_reason != "length" or not last.raw:
            return None
        return last.raw

    def _reply(self, result: DebateResult) -> Reply:
        call = decided_call(result) if self.tools else None
        if call is not None:
            return Reply("", "tool_calls", call)
        if (cut := self.cut_at_bound(result)) is not None:
            text, stopped = self.cut(cut)
            return Reply(text, "stop" if stopped else "length")
        text = result.final_answer or ""
        if self.picked_field is not None and not self.tools and self.json is None:
            text = picked_reply(result, self.picked_field, self.instructions)
        finish = "stop"
        last = result.decision_turns[-1] if result.decision_turns else None
        if self.bound_by_call and last is not None and (last.finish_reason == "length" or last.trimmed):
            finish = "length"
        if self.max_tokens is not None and not self.bound_by_call and approx_tokens(text) > self.max_tokens:
            text, finish = trim_to_tokens(text, self.max_tokens), "length"
        text, stopped = self.cut(text)
        return Reply(text, "stop" if stopped else finish)


@dataclass(frozen=True)
class Reply:
    """What a finished debate answers one request: its text and finish reason, or the tool call it
    decided on (then no text): one value, from which the chat completion's ``tool_calls`` and the
    response's ``function_call`` item are written."""

    text: str
    finish: str
    call: ToolCall | None = None


#: A form the caller's prompt asks the answer in: ``ANSWER: $LETTER`` (Inspect's multiple choice),
#: ``'Final Answer: $ANSWER'``: a label, a colon, a ``$PLACEHOLDER``; the label is one word, or up to
#: three when they start a quote or a line.
_ANSWER_FORM = re.compile(r"(?<![\w$])([A-Za-z]\w*):[ \t]*\$[A-Z][A-Z_]*\b")
_LABEL_LEAD = re.compile(r"(?:^|[\n'\"`])((?:[A-Za-z]\w* ){1,2})$")


def answer_form(result: DebateResult, instructions: str = "") -> str | None:
    """The label the caller asks the answer under (``ANSWER``), read from the question, else from
    its instructions (the last form asked wins), or None."""
    for text in [result.task.question, instructions]:
        found = list(_ANSWER_FORM.finditer(text))
        if found:
            last = found[-1]
            lead = _LABEL_LEAD.search(text[: last.start()])
            return (lead.group(1) if lead else "") + last.group(1)
    return None


def picked_reply(result: DebateResult, field: str, instructions: str = "") -> str:
    """The reply of a debate decided by picking an agent's answer (a vote, a selection, a rule): the
    own reply of an agent that gave the winning answer (its reasoning, then its answer in its own
    words, not the normalised field the vote compared), the answer on its last line in the form the
    caller's prompt asks for (``ANSWER: B`` when it asks ``ANSWER: $LETTER``). The final answer alone
    when no agent's turn gave it."""
    answer = result.final_answer or ""
    chosen = (result.decision or {}).get("speaker")
    turns = [t for rnd in reversed(result.rounds) for t in rnd.turns if answer_of(t, field) == answer]
    turns.sort(key=lambda t: t.speaker != chosen)  # the selected agent's first (stable: else the last round's)
    if not turns or turns[0].parsed is None:
        return answer
    parsed = turns[0].parsed
    own = parsed.get(field)
    line = (own if isinstance(own, str) else json.dumps(own, ensure_ascii=False)).strip() or answer
    label = answer_form(result, instructions)
    if label is not None and not re.match(rf"\s*{re.escape(label)}\s*:", line, re.IGNORECASE):
        line = f"{label}: {line}"
    reasoning = parsed.get("reasoning")
    return f"{reasoning.strip()}\n\n{line}" if isinstance(reasoning, str) and reasoning.strip() else line


def stops(value: str | list[str] | None, where: str = "stop") -> tuple[str, ...]:
    """The stop sequences of a request (at most 4, none empty), as OpenAI's API takes them."""
    if value is None:
        return ()
    given = [value] if isinstance(value, str) else list(value)
    refuse_unless(where, len(given) <= MAX_STOPS, f"at most {MAX_STOPS} stop sequences; give fewer")
    refuse_unless(where, all(given), "a stop sequence cannot be empty")
    return tuple(given)


class StopCut:
    """Stop sequences over a reply that streams piece by piece: the text before the first one, sent
    as soon as it cannot be the start of one (what might be is held until the next piece)."""

    def __init__(self, sequences: tuple[str, ...]) -> None:
        self.sequences = sequences
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self.sequences:
            return piece
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.sequences) if i >= 0]
        if found:
            self.stopped, self.held = True, ""
            return text[: min(found)]
        hold = 0
        for s in self.sequences:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:n]):
                    hold = n
                    break
        self.held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]
