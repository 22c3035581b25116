"""What the OpenAI-shaped endpoints (``/v1/chat/completions``, ``/v1/responses``) do with each
request field: a client gets the behaviour a field asks for, or a 400 that names the field, never
silence. A chat completion request is read here, once, into what it asks (:func:`chat_asked`); a
Responses request in :mod:`moot.server.openai.responses_request`.

- **The model**: ``moot/<protocol>``; ``moot/<protocol>:trace`` also streams the debate's turns as
  reasoning (for chat UIs that cannot add a body field).
- **The reply** (:class:`Asked`): a token bound (``max_tokens``, ``max_completion_tokens``,
  ``max_output_tokens``) and stop sequences bound the decision's reply; a JSON schema
  (``response_format``, ``text.format``) types it.
- **Sampling**: ``temperature`` is every call's of the debate; ``seed`` seeds each agent
  (``seed + i``), so that the same request repeats its debate where the backend is deterministic.
- **Identifiers** (``metadata``, ``user``, ``safety_identifier``, ``prompt_cache_key``) are kept with
  the stored debate's request, as OpenAI keeps them; they change nothing in the answer.

Everything else a debate cannot do is refused by its own name (:func:`~moot.server.openai.refusals.refuse_unless`).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from pydantic import ValidationError

from moot.core.tools import MAX_TOOLS, MAX_TOOLS_BYTES, Tool
from moot.core.types import ContextChunk
from moot.core.user_schemas import SchemaProblem
from moot.files import field_path, first_error
from moot.models.images import ImageInput
from moot.server.openai.asked import Asked, stops
from moot.server.openai.catalogue import DebateModel
from moot.server.openai.catalogue import check_tuned as check_tuned  # re-exported: cli/serve.py imports it from here
from moot.server.openai.catalogue import model_card as model_card  # re-exported: http/routes.py uses it from here
from moot.server.openai.chat_wire import ChatCompletionRequest
from moot.server.openai.refusals import (
    NO_OBFUSCATION,
    UNSUPPORTED_BOTH,
    FieldRefusal,
    no_legacy_functions,
    refuse_unless,
    sampling_refusals,
)
from moot.server.openai.reply_format import json_format
from moot.server.openai.submission import cost_headers as cost_headers  # re-exported: http/routes.py uses it

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
    **UNSUPPORTED_BOTH,
    "reasoning_effort": "a debate's effort is its protocol (more agents or rounds: moot.with, moot.rounds); leave "
    "reasoning_effort out",
    "prediction": "a debate's reply is new text, not an edit of a predicted one; leave prediction out",
    "web_search_options": "a debate searches nothing; leave web_search_options out (give passages as messages)",
    "audio": "a debate answers in text only; leave modalities and audio out",
}


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
            first = first_error(exc)
            cause = (first.get("ctx") or {}).get("error")
            if isinstance(cause, SchemaProblem) and cause.field:
                raise FieldRefusal(f"{where}.{cause.field}: {cause.problem}", f"{where}.{cause.field}") from None
            field_name = field_path(first["loc"])
            at = f"{where}.{field_name}" if field_name else where
            raise FieldRefusal(f"{at}: {first['msg'].removeprefix('Value error, ')}", at) from None
    if choice is None:
        name = "auto"
    elif isinstance(choice, str) and choice in ("auto", "none", "required"):
        name = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice["function"].get("name"):
        name = str(choice["function"]["name"])
    else:
        shape = "{'type': 'function', 'name': ...}" if flat else "{'type': 'function', 'function': {'name': ...}}"
        raise FieldRefusal(f"tool_choice: auto, none, required, or {shape}", "tool_choice")
    if name not in ("auto", "none") and not out:
        raise FieldRefusal("tool_choice: it asks for a tool call, but the request has no tools; send them in tools",
                           "tool_choice")  # fmt: skip
    if out and name not in ("auto", "none", "required") and name not in {t.name for t in out}:
        raise FieldRefusal(f"tool_choice: {name!r} names no tool of this request", "tool_choice")
    return (out if name != "none" else []), name


def chat_asked(
    req: ChatCompletionRequest,
    model: DebateModel,
    question: str,
    context: list[ContextChunk],
    instructions: str = "",
    *,
    images: list[ImageInput] | None = None,
) -> Asked:
    """What a chat completion request asks, after refusing by name each field a debate cannot honour:
    its model (as :func:`~moot.server.openai.catalogue.debate_model` resolved it), its question and
    context (as :func:`~moot.server.openai.chat.split_messages` read them) and its fields, in one
    object."""
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
    refuse_unless(  # (as OpenAI's API refuses it: the options of a stream that is not one)
        "stream_options",
        options is None or bool(req.stream),
        "stream_options apply to a streamed reply only; set stream: true or leave stream_options out",
    )
    refuse_unless(
        "stream_options.include_obfuscation",
        options is None or not (options.model_extra or {}).get("include_obfuscation"),
        NO_OBFUSCATION,
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
        protocol=model.protocol,
        question=question,
        context=context,
        images=images or [],
        instructions=instructions,
        options=req.moot,
        max_tokens=bound,
        max_tokens_field=bound_field,
        temperature=req.temperature,
        seed=req.seed,
        stop=stops(req.stop),
        json=json_format(req.response_format, "response_format", nested=True),
        trace=model.trace or req.moot.trace,
        recorded={"openai": recorded} if recorded else {},
        tools=tools,
        tool_choice=tool_choice,
    )
