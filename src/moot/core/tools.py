"""Tool calls through a debate: each agent proposes an action (call one of the caller's tools with
typed arguments, or answer), and the decision votes over the proposed actions.

- :func:`action_schema` builds the typed turn of a request's tools: a tagged union on ``do``
  (``"answer"`` with ``answer``, or a tool's name with ``arguments`` following that tool's JSON
  schema). Grammar-constrained backends can only produce a well-formed action; the arguments are
  also validated against the tool's schema (``jsonschema``, as :mod:`moot.core.user_schemas` makes
  it safe: no reference leaves the schema, patterns run on RE2), so an invalid call is a parse
  failure that gets one repair request, like any typed turn. A tool's local references
  (``#/$defs/NAME``) keep working in the action's schema: its definitions move to the action's
  ``$defs`` and its references are rewritten to them.
- At most :data:`MAX_TOOLS` tools a request (OpenAI's own limit), whose parameters together are at
  most :data:`MAX_TOOLS_BYTES` as compact JSON.
- ``tool_choice`` narrows the union: ``auto`` (answer or any tool), ``required`` (any tool),
  ``none`` (answer only), or one named tool.
- The ``action-vote`` rule: the same tool with equal arguments (compared as canonical JSON, so the
  order of keys does not matter) is one ballot; the plurality wins; a tie goes to the action
  proposed first, as every vote's does.
- :func:`with_tools` turns a vote-decided protocol (Society of Minds, a vote, ...) into its
  tool-using form; the agents see each other's proposed actions as they see answers. A protocol
  decided by a synthesis or a judge keeps its decision, which first votes over the actions
  (:class:`~moot.core.spec.ActionVote`): every answer is one ballot, so the choice is between
  answering and each proposed call; a winning call is the decision, and answering is left to the
  synthesis or the judge, which writes the answer (in the caller's schema when one is asked for).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    WithJsonSchema,
    create_model,
    model_validator,
)

from moot.core.decisions import DecisionOutcome, register_rule
from moot.core.spec import (
    ActionVote,
    JudgeDecision,
    ProtocolSpec,
    RuleDecision,
    SpecError,
    SynthesizeDecision,
    TurnFormat,
    VoteDecision,
    decision_noun,
)
from moot.core.types import DebateResult
from moot.core.user_schemas import SchemaProblem, UserSchema, check_user_schema, is_text
from moot.structured import fingerprint, get_schema, register_schema, with_fixed_schema

ToolChoice = Literal["auto", "required", "none"] | str
#: The most tools one request (one action schema) may carry: OpenAI's API allows as many.
MAX_TOOLS = 128
#: The most bytes a request's tools' parameters may take together, as compact JSON (each one is
#: also bounded by :data:`moot.core.user_schemas.MAX_SCHEMA_BYTES`).
MAX_TOOLS_BYTES = 256 * 1024


class Tool(BaseModel):
    """A function the caller can run (OpenAI's ``tools[].function``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    _checked: UserSchema | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_schema(self) -> Tool:
        if not is_text(self.description):
            where = f"tool {self.name}: description"
            raise SchemaProblem("holds a lone surrogate (not Unicode text); send text", where, field="description")
        try:
            self._checked = check_user_schema(self.parameters, "parameters")
        except SchemaProblem as exc:
            raise SchemaProblem(exc.problem, f"tool {self.name}: parameters", field="parameters") from None
        if self.parameters.get("type", "object") not in ("object", ["object"]):
            # A call's arguments are a JSON object, as OpenAI's API requires of the schema: a debate
            # whose agents must write another root could never decide a call.
            raise SchemaProblem(
                f'a call\'s arguments are a JSON object: give a schema whose root is {{"type": "object", ...}}, '
                f"not {json.dumps(self.parameters['type'])}",
                f"tool {self.name}: parameters",
                field="parameters",
            )
        return self

    def __eq__(self, other: object) -> bool:
        # Equal tools are equal whether or not (or when) their schema was checked.
        if not isinstance(other, Tool):
            return NotImplemented
        return (self.name, self.description, self.parameters) == (other.name, other.description, other.parameters)

    __hash__ = None  # type: ignore[assignment]  # as any pydantic model: mutable, not hashable

    def __getstate__(self) -> dict[Any, Any]:
        # The checked schema holds compiled validators, which do not pickle: checked again where unpickled.
        state = super().__getstate__()
        state["__pydantic_private__"] = {**(state.get("__pydantic_private__") or {}), "_checked": None}
        return state

    @property
    def checked(self) -> UserSchema:
        """The parameters' schema as :func:`~moot.core.user_schemas.check_user_schema` checked it."""
        if self._checked is None:  # built without validation (model_construct)
            self._checked = check_user_schema(self.parameters, f"tool {self.name}: parameters")
        return self._checked


class ToolCall(BaseModel):
    """An action a debate decided on: call ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        return canonical_call(self.name, self.arguments)

    def arguments_json(self) -> str:
        """The arguments as the OpenAI APIs send them (a JSON string, Unicode as it is)."""
        return json.dumps(self.arguments, ensure_ascii=False)


def decided_call(result: DebateResult) -> ToolCall | None:
    """The tool call a finished debate decided on (``decision.action``, as :func:`action_vote` writes
    it), or None: the one reader of that record."""
    action = (result.decision or {}).get("action")
    if isinstance(action, dict) and action.get("type") == "tool_call":
        return ToolCall(name=str(action["name"]), arguments=dict(action.get("arguments") or {}))
    return None


def canonical_call(name: str, arguments: dict[str, Any]) -> str:
    """One ballot per action: the tool and its arguments as canonical JSON (sorted keys)."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


#: Stands for a tool's parameters in the schema pydantic writes, until :func:`_splice` puts them there.
_ARGUMENTS_OF = "moot:arguments-of:"


def _call_model(tool: Tool) -> type[BaseModel]:
    checked = tool.checked

    def check(self: BaseModel) -> BaseModel:
        found = checked.errors(self.arguments)  # type: ignore[attr-defined]
        errors = sorted(found, key=lambda e: [str(p) for p in e.path])
        if errors:
            where = ".".join(str(p) for p in errors[0].path) or "(the arguments)"
            raise ValueError(f"arguments of {tool.name}: {where}: {errors[0].message}")
        return self

    do: Any = Literal[tool.name]  # a literal of a runtime value
    arguments: Any = Annotated[dict[str, Any], WithJsonSchema({"$comment": _ARGUMENTS_OF + tool.name})]
    validators: dict[str, Any] = {"_check_arguments": model_validator(mode="after")(check)}
    return create_model(
        f"Call_{tool.name.replace('-', '_')}",
        __config__=ConfigDict(extra="forbid"),
        __validators__=validators,
        reasoning=(str, Field(max_length=1200, description="brief reasoning: why this call")),
        do=(do, Field(description=f"call {tool.name}: {tool.description}"[:200])),
        arguments=(arguments, ...),
    )


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _rewrite_refs(node: Any, rewrite: Any) -> Any:
    """``node`` with every reference rewritten by ``rewrite``, except inside a subschema with its own
    ``$id`` (its references are relative to it, wherever it is)."""
    if isinstance(node, list):
        return [_rewrite_refs(v, rewrite) for v in node]
    if not isinstance(node, dict) or "$id" in node:
        return node
    refs = ("$ref", "$dynamicRef", "$recursiveRef")
    return {k: rewrite(v) if k in refs and isinstance(v, str) else _rewrite_refs(v, rewrite) for k, v in node.items()}


def _splice(schema: dict[str, Any], tools: dict[str, Tool]) -> dict[str, Any]:
    """The action's JSON schema with each tool's parameters in place of its marker. The tool's
    references were relative to its parameters: its ``$defs`` (and ``definitions``) move to the
    action's ``$defs`` as ``<tool>.$defs.<name>``, and every other local reference is rewritten to
    where the parameters now are."""
    places: dict[str, str] = {}
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            mark = node.get("$comment")
            if isinstance(mark, str) and mark.startswith(_ARGUMENTS_OF):
                places[mark.removeprefix(_ARGUMENTS_OF)] = at
                continue
            stack.extend((v, f"{at}/{_pointer_token(str(k))}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    for name, at in places.items():
        params = copy.deepcopy(tools[name].parameters)
        if "$id" not in params:  # a schema with its own $id resolves its references itself
            moved = {kw: params.pop(kw) for kw in ("$defs", "definitions") if isinstance(params.get(kw), dict)}

            def rewrite(ref: str, at: str = at, name: str = name, moved: dict[str, Any] = moved) -> str:
                if ref == "#" or ref.startswith("#/"):
                    for kw in moved:
                        head = f"#/{_pointer_token(kw)}/"
                        if ref.startswith(head):
                            return f"#/$defs/{_pointer_token(f'{name}.{kw}.')}{ref.removeprefix(head)}"
                    return "#" + at + ref[1:]
                return ref  # an anchor (#name) is found wherever it is

            for kw, table in moved.items():
                for key, sub in table.items():
                    defs[f"{name}.{kw}.{key}"] = _rewrite_refs(sub, rewrite)
            params = _rewrite_refs(params, rewrite)
        target: Any = schema
        parts = [p.replace("~1", "/").replace("~0", "~") for p in at.split("/")[1:]]
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        # What pydantic adds beside the marker (the field's title) stays, after the parameters' own keys.
        marker = target[parts[-1]]
        target[parts[-1]] = {**params, **{k: v for k, v in marker.items() if k != "$comment" and k not in params}}
    if not defs:
        del schema["$defs"]
    return schema


class AnswerAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reasoning: str = Field(max_length=1200, description="brief reasoning")
    do: Literal["answer"]
    answer: str = Field(max_length=4000, description="the answer to the user, when no tool is needed")


def _typed_answer_model(answer: Tool) -> type[BaseModel]:
    """The action of answering when the caller asks for a typed answer: ``answer`` is an object that
    follows the caller's schema (``answer.parameters``), validated like a tool's arguments."""
    checked = answer.checked

    def check(self: BaseModel) -> BaseModel:
        found = sorted(checked.errors(self.answer), key=lambda e: [str(p) for p in e.path])  # type: ignore[attr-defined]
        if found:
            where = ".".join(str(p) for p in found[0].path) or "(the answer)"
            raise ValueError(f"answer: {where}: {found[0].message}")
        return self

    value: Any = Annotated[dict[str, Any], WithJsonSchema({"$comment": _ARGUMENTS_OF + answer.name})]
    do: Any = Literal["answer"]
    validators: dict[str, Any] = {"_check_answer": model_validator(mode="after")(check)}
    return create_model(
        "TypedAnswerAction",
        __config__=ConfigDict(extra="forbid"),
        __validators__=validators,
        reasoning=(str, Field(max_length=1200, description="brief reasoning")),
        do=(do, Field(description="answer the user, when no tool is needed")),
        answer=(value, Field(description="the answer, an object following the given schema")),
    )


def action_schema(tools: list[Tool], tool_choice: ToolChoice = "auto", answer: Tool | None = None) -> type[BaseModel]:
    """The typed turn of an agent that may call one of ``tools`` (see the module docstring). Its JSON
    schema is written once, here: sent with every turn, it is not rebuilt for each. ``answer``: the
    caller's schema of the answer (as a tool's parameters; its name is only a marker), which the
    action of answering then follows instead of free text."""
    if len(tools) > MAX_TOOLS:
        raise SpecError(f"tools: {len(tools)} tools is over the limit of {MAX_TOOLS} a request; send fewer")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise SpecError(f"tools: names repeat ({', '.join(sorted({n for n in names if names.count(n) > 1}))})")
    if "answer" in names:
        raise SpecError("tools: a tool may not be named 'answer' (it is the action of answering)")
    if tool_choice not in ("auto", "required", "none") and tool_choice not in names:
        raise SpecError(f"tool_choice: {tool_choice!r} names no tool of this request; its tools: {', '.join(names)}")
    chosen = [t for t in tools if tool_choice in ("auto", "required") or t.name == tool_choice]
    options: list[type[BaseModel]] = [] if tool_choice == "none" else [_call_model(t) for t in chosen]
    if tool_choice in ("auto", "none"):
        options.append(AnswerAction if answer is None else _typed_answer_model(answer))
    if len(options) == 1:
        action = options[0]
    else:
        union = options[0]
        for option in options[1:]:
            union = union | option  # type: ignore[assignment]
        root: Any = RootModel[Annotated[union, Field(discriminator="do")]]  # type: ignore[valid-type]
        action = create_model("ActionTurn", __base__=root)
    spliced = {t.name: t for t in chosen} | ({answer.name: answer} if answer is not None else {})
    return with_fixed_schema(action, _splice(action.model_json_schema(), spliced))


def register_action_schema(tools: list[Tool], tool_choice: ToolChoice = "auto") -> str:
    """Register the action schema of these tools (once per distinct set, for the process's life: a
    server gives each request's own to its debate's engine instead, ``Engine(..., schemas=...)``) and
    return its name."""
    spec = [t.model_dump() for t in tools]
    name = f"action-{fingerprint([spec, tool_choice])}"
    try:
        get_schema(name)
    except KeyError:
        register_schema(name, action_schema(tools, tool_choice))
    return name


def with_tools(
    spec: ProtocolSpec, tools: list[Tool], tool_choice: ToolChoice = "auto", *, schema: str | None = None
) -> ProtocolSpec:
    """``spec`` whose agents propose actions over ``tools`` and whose decision votes over them.
    A protocol decided by a vote over typed answers: its vote becomes ``action-vote``. One decided
    by a synthesis or a judge: its decision votes over the actions first (:class:`ActionVote`) and
    writes the answer when answering wins. A selection or a rule picks one of the agents' answers
    and cannot: refused. ``schema``: the name these tools' :func:`action_schema` goes by in the
    engine that runs the spec (``Engine(..., schemas={name: schema})``); else it is registered here."""
    decision = spec.decision
    if not isinstance(decision, VoteDecision | SynthesizeDecision | JudgeDecision):
        raise SpecError(
            f"protocol {spec.name} is decided by {decision_noun(decision.kind)}; tool calls go through a protocol "
            "decided by a vote over typed answers (vote, society-of-minds, mad-conformist, chateval, ...), a "
            "synthesis or a judge (affirmative-critical, panel, mad)"
        )
    if schema is None:
        schema = register_action_schema(tools, tool_choice)
    turn = TurnFormat(schema=schema)  # the whole action is what the others see
    participants = [p.model_copy(update={"turn": None}) for p in spec.participants]
    acting: SynthesizeDecision | JudgeDecision | RuleDecision
    if isinstance(decision, VoteDecision):
        acting = RuleDecision(name="action-vote", params={"rounds": decision.rounds})
    else:
        acting = decision.model_copy(update={"actions": ActionVote()})
    return spec.model_copy(update={"turn": turn, "participants": participants, "decision": acting, "probe": None})


def _action_of(parsed: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    if not parsed or "do" not in parsed:
        return None
    if parsed["do"] == "answer":
        given = parsed.get("answer", "")
        if isinstance(given, dict):  # a typed answer: compared, and given, as canonical JSON
            return "answer", {"answer": json.dumps(given, sort_keys=True, separators=(",", ":"), ensure_ascii=False)}
        return "answer", {"answer": str(given).strip()}
    return str(parsed["do"]), dict(parsed.get("arguments") or {})


def action_vote(result: DebateResult, params: dict[str, Any]) -> DecisionOutcome:
    """The plurality of the proposed actions (the last round's, or every round's with ``rounds:
    all``). A winning call's ``final_answer`` is its canonical JSON; ``decision.action`` holds it.
    ``answers: one``: every answer is one ballot, ``answer`` (a synthesis or a judge writes it)."""
    rounds = result.rounds if params.get("rounds") == "all" else result.rounds[-1:]
    one_answer = params.get("answers") == "one"
    ballots: list[tuple[str, str, dict[str, Any]]] = []
    for rnd in rounds:
        for turn in rnd.turns:
            action = _action_of(turn.parsed) if turn.ok else None
            if action is None:
                continue
            do, payload = action
            if do == "answer":
                key = "answer" if one_answer else f"answer:{payload['answer']}"
            else:
                key = canonical_call(do, payload)
            ballots.append((key, do, payload))
    details: dict[str, Any] = {"votes": {}, "tie": False}
    if not ballots:
        return DecisionOutcome(final_answer=None, details=details, error="no participant proposed an action")
    counts = Counter(key for key, _, _ in ballots)
    best = max(counts.values())
    leaders = [key for key in dict.fromkeys(k for k, _, _ in ballots) if counts[key] == best]
    winner = next(b for b in ballots if b[0] == leaders[0])
    details["votes"] = dict(counts)
    details["tie"] = len(leaders) > 1
    if len(leaders) > 1:
        details["tied"] = leaders
    _, do, payload = winner
    if do == "answer":
        details["action"] = {"type": "answer", "answer": payload["answer"]}
        return DecisionOutcome(final_answer=payload["answer"], details=details)
    details["action"] = {"type": "tool_call", "name": do, "arguments": payload}
    return DecisionOutcome(final_answer=canonical_call(do, payload), details=details)


register_rule("action-vote", action_vote)
