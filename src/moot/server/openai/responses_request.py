"""A ``POST /v1/responses`` request (:class:`ResponsesRequest`), read once into what it asks
(:func:`responses_asked`), its tools (:func:`response_tools`) and its question and context
(:func:`split_input`): every field honoured or refused by name."""

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.core.tools import Tool
from moot.core.types import ContextChunk
from moot.models.images import ImageInput
from moot.server.limits import RequestError
from moot.server.openai import open_responses
from moot.server.openai.asked import Asked
from moot.server.openai.catalogue import DebateModel
from moot.server.openai.chat_wire import NullDefault, NullFalse, OpenAIOptions, given
from moot.server.openai.conversation import (
    Split,
    content_text,
    question_and_context,
    tool_call_text,
    tool_result_header,
)
from moot.server.openai.fields import RECORDED, chat_tools
from moot.server.openai.refusals import (
    NO_OBFUSCATION,
    UNSUPPORTED_BOTH,
    invalid_at,
    refuse_unless,
    sampling_refusals,
    shown,
)
from moot.server.openai.reply_format import json_format
from moot.server.schemas import INT32_MAX, Metadata, RefusesEndpoints, WholeInt

#: The content parts of an input message that are text (an assistant's earlier reply included).
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
#: The content parts a tool's result (``function_call_output``) may be given as; any other list is the
#: tool's own JSON, read as its text.
_PARTS = TEXT_PARTS | {"input_image", "input_file", "image_url", "file"}
#: The fields of ``POST /v1/responses`` that do what OpenAI's API says (some only at the values a
#: debate can give: ``store`` false, ``top_p`` 1, ...; any other value is refused by name). Every
#: other field of the OpenAI SDK's request is refused by name when set; a test walks them all.
HONOURED = frozenset(
    {
        "input", "instructions", "model", "stream", "stream_options", "max_output_tokens", "temperature", "text",
        "reasoning", "metadata", "user", "safety_identifier", "prompt_cache_key", "store", "service_tier",
        "include", "top_p", "top_logprobs", "truncation", "tools", "tool_choice", "parallel_tool_calls",
        "previous_response_id", "background",
    }
)  # fmt: skip
#: ``include`` values this server honours: there is no encrypted reasoning to carry (the reasoning
#: items hold their text), so asking for it is asking for nothing more.
INCLUDABLE = frozenset({"reasoning.encrypted_content"})
UNSUPPORTED = {
    **UNSUPPORTED_BOTH,
    "conversation": "this server has no Conversations API objects; chain responses with previous_response_id, or "
    "send the whole conversation in input",
    "prompt": "this server has no stored prompt templates; send the instructions and input themselves",
    "max_tool_calls": "a debate decides one tool call a request; leave max_tool_calls out",
    "context_management": "this server manages a conversation's context one way, truncation: auto (the oldest "
    "messages left out when it does not fit; disabled refuses it instead); leave context_management out",
    "access_programs": "this server has no access programs; leave access_programs out",
    "background_options": "a background debate runs until it ends or is cancelled; leave background_options out",
    "image": "a debate reads and writes text only; leave image out",
}
_TRACE_SUMMARIES = (None, "auto", "concise", "detailed")


class ResponsesRequest(RefusesEndpoints):
    """``POST /v1/responses`` (the OpenAI SDK's ``client.responses.create``)."""

    # strict: a value of another JSON type is refused by name (``"store": "no"``), not converted
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    stream: NullFalse = False
    stream_options: dict[str, Any] | None = None
    #: moot's own options (the OpenAI SDK's ``extra_body={"moot": {...}}``).
    moot: NullDefault[OpenAIOptions] = Field(default_factory=OpenAIOptions)
    # Honoured (within OpenAI's ranges):
    max_output_tokens: WholeInt = Field(default=None, ge=16, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    # Kept with the stored debate's request:
    metadata: Metadata = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Honoured at the values a debate can give, refused by name at any other:
    store: bool | None = None
    service_tier: str | None = None
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: WholeInt = Field(default=None, ge=0, le=20)
    truncation: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    # Kept: the response is stored (store left out or true), continued, run in the background:
    previous_response_id: str | None = None
    background: bool | None = None
    # Refused when set:
    conversation: Any = None
    prompt: Any = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: WholeInt = None
    moderation: Any = None
    context_management: Any = None
    access_programs: Any = None
    background_options: Any = None
    image: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None


class FunctionCallItem(BaseModel):
    """A ``function_call`` input item: a tool call made earlier (the debate's, sent back with the
    history), read as context; a ``function_call_output`` answers it by its ``call_id``. Any other
    field (``id``, ``status``) is kept. Input items are typed where they are read (:func:`split_input`),
    not in :class:`ResponsesRequest`: a compaction item and a chain carry items of their own."""

    model_config = ConfigDict(extra="allow")

    call_id: Annotated[str, given(str, "the call's id, a string, as the response gave it")]
    name: Annotated[str, given(str, "the name of the tool called, a string")]
    arguments: Annotated[str, given(str, "the call's arguments as a JSON string, as the response gave them")]


class FunctionCallOutputItem(BaseModel):
    """A ``function_call_output`` input item: a tool's result, answering the call whose ``call_id`` it
    gives. Its ``output`` is text, the standard's content parts, or the tool's own JSON (read as its
    text)."""

    model_config = ConfigDict(extra="allow")

    call_id: Annotated[str, given(str, "the call_id of the function_call item it answers, a string")]
    output: Any = None


_Item = TypeVar("_Item", bound=BaseModel)


def _typed(model: type[_Item], item: dict[str, Any], where: str) -> _Item:
    """An input item as its wire type, or a 400 naming the field of it that is not (``input[1].call_id``)."""
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        raise invalid_at(exc, where) from None


def _is_part(value: Any) -> bool:
    """Whether an item of a tool's output is one of the standard's content parts (else the list is
    the tool's own JSON)."""
    return isinstance(value, dict) and isinstance(value.get("type"), str) and value["type"] in _PARTS


def responses_asked(
    req: ResponsesRequest,
    model: DebateModel,
    question: str,
    context: list[ContextChunk],
    instructions: str = "",
    *,
    images: list[ImageInput] | None = None,
) -> Asked:
    """What a Responses request asks, after refusing by name each field a debate cannot honour: its
    model (as :func:`~moot.server.openai.catalogue.debate_model` resolved it), its question and context
    (:func:`split_input`) and its fields, in one object."""
    refuse_unless(
        "background",
        not (req.background and req.store is False),
        "a background response is read back by its id, so it must be stored; leave store out (or true) or "
        "background out",
    )
    for name, why in UNSUPPORTED.items():
        refuse_unless(name, getattr(req, name) is None, why)
    tools, tool_choice = response_tools(req.tools, req.tool_choice)
    sampling_refusals({"top_p": req.top_p, "top_logprobs": req.top_logprobs})
    sampling_refusals({"service_tier": req.service_tier})
    for i, item in enumerate(req.include or []):
        refuse_unless(
            f"include[{i}]",
            item in INCLUDABLE,
            f"{item!r}: a debate's reply has nothing of that kind to include; leave it out",
        )
    refuse_unless(
        "truncation",
        req.truncation in (None, "auto", "disabled"),
        "give auto (the default here: the oldest messages are left out when the conversation does not fit the "
        "debate's prompt budget) or disabled (such a request is refused)",
    )
    options = req.stream_options or {}
    refuse_unless(
        "stream_options.include_obfuscation",
        not options.get("include_obfuscation"),
        NO_OBFUSCATION,
    )
    text = req.text or {}
    for key in set(text) - {"format", "verbosity"}:
        refuse_unless(f"text.{key}", False, "not a field of text; give format and verbosity only")
    refuse_unless(
        "text.verbosity",
        text.get("verbosity") in (None, "medium"),
        "a debate's reply is as long as its protocol writes it (bound it with max_output_tokens); leave verbosity out",
    )
    reasoning = req.reasoning or {}
    for key in set(reasoning) - {"effort", "summary", "generate_summary"}:
        refuse_unless(f"reasoning.{key}", reasoning[key] is None, "a debate has no such reasoning option; leave it out")
    refuse_unless(
        "reasoning.effort",
        reasoning.get("effort") in (None, "none"),
        "a debate's effort is its protocol (more agents or rounds: moot.with, moot.rounds); leave reasoning.effort "
        "out (reasoning.summary streams the debate's turns)",
    )
    summaries = {k: reasoning.get(k) for k in ("summary", "generate_summary")}
    for key, value in summaries.items():
        refuse_unless(f"reasoning.{key}", value in _TRACE_SUMMARIES, "give auto, concise or detailed")
    recorded = {name: getattr(req, name) for name in RECORDED if getattr(req, name, None) is not None}
    return Asked(
        protocol=model.protocol,
        question=question,
        context=context,
        images=images or [],
        instructions=instructions,
        options=req.moot,
        max_tokens=req.max_output_tokens,
        max_tokens_field="max_output_tokens",
        temperature=req.temperature,
        json=json_format(text.get("format"), "text.format", nested=False),
        trace=model.trace or req.moot.trace or any(v is not None for v in summaries.values()),
        recorded={"openai": recorded} if recorded else {},
        tools=tools,
        tool_choice=tool_choice,
        truncate=req.truncation != "disabled",
    )


def response_tools(tools: list[Any] | None, choice: Any) -> tuple[list[Tool], str]:
    """The Responses API's function tools (``{type: function, name, parameters}``) and its
    ``tool_choice``, as the chat endpoint reads them; a tool of another type is refused by its place."""
    chat: list[Any] = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            named = shown(kind) if kind else "untyped"
            refuse_unless(f"tools[{i}]", False, f"a {named} tool; a debate calls function tools only")
        function = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
        chat.append({"type": "function", "function": function})
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return chat_tools(chat, choice, flat=True)


def split_input(req: ResponsesRequest) -> Split:
    """The question (the last user message) and its context: ``instructions``, then the other messages.
    A reasoning item (a trace sent back with the history) is not context: the next debate reads the
    answers, not the last one's turns. A function call and its output (a tool loop's history) are
    context every agent reads; any other item is refused by its place."""
    instructions = (req.instructions or "").strip()
    context = [ContextChunk(text=req.instructions or "", source="instructions")] if instructions else []
    if req.input is None:
        raise RequestError("input: required; give the question (a string or a list of message items)", param="input")
    if isinstance(req.input, str):
        if not req.input.strip():
            raise RequestError("input: give the question (text)", param="input")
        return Split(req.input, context, [])
    messages: list[tuple[str, str]] = []
    files: list[list[ContextChunk]] = []  # each message's inline files, as passages
    calls: set[str] = set()  # the call ids of the function_call items so far
    pictured: list[list[ImageInput]] = []  # each message's images
    for i, item in enumerate(open_responses.expanded(req.input)):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            continue
        if kind == "function_call":  # the debate's earlier call, as the client sends it back
            call = _typed(FunctionCallItem, item, f"input[{i}]")
            calls.add(call.call_id)
            messages.append(("assistant", tool_call_text(call.name, call.arguments, call.call_id)))
            files.append([])
            pictured.append([])
            continue
        if kind == "function_call_output":
            result = _typed(FunctionCallOutputItem, item, f"input[{i}]")
            if result.call_id not in calls:  # as OpenAI's API refuses it: no call it could answer
                raise RequestError(
                    f"input[{i}].call_id: no function_call item with call_id {result.call_id!r} comes before "
                    "this output; send the function_call item it answers before it in input, or continue the response "
                    "that made the call (previous_response_id)",
                    param=f"input[{i}].call_id",
                )
            output = result.output
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            if isinstance(output, list) and output and all(_is_part(p) for p in output):
                # The standard's parts: their text is the result; an image or a file in it is refused
                # by its place (pasted as text, it passed every image check as prompt tokens).
                for j, part in enumerate(output):
                    if part["type"] not in TEXT_PARTS:
                        raise RequestError(
                            f"input[{i}].output[{j}]: {shown(part['type'])} part; a tool's result is read as text: "
                            "send an image in a user message after it",
                            param=f"input[{i}].output[{j}]",
                        )
                text = "\n".join(str(p.get("text", p.get("refusal", ""))) for p in output)
            messages.append(("tool", f"{tool_result_header(result.call_id)}\n{text}"))
            files.append([])
            pictured.append([])
            continue
        if kind != "message":
            raise RequestError(
                f"input[{i}]: a {shown(kind) if kind else 'untyped'} item; a debate reads message items only (a role "
                "and its content) and a tool loop's function_call and function_call_output items, so send the "
                "conversation as those",
                param=f"input[{i}]",
            )
        role = item.get("role")
        refuse_unless(
            f"input[{i}].role",
            role in ("user", "assistant", "system", "developer"),
            "give user, assistant, system or developer",
        )
        content = item.get("content")
        if not isinstance(content, str | list | type(None)) or (
            isinstance(content, list) and not all(isinstance(p, dict) for p in content)
        ):
            raise RequestError(f"input[{i}].content: give text or a list of content parts", param=f"input[{i}].content")
        read = content_text(content, f"input[{i}].content", TEXT_PARTS, "input_file", str(role))
        messages.append((str(role), read.text))
        files.append(read.files)
        pictured.append(read.images)
    return question_and_context(messages, files, pictured, "input", context)
