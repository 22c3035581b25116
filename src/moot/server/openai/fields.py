"""What the OpenAI-shaped endpoints (``/v1/chat/completions``, ``/v1/responses``) do with each
request field: a client gets the behaviour a field asks for, or a 400 that names the field, never
silence.

- **The model**: ``moot/<protocol>``; ``moot/<protocol>:trace`` also streams the debate's turns as
  reasoning (for chat UIs that cannot add a body field).
- **The reply** (:class:`Asked`): a token bound (``max_tokens``, ``max_completion_tokens``,
  ``max_output_tokens``) and stop sequences bound the decision's reply; a JSON schema
  (``response_format``, ``text.format``) types it.
- **Sampling**: ``temperature`` is every call's of the debate; ``seed`` seeds each agent
  (``seed + i``), so that the same request repeats its debate where the backend is deterministic.
- **Identifiers** (``metadata``, ``user``, ``safety_identifier``, ``prompt_cache_key``) are kept with
  the stored debate's request, as OpenAI keeps them; they change nothing in the answer.

Everything else a debate cannot do is refused by its own name (:func:`refuse_unless`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from jsonschema.exceptions import best_match
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from moot.core.answers import answer_of
from moot.core.spec import (
    JudgeDecision,
    ProtocolSpec,
    RuleDecision,
    SelectDecision,
    SpecError,
    SynthesizeDecision,
    VoteDecision,
    decision_noun,
)
from moot.core.tools import MAX_TOOLS, MAX_TOOLS_BYTES, Tool, ToolCall, action_schema, decided_call, with_tools
from moot.core.types import ContextChunk, DebateResult, Persona
from moot.core.user_schemas import SchemaProblem, UserSchema, check_user_schema, is_text
from moot.models.base import approx_tokens, trim_to_tokens
from moot.protocols import get_preset, get_preset_factory, preset_names
from moot.protocols.loader import load_protocol_data
from moot.server.limits import SEED_RANGE, RequestError
from moot.server.openai import input_files
from moot.server.policy import Prepared, build_spec, check_call_budget, prepare
from moot.server.schemas import ChatCompletionRequest, DebateOptions, ModelCard
from moot.server.settings import ServerSettings
from moot.server.state import idempotency
from moot.server.state.manager import DebateManager, LiveDebate
from moot.server.tuned import AUTO, TunedModel

PREFIX = "moot/"
#: The model-name variant that streams the debate's turns as reasoning.
TRACE = ":trace"
#: OpenAI's rule for a response format's name.
_FORMAT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: At most this many stop sequences, as OpenAI's API allows.
MAX_STOPS = 4


# ------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class DebateModel:
    """What a ``model`` field names: a protocol (a preset's name, or a tuned protocol's inline spec),
    and whether the debate's turns stream too."""

    protocol: str | dict[str, Any]
    trace: bool = False


def asks_trace(model: str) -> bool:
    """Whether a model name asks for the debate's turns (``moot/<protocol>:trace``)."""
    return model.startswith(PREFIX) and model.endswith(TRACE)


def tuned_names(tuned: TunedModel) -> tuple[str, ...]:
    """The names the tuned protocol answers to: ``auto``, and its label unless a built-in protocol has
    that name (``single``, ``vote@3``), which keeps naming the built-in: loading a tune never changes
    what an existing model name does, and no name is listed twice."""
    return (AUTO,) if tuned.label in preset_names() else (AUTO, tuned.label)


def debate_model(model: str, where: str = "model", tuned: TunedModel | None = None) -> DebateModel:
    """``moot/<protocol>`` or ``moot/<protocol>:trace`` (``moot/auto`` and ``moot/<label>``: the tuned
    protocol the server was started with), else a 404 listing what is offered."""
    name = model.removeprefix(PREFIX) if model.startswith(PREFIX) else None
    trace = asks_trace(model)
    if name is not None and trace:
        name = name.removesuffix(TRACE)
    if tuned is not None and name in tuned_names(tuned):
        return DebateModel(tuned.spec_data(), trace)
    if name is None or name not in preset_names():
        offered = [PREFIX + n for n in (list(tuned_names(tuned)) if tuned is not None else []) + preset_names()]
        hint = ""
        if name == AUTO:
            hint = "moot/auto is the protocol moot tune chose, served with moot serve --tuned tuned.yaml; "
        raise RequestError(
            f"{where}: {model!r} is not offered here; {hint}use moot/<protocol> (or moot/<protocol>:trace for the "
            f"debate's turns as reasoning), one of: {', '.join(offered)} (GET /v1/models)",
            param=where,
            status=404,
            code="model_not_found",
        )
    return DebateModel(name, trace)


def accepts_tools(spec: ProtocolSpec) -> bool:
    """Whether a request to this protocol may send tools (:func:`~moot.core.tools.with_tools`): a
    vote decides over the agents' actions; a synthesis or a judge votes over them first, then writes
    the answer."""
    return isinstance(spec.decision, VoteDecision | SynthesizeDecision | JudgeDecision)


def accepts_typed_output(spec: ProtocolSpec) -> bool:
    """Whether a request to this protocol may ask for a typed reply: a synthesis or a judge writes it
    (:func:`typed_decision`), a vote's agents answer in it (with tools too: :meth:`Asked.adjust`)."""
    return isinstance(spec.decision, SynthesizeDecision | JudgeDecision | VoteDecision)


def is_application(name: str) -> bool:
    """Whether a preset is an application's (ABSA's, registered by ``moot.apps``): no chat model."""
    return get_preset_factory(name).__module__.startswith("moot.apps.")


def _card(name: str, spec: ProtocolSpec, description: str, **extra: Any) -> ModelCard:
    return ModelCard(
        id=PREFIX + name,
        description=description,
        protocol=spec.name if extra.get("tuned") is None else name,
        decision=spec.decision.kind,
        calls=spec.planned_calls(),
        accepts_tools=accepts_tools(spec),
        accepts_typed_output=accepts_typed_output(spec),
        **extra,
    )


def model_cards(tuned: TunedModel | None = None) -> tuple[list[ModelCard], list[ModelCard]]:
    """Every protocol as a model, with what it accepts and its calls a request (the tuned one first,
    as ``moot/auto`` and its label, with its evidence), then each again with ``:trace`` (its turns
    streamed as reasoning); and, apart, the applications' protocols (ABSA's), which are no chat models."""
    plain = []
    if tuned is not None:
        evidence = json.loads(tuned.evidence.model_dump_json())
        spec, _ = load_protocol_data(copy.deepcopy(tuned.spec_data()), Path("tuned"))
        plain += [_card(n, spec, tuned.summary(), tuned=evidence) for n in tuned_names(tuned)]
    apps = []
    for n in preset_names():
        spec = get_preset(n)
        if is_application(n):
            described = f"{spec.description or n} (an application's protocol, not a chat model)"
            apps.append(_card(n, spec, described, chat=False))
        else:
            plain.append(_card(n, spec, spec.description or n))
    traced = [
        card.model_copy(
            update={"id": card.id + TRACE, "description": f"{card.description} (the debate's turns as reasoning)"}
        )
        for card in plain
    ]
    return plain + traced, apps


def model_card(model: str, tuned: TunedModel | None = None) -> ModelCard:
    """The card of one model name (``GET /v1/models/{id}``), or the 404 an unknown name gets."""
    chat, apps = model_cards(tuned)
    for card in [*chat, *apps]:
        if card.id == model:
            return card
    debate_model(model, tuned=tuned)  # the 404 that lists what is offered
    raise RequestError(f"model: {model!r} is not offered here (GET /v1/models)", status=404, code="model_not_found")


def check_tuned(settings: ServerSettings) -> None:
    """Refuse, when the server starts, a tuned protocol its limits cannot run, or whose evidence was
    measured on another model than the one ``moot/auto`` would run on (a ``ValueError`` in one line)."""
    tuned = settings.tuned
    if tuned is None:
        return
    from moot.models.registry import canonical_spec

    tuned_on, serving = canonical_spec(tuned.evidence.model), canonical_spec(settings.default_model)
    if tuned_on != serving:
        raise ValueError(
            f"--tuned {tuned.path}: it was tuned on {tuned_on}, and moot/auto would run on this server's default "
            f"model, {serving}: its evidence holds for the model it was measured on; serve it with --models "
            f"{tuned_on} (first), or tune again on {serving}"
        )
    try:
        spec = build_spec(tuned.spec_data(), DebateOptions(), settings)
        check_call_budget(spec, tuned.spec_data(), DebateOptions(), settings)
    except RequestError as exc:
        raise ValueError(f"--tuned {tuned.path}: {exc.message}") from None


# ----------------------------------------------------------------------------------- refusals


class FieldRefusal(RequestError):
    """A refusal of one of the OpenAI request's own fields, found while the debate is prepared: named
    as the request writes it already (not under ``moot``)."""


def refuse_unless(where: str, ok: bool, why: str) -> None:
    """A 400 naming ``where`` when its value is not one a debate can honour (``why``: what to do)."""
    if not ok:
        raise RequestError(f"{where}: {why}", param=where)


def no_legacy_functions(fields: dict[str, Any]) -> None:
    """The legacy ``functions`` and ``function_call`` are refused by their own names, saying exactly
    what to send instead: tool calls work here, as ``tools`` and ``tool_choice``."""
    for name, value in fields.items():
        how = (
            'send each function as a tool: tools=[{"type": "function", "function": <the function>}] (tool calls '
            "work on this server, through the debate)"
            if name == "functions"
            else 'send it as tool_choice: "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
        )
        refuse_unless(name, not value, f"the legacy field; {how}")


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as a refusal may quote it: text as it is, anything else (or text that is not Unicode,
    with a lone surrogate) as escaped JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) and is_text(value) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def content_text(
    content: str | list[dict[str, Any]] | None, where: str, text_types: frozenset[str], file_type: str
) -> tuple[str, list[ContextChunk]]:
    """The text of a message's content, and a passage for each file it sends inline (``file_type``:
    the Responses API's ``input_file`` part, chat completions' ``file`` part, whose file is its
    ``file`` object), its text read before the debate (:func:`~moot.server.openai.input_files.file_passage`).
    Any other part that is not text (an image, audio) is refused by its place: a debate reads text
    only, and dropping the part would debate another question."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    files: list[ContextChunk] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if isinstance(kind, str) and kind in text_types:
            texts.append(str(part.get("text", part.get("refusal", ""))))
            continue
        if kind == file_type:
            nested = file_type == "file"
            inner = part.get("file") if nested else part
            place = f"{where}[{j}].file" if nested else f"{where}[{j}]"
            if not isinstance(inner, dict):
                raise RequestError(f"{place}: give the file as an object (file_data and filename)", param=place)
            try:
                files.append(input_files.file_passage(inner, place))
            except input_files.FileProblem as exc:
                raise RequestError(str(exc), param=exc.param) from None
            continue
        named = shown(kind) if kind else "untyped"
        raise RequestError(
            f"{where}[{j}]: {'an' if named[:1] in tuple('aeiou') else 'a'} {named} part; a debate reads text only, so "
            "send the content as text (a transcript of the audio, a description of the image), or a file inline as "
            f"{'an' if file_type[:1] in tuple('aeiou') else 'a'} {file_type} part with file_data",
            param=f"{where}[{j}]",
        )
    return "\n".join(texts), files


# ------------------------------------------------------------------------ the caller's messages


def instructed(persona: Persona, instructions: str) -> Persona:
    """``persona`` with the caller's instructions after its own (its whole system prompt then)."""
    own = persona.system_prompt()
    text = f"{own}\n\nThe instructions of the one who asks:\n{instructions}" if own else instructions
    return persona.model_copy(update={"instructions": text})


#: A bare continuation nudge an agent loop sends after a tool's result or its own turn ("please
#: proceed", "continue", "go on"): no question of its own.
_NUDGE = re.compile(
    r"(?:(?:ok(?:ay)?|yes|sure|thanks?|thank you|good|great)[,.!]*\s+)?(?:please\s+)?"
    r"(?:proceed|continue|go on|go ahead|carry on|keep going|resume|next(?: step)?|do it|next one)"
    r"(?:\s+(?:please|then|now|with (?:the|your|that) (?:task|work|plan|next step|answer)))*",
    re.IGNORECASE,
)
#: The context passages that are the caller's instructions (its system and developer messages).
INSTRUCTING = frozenset({"system", "developer", "instructions"})


#: A tool's result sent back as a user message, in the text-ReAct convention of agents that flatten
#: their tool calls into text (smolagents: "Calling tools: [...]", then "Observation: ...").
_OBSERVATION = re.compile(r"\s*(?:observation|tool (?:result|output|response))\s*:", re.IGNORECASE)


def is_nudge(text: str) -> bool:
    return len(text) <= 80 and _NUDGE.fullmatch(text.strip().rstrip(".!?").strip()) is not None


def no_question(text: str) -> bool:
    """Whether a user message after an agent's own turn asks nothing of its own: a continuation
    nudge, or a tool's result sent back as text (an observation)."""
    return is_nudge(text) or _OBSERVATION.match(text) is not None


def conversation_parts(question: str, context: list[ContextChunk]) -> tuple[str, list[ContextChunk], str]:
    """A conversation's question, context and instructions: its system and developer messages (and
    ``instructions``) are the caller's instructions, not passages; a bare continuation nudge, or a
    tool's result sent as text ("Observation: ..."), after an assistant's or a tool's turn is not the
    question: the last user message of substance is, and the nudge stays in the context, last."""
    instructions = "\n\n".join(c.text for c in context if c.source in INSTRUCTING)
    rest = [c for c in context if c.source not in INSTRUCTING]
    if no_question(question) and rest and rest[-1].source in ("assistant", "tool"):
        asked = [i for i, c in enumerate(rest) if c.source == "user" and not no_question(c.text)]
        if asked:
            i = asked[-1]
            nudge = ContextChunk(text=question, source="user")
            question, rest = rest[i].text, [*rest[:i], *rest[i + 1 :], nudge]
    return question, rest, instructions


# ----------------------------------------------------------------------------- a typed reply


@dataclass(frozen=True)
class JsonFormat:
    """A JSON schema the reply must follow (``response_format`` or ``text.format``)."""

    name: str
    schema: dict[str, Any]
    description: str | None
    #: The request field that gave it, as that request writes it.
    where: str
    #: The schema as :func:`~moot.core.user_schemas.check_user_schema` checked it, with its validator.
    checked: UserSchema | None = field(default=None, compare=False)


def json_format(fmt: Any, where: str, nested: bool) -> JsonFormat | None:
    """The format a request asks for: None for text; ``json_object`` is any JSON object; a
    ``json_schema`` is checked here (:func:`~moot.core.user_schemas.check_user_schema`: bounded, no
    reference outside it, patterns RE2 can run; its root an object). ``nested``: the chat API's form
    (``{"type": "json_schema", "json_schema": {...}}``); else the Responses API's flat one."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError(
            f"{where}: give an object: {{'type': 'text'}}, {{'type': 'json_object'}} or {{'type': 'json_schema', ...}} "
            f"(not a {type(fmt).__name__})",
            param=where,
        )
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        anything = {"type": "object"}
        return JsonFormat(
            name="json_object", schema=anything, description=None, where=where, checked=check_user_schema(anything)
        )
    refuse_unless(
        f"{where}.type", kind == "json_schema", f"{kind!r} is not a format; use text, json_object or json_schema"
    )
    body = fmt.get("json_schema") if nested else fmt
    inner = f"{where}.json_schema" if nested else where
    if not isinstance(body, dict):
        raise RequestError(f"{inner}: required with type json_schema; give its name and schema", param=inner)
    name = body.get("name")
    refuse_unless(
        f"{inner}.name",
        isinstance(name, str) and bool(_FORMAT_NAME.match(name)),
        "give a name of letters, digits, _ and - (at most 64)",
    )
    schema = body.get("schema")
    refuse_unless(f"{inner}.schema", isinstance(schema, dict), "give the JSON schema the reply must follow (an object)")
    assert isinstance(schema, dict) and isinstance(name, str)
    try:
        checked = check_user_schema(schema, f"{inner}.schema")
    except SchemaProblem as exc:
        raise RequestError(str(exc), param=f"{inner}.schema") from None
    refuse_unless(
        f"{inner}.schema",
        schema.get("type") == "object",
        'the reply is a JSON object: give a schema whose root is {"type": "object", ...}',
    )
    description = body.get("description")
    refuse_unless(
        f"{inner}.description",
        not isinstance(description, str) or is_text(description),
        "give text (a lone surrogate is not Unicode text)",
    )
    return JsonFormat(
        name=name,
        schema=schema,
        description=description if isinstance(description, str) else None,
        where=where,
        checked=checked,
    )


def schema_model(name: str, checked: UserSchema) -> type[BaseModel]:
    """A pydantic model that is a client's JSON schema: sent as the schema itself and validated by
    ``jsonschema`` (as :mod:`moot.core.user_schemas` makes it safe), so that moot's typed turns (the
    schema sent as ``response_format``, a repair request on a reply that does not follow it) work on
    it as on a registered schema."""
    schema = checked.schema

    class RequestSchema(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _follows(cls, data: Any) -> Any:
            error = best_match(checked.errors(data))
            if error is not None:
                where = ".".join(str(p) for p in error.absolute_path) or "(root)"
                raise ValueError(f"{where}: {error.message}")
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(schema)

    RequestSchema.__name__ = RequestSchema.__qualname__ = name
    return RequestSchema


#: The names a request's own schemas go by in its debate's engine (``Engine(..., schemas=...)``): its
#: reply's (``response_format``, ``text.format``) and its tools' action union. Looked up there before
#: the process's registry, they are nobody else's to name, and nothing outlives the debate.
REPLY_SCHEMA = "request-reply"
ACTION_SCHEMA = "request-action"


def typed_decision(spec: ProtocolSpec, fmt: JsonFormat, registered: str = REPLY_SCHEMA) -> ProtocolSpec:
    """The protocol with its decision's reply typed to the client's schema: a synthesis becomes a
    typed reply of the same persona and prompt; a judge's verdict follows the schema instead of its
    own. A decision that writes no reply (a vote or a rule picks one of the agents' answers) cannot
    be typed: refused, naming the field."""
    decision = spec.decision
    note = "\n\nReply with only a JSON object that follows the given schema" + (
        f" ({fmt.description})." if fmt.description else "."
    )
    if isinstance(decision, SynthesizeDecision):
        typed = JudgeDecision.model_validate(
            {
                "persona": decision.persona,
                "prompt": decision.prompt + note,
                "schema": registered,
                "answer_field": None,
                "max_tokens": decision.max_tokens,
                "model": decision.model,
            }
        )
    elif isinstance(decision, JudgeDecision):
        typed = decision.model_copy(
            update={"schema_name": registered, "answer_field": None, "prompt": decision.prompt + note}
        )
    else:
        typed_ones = [n for n in preset_names() if not is_application(n) and accepts_typed_output(get_preset(n))]
        raise FieldRefusal(
            f"{fmt.where}: moot/{spec.name} decides by {decision_noun(decision.kind)}, which picks one of the agents' "
            "answers and writes no reply a schema could type; use a protocol whose reply can be typed (a vote's "
            "agents answer in the schema; a synthesis or a judge writes it: "
            f"{', '.join(PREFIX + n for n in typed_ones)}) or leave {fmt.where} out",
            param=fmt.where,
        )
    return spec.model_copy(update={"decision": typed})


# ------------------------------------------------------------------------------- what is asked


@dataclass
class Asked:
    """What one request asks of its debate and of the reply, from the OpenAI fields it sets."""

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
    #: :data:`ACTION_SCHEMA`): given to its engine as values (:func:`prepared_debate`), never registered.
    schemas: dict[str, type[BaseModel]] = field(default_factory=dict)
    #: The schemas this request's debate will use, built by :meth:`compile` (off the event loop).
    reply_model: type[BaseModel] | None = None
    action_model: type[BaseModel] | None = None
    #: Whether the decision's own call carries the token bound (a synthesis, a typed reply): its reply
    #: is then never trimmed again here (the engine trims by the model's own token count).
    bound_by_call: bool = False
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
            raise FieldRefusal(f"tools: {exc}", "tools") from None

    def bind(self, spec: ProtocolSpec) -> Asked:
        """Say whether the decision's own call carries the token bound, for a debate of ``spec`` (as
        :meth:`adjust` made it)."""
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
        if self.max_tokens is not None and self.bind(spec).bound_by_call:
            assert isinstance(decision, SynthesizeDecision | JudgeDecision)
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
        tools; finish reason ``tool_calls``), read once, as a value both APIs' forms are written from."""
        call = decided_call(result) if self.tools else None
        if call is not None:
            return Reply("", "tool_calls", call)
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


# ------------------------------------------------------------------------------- chat completions

#: The content parts of a chat message that are text (an assistant's refusal is text too).
CHAT_TEXT_PARTS = frozenset({"text", "refusal"})
#: The fields of ``POST /v1/chat/completions`` that do what OpenAI's API says (some only at the
#: values a debate can give: ``n`` 1, ``top_p`` 1, ...; any other value is refused by name). Every
#: other field of the OpenAI SDK's request is refused by name when set; a test walks them all.
CHAT_HONOURED = frozenset(
    {
        "messages", "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
        "seed", "stop", "response_format", "metadata", "user", "safety_identifier", "prompt_cache_key", "n",
        "top_p", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "store",
        "service_tier", "verbosity", "modalities", "tool_choice", "tools", "parallel_tool_calls",
    }
)  # fmt: skip
#: Fields kept with the stored debate's request (they change nothing in the answer, as on OpenAI).
RECORDED = ("metadata", "user", "safety_identifier", "prompt_cache_key")
#: Why each field a debate cannot honour is refused, and what to do instead.
UNSUPPORTED = {
    "reasoning_effort": "a debate's effort is its protocol (more agents or rounds: moot.with, moot.rounds); leave "
    "reasoning_effort out",
    "prediction": "a debate's reply is new text, not an edit of a predicted one; leave prediction out",
    "web_search_options": "a debate searches nothing; leave web_search_options out (give passages as messages)",
    "moderation": "this server runs no moderation model; leave moderation out",
    "prompt_cache_options": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_options out",
    "prompt_cache_retention": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_retention out",
    "audio": "a debate answers in text only; leave modalities and audio out",
}


def sampling_refusals(fields: dict[str, Any]) -> None:
    """The fields both endpoints honour only at their no-op value."""
    checks = {
        "top_p": (fields.get("top_p") in (None, 1), "a debate samples at a temperature only; leave top_p out (or 1)"),
        "top_logprobs": (not fields.get("top_logprobs"), "a debate's answer has no log-probabilities; leave it out"),
        "service_tier": (
            fields.get("service_tier") in (None, "auto", "default"),
            "a debate runs in this server's own queue; leave service_tier out",
        ),
        "store": (
            not fields.get("store"),
            "this server keeps no completion or response to retrieve by its id (every debate is stored: GET "
            "/v1/debates/{id}); leave store out or false, and send the history in the request",
        ),
    }
    for name, (ok, why) in checks.items():
        if name in fields:
            refuse_unless(name, ok, why)


def chat_tools(tools: list[Any] | None, choice: Any, flat: bool = False) -> tuple[list[Tool], str]:
    """The function tools of a chat request and its ``tool_choice`` as a name (``auto``, ``none``,
    ``required`` or one tool's), each checked by name: a malformed tool or choice is a 400. At most
    :data:`~moot.core.tools.MAX_TOOLS` tools, whose parameters take at most
    :data:`~moot.core.tools.MAX_TOOLS_BYTES` together, each a schema
    :func:`~moot.core.user_schemas.check_user_schema` takes. ``flat``: the Responses API's tools (a
    tool's fields are ``tools[i].name``, not ``tools[i].function.name``), for the names of refusals."""
    given = tools or []
    refuse_unless(
        "tools",
        len(given) <= MAX_TOOLS,
        f"{len(given)} tools is over the limit of {MAX_TOOLS} a request (OpenAI's own); send the ones this turn needs",
    )
    total = 0
    for i, raw in enumerate(given):
        where = f"tools[{i}]"
        if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(raw.get("function"), dict):
            raise FieldRefusal(f"{where}: a tool is {{'type': 'function', 'function': {{name, parameters}}}}", where)
        with contextlib.suppress(TypeError, ValueError):  # not JSON: refused below, by its place
            total += len(json.dumps(raw["function"].get("parameters"), separators=(",", ":")))
        if total > MAX_TOOLS_BYTES:
            raise FieldRefusal(
                f"tools: the tools' parameters take over {MAX_TOOLS_BYTES} bytes together (as compact JSON; the limit "
                f"is reached at {where}); send fewer tools or smaller schemas",
                "tools",
            )
    out: list[Tool] = []
    for i, raw in enumerate(given):
        where = f"tools[{i}]" if flat else f"tools[{i}].function"
        fn = raw["function"]
        try:
            out.append(Tool(name=fn.get("name", ""), description=fn.get("description") or "",
                            parameters=fn.get("parameters") or {"type": "object", "properties": {}}))  # fmt: skip
        except ValidationError as exc:
            first = exc.errors()[0]
            cause = (first.get("ctx") or {}).get("error")
            if isinstance(cause, SchemaProblem) and cause.field:
                raise FieldRefusal(f"{where}.{cause.field}: {cause.problem}", f"{where}.{cause.field}") from None
            field_name = ".".join(str(p) for p in first["loc"])
            at = f"{where}.{field_name}" if field_name else where
            raise FieldRefusal(f"{at}: {first['msg'].removeprefix('Value error, ')}", at) from None
    if choice is None:
        name = "auto"
    elif isinstance(choice, str) and choice in ("auto", "none", "required"):
        name = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice["function"].get("name"):
        name = str(choice["function"]["name"])
    else:
        raise FieldRefusal("tool_choice: auto, none, required, or {'type': 'function', 'function': {'name': ...}}",
                           "tool_choice")  # fmt: skip
    if name not in ("auto", "none") and not out:
        raise FieldRefusal("tool_choice: it asks for a tool call, but the request has no tools; send them in tools",
                           "tool_choice")  # fmt: skip
    if out and name not in ("auto", "none", "required") and name not in {t.name for t in out}:
        raise FieldRefusal(f"tool_choice: {name!r} names no tool of this request", "tool_choice")
    return (out if name != "none" else []), name


def chat_asked(req: ChatCompletionRequest) -> Asked:
    """What a chat completion request asks, after refusing by name each field a debate cannot honour
    (the model it names is resolved on its own: :func:`debate_model`)."""
    refuse_unless("n", req.n in (None, 1), "a debate gives one answer; leave n out or set it to 1")
    no_legacy_functions({"functions": req.functions, "function_call": req.function_call not in (None, "none")})
    tools, tool_choice = chat_tools(req.tools, req.tool_choice)
    refuse_unless("logprobs", not req.logprobs, "a debate's answer has no log-probabilities; leave logprobs out")
    sampling_refusals(
        {"top_p": req.top_p, "top_logprobs": req.top_logprobs, "service_tier": req.service_tier, "store": req.store}
    )
    for name in ("presence_penalty", "frequency_penalty"):
        refuse_unless(
            name, getattr(req, name) in (None, 0), f"a debate's calls take no penalties; leave {name} out (or 0)"
        )
    refuse_unless(
        "logit_bias",
        not req.logit_bias,
        "a debate's calls take no token biases (its agents may run on other tokenizers); leave logit_bias out",
    )
    refuse_unless(
        "modalities",
        not (req.modalities and set(req.modalities) - {"text"}),
        "a debate answers in text only; leave modalities and audio out",
    )
    refuse_unless(
        "verbosity",
        req.verbosity in (None, "medium"),
        "a debate's reply is as long as its protocol writes it (bound it with max_completion_tokens); leave "
        "verbosity out",
    )
    for name, why in UNSUPPORTED.items():
        refuse_unless(name, getattr(req, name) is None, why)
    options = req.stream_options
    refuse_unless(
        "stream_options.include_obfuscation",
        options is None or not (options.model_extra or {}).get("include_obfuscation"),
        "this server pads no stream; leave include_obfuscation out or false",
    )
    bound, bound_field = req.max_tokens, "max_tokens"
    if req.max_completion_tokens is not None:
        refuse_unless(
            "max_tokens",
            req.max_tokens in (None, req.max_completion_tokens),
            "give one bound: max_completion_tokens (max_tokens is its older name)",
        )
        bound, bound_field = req.max_completion_tokens, "max_completion_tokens"
    recorded = {name: getattr(req, name) for name in RECORDED if getattr(req, name) is not None}
    return Asked(
        max_tokens=bound,
        max_tokens_field=bound_field,
        temperature=req.temperature,
        seed=req.seed,
        stop=stops(req.stop),
        json=json_format(req.response_format, "response_format", nested=True),
        trace=asks_trace(req.model) or req.moot.trace,
        recorded={"openai": recorded} if recorded else {},
        tools=tools,
        tool_choice=tool_choice,
    )


# ------------------------------------------------------------------------------------ submitting

#: The threads that read a request's tools and schemas: checking a schema against its metaschema
#: costs about 25 ms a kilobyte in pure Python (a request at the limits, several seconds), which the
#: event loop must not wait for; two at a time, apart from the threads model calls run in.
_SCHEMA_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="moot-schemas")
Request = TypeVar("Request")
Result = TypeVar("Result")


async def asked_off_loop(read: Callable[[Request], Asked], req: Request) -> Asked:
    """``read(req)`` (:func:`chat_asked`, :func:`~moot.server.openai.responses.responses_asked`) with its
    schemas built (:meth:`Asked.compile`), in a worker thread: the event loop goes on serving
    other requests meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_SCHEMA_WORKERS, lambda: read(req).compile())


async def off_loop(read: Callable[[], Result]) -> Result:
    """``read()`` in a worker thread (one of :func:`asked_off_loop`'s): a request's messages, whose
    inline files are read into text (:mod:`moot.server.openai.input_files`: a PDF's text costs seconds at
    the body limit), are split without the event loop waiting."""
    return await asyncio.get_running_loop().run_in_executor(_SCHEMA_WORKERS, read)


@dataclass(frozen=True)
class Submission:
    """Where a request's debate goes, and how its refusals are named."""

    settings: ServerSettings
    manager: DebateManager
    record: dict[str, Any]
    headers: Mapping[str, str] | None
    #: The field that holds the question and its context in this request (``messages``, ``input``).
    messages: str
    #: The request's ``Idempotency-Key`` (:mod:`moot.server.state.idempotency`): the debate it names is joined.
    idempotency: idempotency.Idempotency | None = None


def submit(
    asked: Asked,
    protocol: str | dict[str, Any],
    question: str,
    context: list[ContextChunk],
    options: DebateOptions,
    to: Submission,
) -> LiveDebate:
    """Queue the debate a request asks for (:func:`prepared_debate`); a refusal names the fields as this
    request writes them (the question is in ``to.messages``, options in ``moot``)."""
    try:
        prepared = prepared_debate(asked, protocol, question, context, options, to.settings, to.messages)
        if to.idempotency is not None:
            live = idempotency.submit_once(to.manager, prepared, to.record, to.idempotency, to.headers)
        else:
            live = to.manager.submit(
                prepared.spec, prepared.task, prepared.engine, prepared.model, to.record, headers=to.headers
            )
    except RequestError as exc:
        if not isinstance(exc, FieldRefusal | idempotency.KeyRefusal):
            raise exc.renamed({"question": to.messages, "context": to.messages, "protocol": "model"}, "moot") from None
        raise
    return live


def prepared_debate(
    asked: Asked,
    protocol: str | dict[str, Any],
    question: str,
    context: list[ContextChunk],
    options: DebateOptions,
    settings: ServerSettings,
    messages: str = "messages",
) -> Prepared:
    """The debate an OpenAI request asks for, as :meth:`Asked.adjust` makes it: the one way it is built,
    when the request comes in (:func:`submit`) and when its stored request is built again (:func:`rebuild`).
    The conversation's system and developer messages are the caller's instructions, a bare nudge is
    not the question (:func:`conversation_parts`), and the conversation is fitted to the prompt budget
    (:func:`~moot.server.policy.fit_conversation`); ``messages``: the field that holds it, named in
    a refusal. The request's own schemas go to the debate's engine as values (:attr:`Asked.schemas`)."""
    limit = settings.limits.max_messages
    if len(context) + 1 > limit:
        raise FieldRefusal(
            f"{messages}: {len(context) + 1} messages is over this server's limit of {limit} (moot serve "
            "--max-messages); send the most recent ones (the oldest are left out anyway when they do not fit the "
            "debate's prompt budget)",
            messages,
        )
    question, context, asked.instructions = conversation_parts(question, context)
    return prepare(
        protocol, question, context, options, settings, adjust=asked.adjust, schemas=asked.schemas, conversation=True
    )


def rebuild(
    debate_id: str,
    asked: Asked,
    protocol: str | dict[str, Any],
    question: str,
    context: list[ContextChunk],
    options: DebateOptions,
    settings: ServerSettings,
) -> LiveDebate:
    """The debate of a stored OpenAI request built again, by the function that built it at its
    submission (:func:`prepared_debate`), to be taken over by another replica or run again after a
    restart (:meth:`DebateManager._rebuild`); a :class:`RequestError` if it cannot be."""
    prepared = prepared_debate(asked.compile(), protocol, question, context, options, settings)
    return LiveDebate(
        id=debate_id, spec=prepared.spec, task=prepared.task, engine=prepared.engine, model=prepared.model
    )


def cost_headers(live: LiveDebate) -> dict[str, str]:
    """What a debate cost, in response headers (the convention proxies that fan one request out to
    many calls follow): its id, its calls and tokens, and US dollars when every model is priced."""
    headers = {"x-moot-debate-id": live.id}
    result = live.result
    if result is None:
        return headers
    headers["x-moot-calls"] = str(result.llm_calls)
    headers["x-moot-total-tokens"] = str(result.usage.total_tokens)
    headers["x-moot-cached-tokens"] = str(result.usage.cached_prompt_tokens)
    if result.cost is not None and result.cost.usd is not None:
        headers["x-moot-cost-usd"] = f"{result.cost.usd:.8f}"
    return headers
