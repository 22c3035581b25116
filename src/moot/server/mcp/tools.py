"""The MCP door's four tools as the host sees them, and a call's arguments as the server takes them.

The tools' typed arguments and results (pydantic: their JSON schemas are the tools' input and
output schemas, written flat by :func:`inline_refs`), the table of tools (:data:`TOOLS`), and the
reading of a call's arguments: :func:`parse_args` refuses in one line (a :class:`ToolFailure`) what
does not fit, :func:`not_text` what is not text, and :func:`submit` checks a ``debate`` as
``POST /v1/debates`` is checked (the server's policy) before queuing it in the debate manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.files import field_path
from moot.files import first_error as first_of
from moot.files import not_text as files_not_text
from moot.protocols import preset_names
from moot.protocols.refs import ProtocolRefError, parse_call, preset_params
from moot.server.bodies import unusable_number
from moot.server.openai.catalogue import tuned_names
from moot.server.policy import RequestError, prepare
from moot.server.schemas import BudgetOverrides, DebateRequest, ServerStatus
from moot.server.settings import ServerSettings
from moot.server.state.manager import DebateManager, LiveDebate, QueueFull

DEFAULT_PROTOCOL = "affirmative-critical"
#: A debate's transcript as a resource: this and its id (``moot://debates/{id}``).
RESOURCE_PREFIX = "moot://debates/"


# ----------------------------------------------------------------------------------- arguments

#: The tools' arguments as their input schemas say, no more: no unknown one, and each of its JSON
#: type (``"wait": "no"`` was read as false, ``"max_calls": "50"`` as 50; a host that validates
#: against the schema would refuse both, so a caller that does not must be told).
ARGUMENTS = ConfigDict(extra="forbid", strict=True)


class Passage(BaseModel):
    """A context passage with where it came from."""

    model_config = ARGUMENTS

    text: str = Field(min_length=1, description="the passage's text")
    source: str | None = Field(default=None, description="where it came from (a file, a URL)")


class DebateBudget(BaseModel):
    """The budget of one debate (the names of ``POST /v1/debates``); each within the server's limits."""

    model_config = ARGUMENTS

    max_calls: int | None = Field(default=None, ge=1, description="most model calls of the whole debate")
    max_total_tokens: int | None = Field(
        default=None, ge=1, description="most tokens (prompt and completion) of the whole debate"
    )
    timeout_s: float | None = Field(default=None, gt=0, description="most seconds the debate may run")
    max_tokens_per_turn: int | None = Field(default=None, ge=1, description="most tokens of one agent's reply")


class DebateArgs(BaseModel):
    model_config = ARGUMENTS

    question: str = Field(min_length=1, description="The question or claim to debate.")
    protocol: str = Field(
        default=DEFAULT_PROTOCOL,
        description="How the agents debate: a preset name from list_protocols (vote, mad, panel, ...), or a "
        "preset with parameters in one line: vote@5, mad(rounds=2), society-of-minds(agents=3,rounds=2); "
        "auto is the protocol moot tune chose, when the server has one.",
    )
    context: list[str | Passage] = Field(
        default_factory=list, description="Passages the agents debate over (retrieved documents, notes)."
    )
    budget: DebateBudget = Field(default_factory=DebateBudget, description="Caps on the debate's calls, tokens, time.")
    model: str | None = Field(
        default=None, description="One of the server's models (list_protocols names them); default: its first."
    )
    wait: bool = Field(
        default=True,
        description="true: the call returns when the debate ends (with progress per turn and round). false: it "
        "returns at once with the debate's id and status; poll get_debate (for hosts that cut long tool calls).",
    )


class DebateIdArgs(BaseModel):
    model_config = ARGUMENTS

    debate_id: str = Field(min_length=1, description="The debate's id, as debate returned it.")


class NoArgs(BaseModel):
    model_config = ARGUMENTS


# ------------------------------------------------------------------------------------- results


class Dissent(BaseModel):
    """An agent whose last answer is not the decision's."""

    speaker: str
    name: str
    answer: str
    confidence: float | None = None
    #: Its own reasoning, cut at a few hundred characters (the transcript has it whole).
    reason: str | None = None


class DebateOutcome(BaseModel):
    """What a debate decided, how, and at what cost (a partial picture while it runs)."""

    debate_id: str
    status: ServerStatus
    protocol: str
    question: str
    model: str
    answer: str | None = Field(default=None, description="the decision: the final answer (None until decided)")
    decision: dict[str, Any] | None = Field(default=None, description="how it was decided (votes, the judge's verdict)")
    agreement: float | None = Field(
        default=None,
        description="share of the agents whose last typed answer is the most common one (None: free-text turns)",
    )
    dissent: list[Dissent] = Field(default_factory=list, description="the agents whose last answer differs")
    confidence: float | None = Field(default=None, description="0 to 1; confidence_from says whose it is")
    confidence_from: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    rounds: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens: int = 0
    cost_usd: float | None = Field(default=None, description="US dollars at the server's prices (None: unpriced)")
    unpriced: list[str] = Field(default_factory=list, description="models called that have no price")
    elapsed_s: float = 0.0
    transcript: str = Field(description="the resource of the whole transcript (moot.debate/1 JSON)")


class ProtocolEntry(BaseModel):
    name: str
    description: str
    #: Model calls of a full run (rounds x speakers, a self-check per turn where the protocol asks one, + the
    #: decision), before repairs and early stops.
    calls: int
    rounds: int
    participants: list[str]
    decision: str
    #: The preset's parameters and their defaults, for the one-line form ``name(key=value, ...)``.
    parameters: dict[str, Any] = Field(default_factory=dict)
    #: For the protocol ``moot tune`` chose (``auto``): the evidence it wrote, and in one line.
    tuned: dict[str, Any] | None = None
    evidence: str | None = None


class ProtocolCatalogue(BaseModel):
    protocols: list[ProtocolEntry]
    models: list[str] = Field(description="the models a debate may name; the first is the default")
    default_protocol: str = DEFAULT_PROTOCOL


# --------------------------------------------------------------------------------------- tools


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic schema with its ``$defs`` written in place (the models here are not recursive):
    hosts and models read a flat schema more reliably than one with references."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk({**defs[ref.rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = walk(schema)
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return inline_refs(model.model_json_schema())


TOOLS: dict[str, tuple[type[BaseModel], type[BaseModel], str, types.ToolAnnotations]] = {
    "debate": (
        DebateArgs,
        DebateOutcome,
        "Run a structured debate between LLM agents on a question and return the decision: the answer, the "
        "agents' agreement, the dissenting agents' answers and reasons, a confidence, and the calls, tokens "
        "and cost it took. Progress is reported per turn and round; cancelling the call stops the debate. It may "
        "run as an MCP Task (tasks/get, tasks/cancel), whose id is the debate's.",
        types.ToolAnnotations(
            title="Debate a question", read_only_hint=False, destructive_hint=False, idempotent_hint=False
        ),
    ),
    "get_debate": (
        DebateIdArgs,
        DebateOutcome,
        "The status and result of a debate by its id (partial while it runs).",
        types.ToolAnnotations(title="Get a debate", read_only_hint=True, idempotent_hint=True),
    ),
    "cancel_debate": (
        DebateIdArgs,
        DebateOutcome,
        "Stop a queued or running debate; it keeps the transcript of what was finished.",
        types.ToolAnnotations(title="Cancel a debate", read_only_hint=False, destructive_hint=True),
    ),
    "list_protocols": (
        NoArgs,
        ProtocolCatalogue,
        "The debate protocols: what each does, its model calls per debate, its parameters, and the evidence "
        "behind the tuned one (auto) when the server has one; and the models a debate may use.",
        types.ToolAnnotations(title="List the protocols", read_only_hint=True, idempotent_hint=True),
    ),
}


class ToolFailure(Exception):
    """A tool call that cannot be done: its one-line reason reaches the caller as an error result."""


def _branch(x: Any) -> bool:
    """Whether a place in an error's ``loc`` is pydantic's tag of a union's branch (``str``, a model's
    name), not an argument's name."""
    return isinstance(x, str) and (x[:1].isupper() or x == "str")


def first_error(exc: ValidationError, tool: str) -> str:
    first = first_of(exc)
    loc = first["loc"]
    if first["type"].endswith("_type") and loc and _branch(loc[-1]):
        # A value no branch of a union takes: the branch that read furthest into it says what is
        # wrong (a passage whose source is not text: context.0.source, not "context.0: not a string").
        deeper = [e for e in exc.errors() if e["loc"][: len(loc) - 1] == loc[:-1] and len(e["loc"]) > len(loc)]
        first = deeper[0] if deeper else first
    where = field_path(x for x in first["loc"] if not _branch(x))
    kind, msg = first["type"], first["msg"]
    if kind == "extra_forbidden":
        return f"{tool}: {where}: unknown argument; remove it or check its spelling (see the tool's input schema)"
    if kind == "missing":
        return f"{tool}: {where}: required; add it"
    msg = msg.removeprefix("Value error, ")
    return f"{tool}: {where}: {msg}" if where else f"{tool}: {msg}"


def not_text(value: Any, where: str = "") -> str | None:
    """The argument that holds what is not text (:func:`moot.files.not_text`: a lone UTF-16
    surrogate, a NUL), with the problem, or None."""
    found = files_not_text(value, where, "send valid UTF-8")
    return None if found is None else f"{found[0] or 'argument'}: {found[1]}"


def _whole_numbers(value: Any) -> Any:
    """``value`` with each float that is a whole number as an integer: JSON Schema's ``integer``
    takes ``5.0``, which the strict argument models would refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def parse_args(tool: str, arguments: Mapping[str, Any] | None, model: type[BaseModel]) -> Any:
    raw = dict(arguments or {})
    problem = not_text(raw)
    if problem is not None:
        raise ToolFailure(f"{tool}: {problem}")
    number = unusable_number(raw)
    if number is not None:
        raise ToolFailure(f"{tool}: {number[0]}: {number[1]}")
    try:
        return model.model_validate(_whole_numbers(raw))
    except ValidationError as exc:
        raise ToolFailure(first_error(exc, tool)) from None


#: Where a refusal of the server's policy names a field that the debate tool holds elsewhere.
_RENAMED = {"with": "protocol", "rounds": "protocol", "protocol": "protocol", "question": "question"}
_RENAMED |= {"context": "context", "budget": "budget", "model": "model", "models": "model"}


def _refusal(exc: RequestError) -> str:
    message = exc.renamed(_RENAMED, "arguments").message
    return message.replace("GET /v1/protocols", "list_protocols").replace("GET /v1/models", "list_protocols")


# ---------------------------------------------------------------------------------- submission


def submit(settings: ServerSettings, args: DebateArgs, manager: DebateManager) -> LiveDebate:
    """The debate a call asks for, checked as ``POST /v1/debates`` is, and queued; a refusal is a
    :class:`ToolFailure` in one line, before any model call."""
    protocol, with_ = _protocol(settings, args.protocol)
    context = [c if isinstance(c, str) else c.model_dump(exclude_none=True) for c in args.context]
    try:
        body = DebateRequest.model_validate(
            {
                "protocol": protocol,
                "with": with_,
                "question": args.question,
                "context": context,
                "budget": BudgetOverrides.model_validate(args.budget.model_dump()),
                "model": args.model,
            }
        )
        prepared = prepare(body.protocol, body.question, body.chunks(), body, settings)
        # Queued as POST /v1/debates queues it: one still queued when the server stops is queued
        # again at its next start (DebateManager.recover), and get_debate finds it.
        return manager.submit_request(prepared, body)
    except ValidationError as exc:
        raise ToolFailure(first_error(exc, "debate")) from None
    except RequestError as exc:
        raise ToolFailure(f"debate: {_refusal(exc)}") from None
    except QueueFull as exc:
        raise ToolFailure(f"debate: {exc} (in about {exc.retry_after} s)") from None


def _protocol(settings: ServerSettings, text: str) -> tuple[str | dict[str, Any], dict[str, Any]]:
    """A preset's name and parameters from the one-line form; the tuned protocol's inline spec."""
    text = text.strip()
    tuned = settings.tuned
    if tuned is not None and text in tuned_names(tuned):
        return tuned.spec_data(), {}
    offered = ", ".join([*(tuned_names(tuned) if tuned is not None else ()), *preset_names()])
    try:
        call = parse_call(text)
        if call.at in ("uab", "auto"):
            raise ProtocolRefError(
                f"{text!r} is a run-level vote (moot batch, moot eval); a debate is one question: use a fixed "
                "vote such as vote@5"
            )
        if tuned is not None and call.name in tuned_names(tuned):  # (auto(rounds=2): it is as it was tuned)
            raise ProtocolRefError(
                f"{call.name!r} is the protocol moot tune chose, as it was chosen: it takes no parameters"
            )
        if call.name not in preset_names():
            hint = " (auto is the protocol moot tune chose: serve one with --tuned)" if call.name == "auto" else ""
            raise ProtocolRefError(f"no protocol {call.name!r}{hint}; use one of {offered} (list_protocols)")
        return call.name, preset_params(call, text)
    except ProtocolRefError as exc:
        raise ToolFailure(f"debate: protocol: {exc}") from None
