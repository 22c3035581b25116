"""Tool calls through a debate: each agent proposes an action (call one of the caller's tools with
typed arguments, or answer), and the decision votes over the proposed actions.

- :func:`action_schema` builds the typed turn of a request's tools: a tagged union on ``do``
  (``"answer"`` with ``answer``, or a tool's name with ``arguments`` following that tool's JSON
  schema). Grammar-constrained backends can only produce a well-formed action; the arguments are
  also validated against the tool's schema (``jsonschema``), so an invalid call is a parse failure
  that gets one repair request, like any typed turn.
- ``tool_choice`` narrows the union: ``auto`` (answer or any tool), ``required`` (any tool),
  ``none`` (answer only), or one named tool.
- The ``action-vote`` rule: the same tool with equal arguments (compared as canonical JSON, so the
  order of keys does not matter) is one ballot; the plurality wins; a tie goes to the action
  proposed first, as every vote's does.
- :func:`with_tools` turns a vote-decided protocol (Society of Minds, a vote, ...) into its
  tool-using form; the agents see each other's proposed actions as they see answers.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema, create_model, model_validator

from moot.core.decisions import DecisionOutcome, register_rule
from moot.core.spec import ProtocolSpec, RuleDecision, SpecError, TurnFormat, VoteDecision
from moot.core.types import DebateResult
from moot.structured import fingerprint, register_schema

ToolChoice = Literal["auto", "required", "none"] | str


class Tool(BaseModel):
    """A function the caller can run (OpenAI's ``tools[].function``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @model_validator(mode="after")
    def _check_schema(self) -> Tool:
        try:
            jsonschema.validators.validator_for(self.parameters).check_schema(self.parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"tool {self.name}: parameters is not a valid JSON schema ({exc.message})") from None
        return self


class ToolCall(BaseModel):
    """An action a debate decided on: call ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        return canonical_call(self.name, self.arguments)


def canonical_call(name: str, arguments: dict[str, Any]) -> str:
    """One ballot per action: the tool and its arguments as canonical JSON (sorted keys)."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _call_model(tool: Tool) -> type[BaseModel]:
    validator = jsonschema.validators.validator_for(tool.parameters)(tool.parameters)

    def check(self: BaseModel) -> BaseModel:
        errors = sorted(validator.iter_errors(self.arguments), key=lambda e: list(e.path))  # type: ignore[attr-defined]
        if errors:
            where = ".".join(str(p) for p in errors[0].path) or "(the arguments)"
            raise ValueError(f"arguments of {tool.name}: {where}: {errors[0].message}")
        return self

    do: Any = Literal[tool.name]  # a literal of a runtime value
    validators: dict[str, Any] = {"_check_arguments": model_validator(mode="after")(check)}
    return create_model(
        f"Call_{tool.name.replace('-', '_')}",
        __config__=ConfigDict(extra="forbid"),
        __validators__=validators,
        reasoning=(str, Field(max_length=1200, description="brief reasoning: why this call")),
        do=(do, Field(description=f"call {tool.name}: {tool.description}"[:200])),
        arguments=(Annotated[dict[str, Any], WithJsonSchema(tool.parameters)], ...),
    )


class AnswerAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reasoning: str = Field(max_length=1200, description="brief reasoning")
    do: Literal["answer"]
    answer: str = Field(max_length=4000, description="the answer to the user, when no tool is needed")


def action_schema(tools: list[Tool], tool_choice: ToolChoice = "auto") -> type[BaseModel]:
    """The typed turn of an agent that may call one of ``tools`` (see the module docstring)."""
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
        options.append(AnswerAction)
    if len(options) == 1:
        return options[0]
    union = options[0]
    for option in options[1:]:
        union = union | option  # type: ignore[assignment]
    root: Any = RootModel[Annotated[union, Field(discriminator="do")]]  # type: ignore[valid-type]
    action: type[BaseModel] = create_model("ActionTurn", __base__=root)
    return action


def register_action_schema(tools: list[Tool], tool_choice: ToolChoice = "auto") -> str:
    """Register the action schema of these tools (once per distinct set) and return its name."""
    spec = [t.model_dump() for t in tools]
    name = f"action-{fingerprint([spec, tool_choice])}"
    from moot.structured import _SCHEMAS  # the registry: a schema of these exact tools is reused

    if name not in _SCHEMAS:
        register_schema(name, action_schema(tools, tool_choice))
    return name


def with_tools(spec: ProtocolSpec, tools: list[Tool], tool_choice: ToolChoice = "auto") -> ProtocolSpec:
    """``spec`` whose agents propose actions over ``tools`` and whose decision votes over them.
    Only a protocol decided by a vote over typed answers can: its vote becomes ``action-vote``."""
    if not isinstance(spec.decision, VoteDecision):
        raise SpecError(
            f"protocol {spec.name} is decided by a {spec.decision.kind}; tool calls go through a protocol decided by "
            "a vote over typed answers (vote, society-of-minds, mad-conformist, chateval, ...)"
        )
    schema = register_action_schema(tools, tool_choice)
    turn = TurnFormat(schema=schema)  # the whole action is what the others see
    participants = [p.model_copy(update={"turn": None}) for p in spec.participants]
    return spec.model_copy(
        update={
            "turn": turn,
            "participants": participants,
            "decision": RuleDecision(name="action-vote", params={"rounds": spec.decision.rounds}),
            "probe": None,
        }
    )


def _action_of(parsed: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    if not parsed or "do" not in parsed:
        return None
    if parsed["do"] == "answer":
        return "answer", {"answer": str(parsed.get("answer", "")).strip()}
    return str(parsed["do"]), dict(parsed.get("arguments") or {})


def action_vote(result: DebateResult, params: dict[str, Any]) -> DecisionOutcome:
    """The plurality of the proposed actions (the last round's, or every round's with ``rounds:
    all``). A winning call's ``final_answer`` is its canonical JSON; ``decision.action`` holds it."""
    rounds = result.rounds if params.get("rounds") == "all" else result.rounds[-1:]
    ballots: list[tuple[str, str, dict[str, Any]]] = []
    for rnd in rounds:
        for turn in rnd.turns:
            action = _action_of(turn.parsed) if turn.ok else None
            if action is None:
                continue
            do, payload = action
            key = f"answer:{payload['answer']}" if do == "answer" else canonical_call(do, payload)
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
