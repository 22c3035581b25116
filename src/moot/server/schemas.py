"""Pydantic models of every request and response of the HTTP API (and of the SSE event data)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from moot.core.types import (
    ContextChunk,
    DebateCost,
    DebateQuality,
    DebateResult,
    Dynamics,
    check_passages,
    check_question,
)
from moot.models.base import Usage
from moot.models.images import MAX_IMAGES, ImageInput
from moot.server.limits import RequestError, refuse_endpoints
from moot.structured import ParseFailure

INT32_MAX = 2**31 - 1

ServerStatus = Literal["queued", "running", "complete", "failed", "timeout", "cancelled", "interrupted"]
FINISHED: frozenset[str] = frozenset({"complete", "failed", "timeout", "cancelled", "interrupted"})


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    #: The request field at fault, when there is one.
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx body (the OpenAI error shape, so its SDK shows the message)."""

    error: ErrorDetail


# ------------------------------------------------------------------------------------- debates


def _whole(value: Any) -> Any:
    """A whole-number float (``5.0``) as the integer it is: JSON Schema's ``integer`` takes it, and
    some clients send one (the MCP tools take it too). Anything else is left to the strict check."""
    # (not past 64 bits: the body reader bounds an integer literal's digits, and 1e300 is one)
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**63 else value


#: An optional integer field of a request body: strict (``"5"`` and ``true`` are refused), ``5.0``
#: taken as 5. (Its bounds go in the field's ``Field(ge=..., le=...)``: so annotated, the OpenAPI schema
#: gives them as ``minimum``/``maximum``.)
WholeInt = Annotated[int | None, BeforeValidator(_whole)]


class BudgetOverrides(BaseModel):
    """Budget of one debate; each value is capped by the server's limits."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_tokens_per_turn: WholeInt = Field(
        default=None, ge=1, description="The most tokens of each turn, a synthesis's or a judge's included"
    )
    max_calls: WholeInt = Field(default=None, ge=1)
    max_total_tokens: WholeInt = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)


class DebateOptions(BaseModel):
    """What a debate may set besides the protocol and the question (also the ``moot`` field of a
    chat completion request)."""

    # strict: a value of another JSON type is refused by name (``"rounds": true`` is not 1), as
    # OpenAI's API refuses it, not converted (tests/test_fuzz_openai.py)
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    #: Parameters of a preset (``{"agents": 5, "rounds": 3}``).
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    #: The debate's default model: one of the server's models (default: its first).
    model: str | None = None
    #: Models by participant id or role (or ``decision``): each one of the server's models.
    models: dict[str, str] = Field(default_factory=dict)
    rounds: WholeInt = Field(default=None, ge=1)
    budget: BudgetOverrides = Field(default_factory=BudgetOverrides)


class QualityRequest(BaseModel):
    """Seed 004's quality of the finished debate (docs/quality.md), added to its result."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: One of the server's models, for the judged dimensions (logical consistency, reasoning depth);
    #: without one they are absent from ``scores`` with the reason in ``unmeasured``.
    judge_model: str | None = None


class RefusesEndpoints(BaseModel):
    """A request body that may never choose an endpoint or a credential, at any depth."""

    @model_validator(mode="before")
    @classmethod
    def _no_endpoints(cls, data: Any) -> Any:
        refuse_endpoints(data)
        return data


#: OpenAI's limits on a request's ``metadata`` (its API refuses more): keys, and characters of a key
#: and of a value.
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


#: The keys of a response's ``metadata`` that are the server's (the debate's id and viewer link).
SERVER_METADATA = ("moot_debate_id", "moot_url")


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """``metadata`` within OpenAI's limits (16 keys of at most 64 characters, values of at most 512),
    as its API checks it: more is a 400 naming the limit, not a request stored as it came. The keys
    the server sets (:data:`SERVER_METADATA`) are left out: a client that sends a response's metadata
    back (16 keys of its own, and the server's two) is not refused, and they are set again."""
    if value is None:
        return None
    value = {k: v for k, v in value.items() if k not in SERVER_METADATA}
    if len(value) > METADATA_KEYS:
        raise RequestError(
            f"metadata: {len(value)} keys is over the limit of {METADATA_KEYS}; send at most {METADATA_KEYS}",
            param="metadata",
        )
    for key, text in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise RequestError(
                # (its start only, 8 characters: too little of a key pasted there to be of use, or redacted)
                f"metadata: the key {key[:8]!r}... is {len(key)} characters, over the limit of {METADATA_KEY_CHARS}; "
                "shorten it",
                param="metadata",
            )
        if len(text) > METADATA_VALUE_CHARS:
            raise RequestError(
                f"metadata.{key}: {len(text)} characters is over the limit of {METADATA_VALUE_CHARS} for a value; "
                "shorten it",
                param=f"metadata.{key}",
            )
    return value


#: A request's ``metadata``: string values, within OpenAI's limits (:func:`check_metadata`).
Metadata = Annotated[dict[str, str] | None, AfterValidator(check_metadata)]


class DebateRequest(DebateOptions, RefusesEndpoints):
    """``POST /v1/debates``."""

    #: A preset name, or an inline spec in the form of a protocol YAML file (a spec, or
    #: ``{"preset": ..., "with": ..., <overrides>}``).
    protocol: str | dict[str, Any] = "affirmative-critical"
    question: Annotated[str, AfterValidator(check_question)] = Field(min_length=1)
    context: list[ContextChunk | str] = Field(default_factory=list)

    @field_validator("context")
    @classmethod
    def _passages_not_blank(cls, v: list[ContextChunk | str]) -> list[ContextChunk | str]:
        check_passages([ContextChunk(text=c) if isinstance(c, str) else c for c in v])
        return v

    #: Images shown with the question to every agent (and a decision that calls a model): each a
    #: ``data:image/...;base64`` URL or an https address the model's server fetches (this one never
    #: does). The debate's models must read images: a text-only one is refused, as ``images``.
    images: list[ImageInput] = Field(default_factory=list, max_length=MAX_IMAGES)
    #: The known right answer (enables flip counts in the dynamics).
    reference: str | None = None
    #: ``true`` (or ``{"judge_model": ...}``): the result carries seed 004's quality dimensions.
    quality: bool | QualityRequest = False

    def quality_request(self) -> QualityRequest | None:
        if self.quality is False:
            return None
        return QualityRequest() if self.quality is True else self.quality

    def chunks(self) -> list[ContextChunk]:
        return [ContextChunk(text=c) if isinstance(c, str) else c for c in self.context]


class Links(BaseModel):
    self: str
    events: str
    result: str
    viewer: str


class DebateCreated(BaseModel):
    """``202 Accepted``: the debate is queued; follow ``links.events``."""

    id: str
    status: ServerStatus
    links: Links


class DebateFields(BaseModel):
    """A debate's columns as the API shows them: the store's row
    (:class:`~moot.server.state.StoredDebate`) is these, its order in the list and its result."""

    id: str
    status: ServerStatus
    protocol: str
    question: str
    model: str
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    calls: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    error: str | None = None

    def shown(self) -> dict[str, Any]:
        """These fields alone (a subclass's own left out), validated already."""
        return {name: getattr(self, name) for name in DebateFields.model_fields}


class DebateSummary(DebateFields):
    links: Links


class DebateInfo(DebateSummary):
    """``GET /v1/debates/{id}``: the status, and the result in its versioned JSON form (partial
    while the debate runs; None while it waits in the queue)."""

    result: DebateResult | None = None


class DebatePage(BaseModel):
    debates: list[DebateSummary]
    #: Pass as ``cursor`` for the next (older) page; None on the last page.
    next_cursor: str | None = None


class ProtocolInfo(BaseModel):
    name: str
    description: str
    calls: int
    rounds: int
    participants: list[str]
    decision: str


class ProtocolList(BaseModel):
    protocols: list[ProtocolInfo]


class ViewerSession(BaseModel):
    """``POST /v1/session``'s answer: the viewer's bearer until it expires (None: the server needs no
    key, or none was given), never the key."""

    token: str | None
    expires_in: int = Field(description="seconds the token is taken for")


class ModelCard(BaseModel):
    """An entry of ``GET /v1/models`` (the OpenAI shape): ``moot/<preset>``, with what it accepts."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "moot"
    description: str = ""
    #: The protocol the name runs (a preset's name; a tuned protocol's label).
    protocol: str = ""
    #: How it decides (``vote``, ``synthesize``, ``judge``, ``select``, ``rule``).
    decision: str = ""
    #: The model calls one request makes as planned (more rounds or a retry may add some).
    calls: int = 0
    #: Whether a request may send ``tools`` (its agents propose calls; a vote picks one, or answering).
    accepts_tools: bool = False
    #: Whether a request may ask for a typed reply (``response_format``, ``text.format``).
    accepts_typed_output: bool = False
    #: False for an application's protocol (ABSA's): its turns answer that application's own task,
    #: not a chat's question; such models are listed apart (``ModelList.applications``).
    chat: bool = True
    #: A protocol ``moot tune`` chose (``moot/auto``): the evidence it wrote (left out for the others).
    tuned: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("tuned") is None:
            data.pop("tuned", None)
        return data


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    #: The chat models: every general protocol (and each again with ``:trace``).
    data: list[ModelCard]
    #: The applications' protocols (ABSA's), which answer to a name too but are no chat models.
    applications: list[ModelCard] = Field(default_factory=list)
    #: The model specs the debates run on (the first is the default); a request may name these.
    backends: list[str]
    default_backend: str


# ------------------------------------------------------------------------------ event payloads


class Totals(BaseModel):
    calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    #: Of ``prompt_tokens``, those the models' servers read from their prompt caches.
    cached_prompt_tokens: int = 0
    elapsed_s: float


class DebateStartedData(BaseModel):
    id: str
    protocol: str
    question: str
    participants: list[dict[str, Any]]
    rounds: int
    decision: str
    context_passages: int


class ResumedData(BaseModel):
    """A debate goes on on another replica (``moot serve`` replicas sharing a PostgreSQL store), from
    its recorded transcript: announced instead of a second ``debate_started``."""

    #: The replica running it now, and the one whose lease expired or that handed it back (None: unknown).
    replica: str
    previous_replica: str | None
    #: The finished turns kept (neither run nor paid again), and the round it goes on in.
    kept_turns: int
    round: int


class TurnStartedData(BaseModel):
    speaker: str
    name: str
    round: int
    kind: str


class TokenData(BaseModel):
    speaker: str
    round: int
    text: str


class TurnRetryData(BaseModel):
    speaker: str
    round: int
    attempt: int
    error: str


class TurnView(BaseModel):
    """A turn as the events carry it: everything but the messages sent (the result has those)."""

    speaker: str
    name: str
    role: str = ""
    round: int
    kind: str
    model: str
    text: str | None = None
    #: A typed turn's reply as its model wrote it (the JSON it streamed; ``text`` is what the others
    #: see); None for a turn in text, whose ``text`` is its reply.
    raw: str | None = None
    parsed: dict[str, Any] | None = None
    parse_failure: ParseFailure | None = None
    usage: Usage = Field(default_factory=Usage)
    calls: int = 0
    latency_s: float = 0.0
    #: Why the model stopped: ``length`` is a reply cut at its token limit (it may end mid-sentence).
    finish_reason: str | None = None
    trimmed: bool = False
    carried: bool = False
    error: str | None = None


class TurnDoneData(BaseModel):
    turn: TurnView
    totals: Totals


class RoundDoneData(BaseModel):
    round: int
    answers: dict[str, str | None]
    majority: str | None = None
    agreement: float | None = None
    changed: int = 0
    errors: int = 0
    parse_failures: int = 0
    warnings: list[str] = Field(default_factory=list)
    totals: Totals


class DebateDoneData(BaseModel):
    status: ServerStatus
    stop_reason: str | None = None
    final_answer: str | None = None
    decision: dict[str, Any] | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    dynamics: Dynamics | None = None
    totals: Totals
    #: Seed 004's quality, when the request asked for it.
    quality: DebateQuality | None = None
    #: Tokens per model, US dollars at the server's prices (``--prices``), and against one call.
    cost: DebateCost | None = None
