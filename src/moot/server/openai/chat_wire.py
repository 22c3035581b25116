"""The chat completions API's wire shapes: the request ``POST /v1/chat/completions`` reads, and the
completion and the chunks it answers with (the Responses API's: :mod:`.responses_request`,
:mod:`.response_objects`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from moot.server.schemas import INT32_MAX, DebateOptions, Metadata, RefusesEndpoints, ServerStatus, WholeInt

#: A JSON value's type as a refusal names it (a body's values are parsed JSON).
_JSON_TYPES: dict[type, str] = {
    dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
    type(None): "null",
}  # fmt: skip


def given(kinds: type | tuple[type, ...], what: str) -> BeforeValidator:
    """A field of the caller's history that the server reads as one of ``kinds`` (an id it matches
    calls by, an object whose fields it reads): a value of another JSON type is refused naming the
    field (its place, as pydantic locates it), saying what to give (``what``) and what came instead.
    (Read unchecked, an object as a call's id was a 500: an unhashable set member.)"""

    def check(value: Any) -> Any:
        if isinstance(value, kinds):
            return value
        came = _JSON_TYPES.get(type(value), type(value).__name__)
        raise PydanticCustomError("wrong_type", f"give {what} (not {came})")

    return BeforeValidator(check)


class ToolFunctionIn(BaseModel):
    """The function an assistant's earlier tool call called (``tool_calls[j].function``), as a
    reply gave it; read into the text every agent reads."""

    model_config = ConfigDict(extra="allow")

    name: Annotated[str, given(str, "the name of the tool called, a string")]
    arguments: Annotated[str, given(str, "the call's arguments as a JSON string, as the reply gave them")]


class ToolCallIn(BaseModel):
    """A tool call an assistant message made (OpenAI's ``messages[i].tool_calls[j]``), sent back with
    the conversation: a ``tool`` message answers it by its ``id``. Any other field is kept."""

    model_config = ConfigDict(extra="allow")

    id: Annotated[str, given(str, "the call's id, a string, as the reply gave it")]
    function: Annotated[
        ToolFunctionIn, given((dict, ToolFunctionIn), "the function called, an object with its name and arguments")
    ]


class ChatMessageIn(BaseModel):
    """A chat message as OpenAI clients send it (content as a string or a list of parts). Any other
    field a client writes is kept (``name``, ``refusal``...); ``tool_call_id`` is checked where the
    messages are read (``chat.split_messages``)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    #: An assistant message's tool calls (null, as clients that write every field send it: none).
    tool_calls: Annotated[
        list[Annotated[ToolCallIn, given((dict, ToolCallIn), "a tool call, an object with its id and function")]]
        | None,
        given((list, type(None)), "the assistant's tool calls, a list of objects each with its id and function"),
    ] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False


#: A flag an OpenAI request may send as ``null`` (the spec's "boolean or null, default false"), as
#: clients that write every optional field do: read as false.
NullFalse = Annotated[bool, BeforeValidator(lambda v: False if v is None else v)]
_Options = TypeVar("_Options", bound=BaseModel)
#: moot's options object, which such a client may send as ``null``: read as none given.
NullDefault = Annotated[_Options, BeforeValidator(lambda v: {} if v is None else v)]


class OpenAIOptions(DebateOptions):
    """The ``moot`` field of the OpenAI-shaped endpoints: the debate options of ``POST /v1/debates``,
    and ``trace``."""

    #: Stream (and return) the debate's turns as reasoning (``delta.reasoning_content`` on chat
    #: completions, reasoning items on responses); the model name ``moot/<protocol>:trace`` says the same.
    trace: bool = False


class ChatCompletionRequest(RefusesEndpoints):
    """``POST /v1/chat/completions``. Each of OpenAI's fields does what its API says or is refused by
    name (:mod:`moot.server.openai.fields`; the table in docs/serve.md)."""

    # strict: a value of another JSON type is refused by name (``"stream": "yes"``), not converted
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: NullFalse = False
    stream_options: StreamOptions | None = None
    #: moot's own options (the OpenAI SDK's ``extra_body={"moot": {...}}``).
    moot: NullDefault[OpenAIOptions] = Field(default_factory=OpenAIOptions)
    # Honoured (each within OpenAI's range, as its API checks it):
    max_tokens: WholeInt = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: WholeInt = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: WholeInt = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    # Kept with the stored debate's request:
    user: str | None = None
    metadata: Metadata = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Honoured at the values a debate can give, refused by name at any other:
    n: WholeInt = Field(default=None, ge=1, le=128)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    logprobs: bool | None = None
    top_logprobs: WholeInt = Field(default=None, ge=0, le=20)
    store: bool | None = None
    service_tier: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    tool_choice: Any = None
    # Refused when set:
    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None


class PromptTokensDetails(BaseModel):
    #: Prompt tokens the models' servers read from their prompt caches (summed over the debate's calls).
    cached_tokens: int = 0


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


def _without_unset_reasoning(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("reasoning_content", "tool_calls"):
        if data.get(key) is None:
            data.pop(key, None)
    return data


class FunctionCallOut(BaseModel):
    name: str
    #: The arguments as a JSON string, as OpenAI's API sends them.
    arguments: str


class ToolCallOut(BaseModel):
    """A tool call the debate decided on (OpenAI's ``message.tool_calls[]``)."""

    #: Only in a streamed chunk's delta: the call's position.
    index: int | None = None
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("index") is None:
            data.pop("index", None)
        return data


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    #: The debate's turns, when the request asked for them (left out of the JSON otherwise).
    reasoning_content: str | None = None
    #: The tool call the debate decided on, when the request carried tools (left out otherwise).
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset_reasoning(handler(self))


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str = "stop"


class MootInfo(BaseModel):
    """The debate behind a chat completion."""

    debate_id: str
    protocol: str
    status: ServerStatus
    stop_reason: str | None = None
    calls: int
    rounds: int
    elapsed_s: float
    url: str
    #: The debate's cost in US dollars at the server's prices (None: a model without a price).
    cost_usd: float | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    system_fingerprint: str | None = None
    moot: MootInfo


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    #: The debate's turns as they are generated, when the request asked for them (left out otherwise).
    reasoning_content: str | None = None
    #: The decided tool call, in one chunk (left out otherwise).
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset_reasoning(handler(self))


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: ChatUsage | None = None
    moot: MootInfo | None = None
