"""Typed turns: a pydantic schema out, parse + repair + validate in, an explicit failure otherwise.

The schema is sent as ``response_format`` (llama.cpp enforces it by grammar; OpenAI-compatible
servers use structured outputs; a server that rejects it gets the schema in the prompt instead).
The reply is parsed leniently with ``json-repair`` and validated with pydantic. A reply that does
not validate gets one repair request (the validation error is shown to the model); if that fails
too, the outcome is a :class:`ParseFailure`: never a silent default.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import operator
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Literal, get_args, get_origin

import json_repair
import orjson
from pydantic import BaseModel, ValidationError, create_model
from pydantic_core import PydanticUndefined

from moot.files import scrub_surrogates
from moot.models.base import BaseChatModel, ChatRequest, ChatResponse, Message, RetryCallback, TokenCallback

#: The named schemas specs refer to (YAML ``turn.schema: NAME``), for the process's life. A schema of
#: one debate's own (a server request's tools and reply format) is never here: it goes to the
#: debate's engine as a value (``Engine(..., schemas={name: schema})``), looked up there first.
_SCHEMAS: dict[str, type[BaseModel]] = {}


class ParseFailure(BaseModel):
    """A typed reply that could not be parsed or validated, kept with what the model said."""

    error: str
    raw: str
    attempts: int = 1


class StructuredOutcome(BaseModel):
    """The result of a typed call: the value, or the failure, and every response it took."""

    value: dict[str, Any] | None = None
    failure: ParseFailure | None = None
    responses: list[ChatResponse]

    @property
    def ok(self) -> bool:
        return self.failure is None


def register_schema(name: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Make a schema usable by name in protocol specs (YAML ``turn.schema: NAME``)."""
    existing = _SCHEMAS.get(name)
    if existing is not None and existing is not schema:
        raise ValueError(f"a different schema is already registered as {name!r}")
    _SCHEMAS[name] = schema
    return schema


def unregister_schema(name: str) -> None:
    """Forget a registered schema; a name not registered is nothing to forget."""
    _SCHEMAS.pop(name, None)


def get_schema(name: str) -> type[BaseModel]:
    try:
        return _SCHEMAS[name]
    except KeyError:
        known = ", ".join(schema_names()) or "none"
        raise KeyError(f"no turn schema named {name!r} (registered: {known})") from None


def schema_names() -> list[str]:
    """The names a protocol may use."""
    return sorted(_SCHEMAS)


def with_fixed_schema(schema: type[BaseModel], json_schema: dict[str, Any]) -> type[BaseModel]:
    """``schema`` whose JSON schema is ``json_schema``, written once (a large one, a request's tools,
    is sent with every turn; pydantic would write it anew each time)."""
    text = json.dumps(json_schema)

    def model_json_schema(cls: type[BaseModel], *args: Any, **kwargs: Any) -> dict[str, Any]:
        fixed: dict[str, Any] = json.loads(text)
        return fixed

    fixed: type[BaseModel] = type(schema.__name__, (schema,), {"model_json_schema": classmethod(model_json_schema)})
    fixed.__qualname__ = schema.__qualname__
    return fixed


#: How a typed turn reads to the other agents: ``view(parsed, speaker_id) -> text``.
View = Callable[[dict[str, Any], str], str]
_VIEWS: dict[str, View] = {}


def register_view(name: str, view: View) -> View:
    """Make a view usable by name in protocol specs (YAML ``turn.view: NAME``)."""
    _VIEWS[name] = view
    return view


def get_view(name: str) -> View:
    try:
        return _VIEWS[name]
    except KeyError:
        known = ", ".join(sorted(_VIEWS)) or "none"
        raise KeyError(f"no turn view named {name!r} (registered: {known})") from None


def restrict(
    schema: type[BaseModel],
    choices: Mapping[str, Sequence[str]],
    drop: Collection[str] = (),
    require: Collection[str] = (),
    max_items: Mapping[str, int] | None = None,
) -> type[BaseModel]:
    """A copy of ``schema`` whose fields named in ``choices`` (at any depth, through nested models
    and lists of them) only accept the given strings, without the defaulted fields in ``drop``,
    and with the fields in ``require`` required. Sent as a turn's schema, it makes a
    grammar-constrained model *copy* one of the choices (say, a word of the sentence) instead of
    inventing one; its values validate against the original schema. (Requiring a list field
    matters to small models: left optional, qwen2.5-0.5b answered it with an empty list.)

    ``max_items`` bounds list fields by name in the JSON schema only (``maxItems``, which
    llama.cpp's grammar enforces): a small model otherwise repeats list items until its token
    budget runs out. Validation does not enforce it; :func:`truncate_lists` cuts a longer list
    from a backend without grammars. Meant for plain ``list[...]`` fields: on an optional list
    pydantic puts ``maxItems`` beside the ``anyOf``, where llama.cpp does not read it."""
    bounds = dict(max_items or {})
    fields: dict[str, Any] = {}
    for name, info in schema.model_fields.items():
        if name in drop and not info.is_required():
            continue
        ann = info.annotation
        new: Any = ann
        if choices.get(name):
            lit = Literal[tuple(choices[name])]  # type: ignore[valid-type]
            new = lit | None if type(None) in get_args(ann) else lit
        else:
            new = _restrict_type(ann, lambda m: restrict(m, choices, drop, require, bounds))
        if new is ann and name not in require and name not in bounds:
            fields[name] = (ann, info)
            continue
        narrowed = copy.copy(info)
        narrowed.annotation = new
        if name in require:
            narrowed.default, narrowed.default_factory = PydanticUndefined, None
        if name in bounds:
            extra = narrowed.json_schema_extra if isinstance(narrowed.json_schema_extra, dict) else {}
            narrowed.json_schema_extra = {**extra, "maxItems": bounds[name]}
        fields[name] = (new, narrowed)
    model: type[BaseModel] = create_model(schema.__name__, __config__=schema.model_config, **fields)
    return model


def fingerprint(parts: Any) -> str:
    """A short, stable hash of what is asked (prompts, schemas, specs as JSON): a durable run
    stores it and refuses to resume under another one, so that its results are not asked two ways."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def truncate_lists(value: Any, max_items: Mapping[str, int]) -> Any:
    """``value`` (parsed JSON) with the lists under the keys of ``max_items``, at any depth, cut
    to their bound: what :func:`restrict`'s ``maxItems`` asks of a backend that cannot enforce it."""
    if isinstance(value, dict):
        return {
            k: (truncate_lists(v, max_items)[: max_items[k]] if k in max_items and isinstance(v, list)
                else truncate_lists(v, max_items))
            for k, v in value.items()
        }  # fmt: skip
    if isinstance(value, list):
        return [truncate_lists(v, max_items) for v in value]
    return value


def _restrict_type(t: Any, inner: Callable[[type[BaseModel]], type[BaseModel]]) -> Any:
    """``t`` with every model in it (bare, in a list, in an optional) replaced by ``inner(model)``;
    ``t`` itself when it holds none."""
    if _is_model(t):
        return inner(t)
    args = get_args(t)
    if get_origin(t) is list and args and _is_model(args[0]):
        return list[inner(args[0])]  # type: ignore[misc]
    if args and type(None) in args and any(_is_model(a) for a in args):
        narrowed = [inner(a) if _is_model(a) else a for a in args]
        return functools.reduce(operator.or_, narrowed)
    return t


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


_JSON_SCHEMAS: weakref.WeakKeyDictionary[type[BaseModel], tuple[bytes, Callable[[bytes], Any]]] = (
    weakref.WeakKeyDictionary()
)


def json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """``schema``'s JSON schema, a fresh copy each time (the caller may change it). Pydantic writes
    it anew at each call, about 0.2 ms, which every typed turn paid: it is written once per class
    (a class made for one request, a caller's schema, is forgotten with it)."""
    kept = _JSON_SCHEMAS.get(schema)
    if kept is None:
        written = schema.model_json_schema()
        try:
            kept = _JSON_SCHEMAS[schema] = (orjson.dumps(written), orjson.loads)
        except TypeError:  # an integer past 64 bits (a caller's "maximum": 99999999999999999999), which
            # orjson neither writes nor reads back as an integer: the standard library's JSON, exact
            kept = _JSON_SCHEMAS[schema] = (json.dumps(written).encode(), json.loads)
    text, load = kept
    fresh: dict[str, Any] = load(text)
    return fresh


def _short(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def parse_reply(text: str, schema: type[BaseModel]) -> BaseModel | ParseFailure:
    """Parse ``text`` leniently as JSON and validate it against ``schema``."""
    stripped = text.strip()
    if not stripped:
        return ParseFailure(error="empty reply", raw=text)
    try:
        data = scrub_surrogates(json_repair.loads(stripped))  # a "\udfff" escape: U+FFFD, writable
    except Exception as exc:  # json_repair raises rarely, but it is third-party code on model output
        return ParseFailure(error=f"not JSON: {exc}", raw=text)
    if not isinstance(data, dict):
        return ParseFailure(error=f"expected a JSON object, got {type(data).__name__}", raw=text)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        return ParseFailure(error=_short(exc), raw=text)


#: Where a JSON schema holds more schemas: by name, in a list, or one (``items`` may also be a list).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains")


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The schemas directly inside a schema, each with the keyword that holds it (a property named
    ``items`` is a property, not the keyword)."""
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from ((key, v) for v in node[key].values() if isinstance(v, dict))
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from ((key, v) for v in node[key] if isinstance(v, dict))
    for key in _SCHEMA_ONE:
        value = node.get(key)
        if isinstance(value, dict):
            yield key, value
        elif key == "items" and isinstance(value, list):  # (an older draft's tuple)
            yield from (("prefixItems", v) for v in value if isinstance(v, dict))


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any] | None:
    """A local ``$ref`` (``#/$defs/Point``) in ``root``, else None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _free_strings(
    node: dict[str, Any], root: dict[str, Any], times: int = 1, refs: frozenset[str] = frozenset()
) -> Iterator[tuple[dict[str, Any], int]]:
    """The schema's free-text string nodes (not enums, constants, patterns or formats), each with how
    many times a reply may hold it from here: an array's items its ``maxItems`` times (nested arrays
    multiplied; :func:`shorten_strings` has bounded every array first), a definition as often as it is
    referred to (``$ref``, not followed into itself again: a recursive schema)."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref not in refs and (target := _resolve(root, ref)) is not None:
        yield from _free_strings(target, root, times, refs | {ref})
    if node.get("type") == "string" and not {"enum", "const", "pattern", "format"} & node.keys():
        yield node, times
    most = node.get("maxItems")
    for key, sub in _subschemas(node):
        if key in ("$defs", "definitions"):
            continue  # reached through the references to them
        yield from _free_strings(sub, root, times * most if key == "items" and isinstance(most, int) else times, refs)


#: The most items an array may hold in the retry after a cut reply (unless the schema asks for more):
#: a small model repeats an array's items until its tokens run out, and a longer bound on each string
#: does not stop that.
RETRY_MAX_ITEMS = 3


def _is_array(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    if kind is None:
        return "items" in node or "prefixItems" in node
    return kind == "array" or (isinstance(kind, list) and "array" in kind)


def _bound_arrays(node: dict[str, Any]) -> None:
    if _is_array(node):
        least, most = node.get("minItems"), node.get("maxItems")
        least = least if isinstance(least, int) else 0
        most = min(most, RETRY_MAX_ITEMS) if isinstance(most, int) else RETRY_MAX_ITEMS
        node["maxItems"] = max(least, most)
    for _, sub in _subschemas(node):
        _bound_arrays(sub)


def shorten_strings(schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A copy of ``schema`` whose free-text strings together fit in ``max_tokens`` tokens.

    Used for the retry after a reply was cut at the token limit: the llama.cpp grammar enforces
    ``maxLength`` and ``maxItems``, so there the retry cannot run long again (elsewhere the bounds
    are a hint). Every array holds at most :data:`RETRY_MAX_ITEMS` items (or its ``minItems``), and
    each string gets an equal share of ``max_tokens`` characters, counted as often as a reply may
    hold it (in an array: its most items), one share kept for the JSON around them: a token is at
    least one character in Latin-script text and digits (one token a digit in Qwen's vocabulary),
    though a Hangul character can take more, so the bound is a strong one, not exact. The share is
    at least 4 characters. A tighter bound already in the schema is kept. Validation still uses the
    original schema."""
    shortened = copy.deepcopy(schema)
    _bound_arrays(shortened)
    found = list(_free_strings(shortened, shortened))  # (a node reached twice, through two references, counts twice)
    limit = max(4, max_tokens // (sum(times for _, times in found) + 1))
    for node in {id(node): node for node, _ in found}.values():
        node["maxLength"] = min(node.get("maxLength", limit), limit)
    return shortened


def repair_messages(messages: list[Message], raw: str, error: str, *, truncated: bool = False) -> list[Message]:
    """The repair request: the failed reply and what was wrong with it.

    A reply cut at the token limit is different: its validation error ("answer: Field required")
    only says the JSON never closed, and showing a small model its own cut reply primes it to
    write the same again (qwen2.5-0.5b repeated a runaway digit string word for word). So the
    request is asked afresh, with a note on the last user message to keep the text fields short
    (and :func:`complete_structured` tightens the schema's strings, see :func:`shorten_strings`)."""
    if truncated:
        note = (
            "\n\n(An earlier reply to this was cut off at the token limit before its JSON object was complete. "
            "Keep every text field short, a few sentences at most.)"
        )
        last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last is None:
            return [*messages, Message(role="user", content=note.strip())]
        return [
            *messages[:last],
            messages[last].model_copy(update={"content": messages[last].content + note}),
            *messages[last + 1 :],
        ]
    ask = (
        f"That reply does not match the required JSON schema ({error}). "
        "Reply again with only the corrected JSON object."
    )
    return [*messages, Message(role="assistant", content=raw), Message(role="user", content=ask)]


def _whole(reply: ChatResponse, parsed: BaseModel | ParseFailure) -> BaseModel | ParseFailure:
    """``parsed``, unless the reply was cut at its token limit before its JSON closed: the lenient
    parse closes it, and the value it was cut in is kept cut short (``"answer": 2`` of a 260), so
    it is a failure to repair, not an answer."""
    if reply.finish_reason != "length" or _closes(reply.text):
        return parsed
    if isinstance(parsed, ParseFailure):  # the cut is why it did not parse ("got list" said nothing of it)
        return ParseFailure(error=f"cut at the token limit before its JSON closed ({parsed.error})", raw=reply.text)
    return ParseFailure(error="cut at the token limit before its JSON closed: a value may be cut short", raw=reply.text)


def _closes(text: str) -> bool:
    """Whether ``text`` holds a whole JSON object from its first ``{`` (a BOM, a code fence or prose
    around it, as a model prompted with the schema writes it, do not matter)."""
    start = text.find("{")
    if start < 0:
        return False
    try:
        json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return False
    return True


async def complete_structured(
    model: BaseChatModel,
    request: ChatRequest,
    schema: type[BaseModel],
    on_token: TokenCallback | None = None,
    *,
    repair: bool = True,
    on_retry: RetryCallback | None = None,
    on_repair: Callable[[], None] | None = None,
) -> StructuredOutcome:
    """One typed completion, with at most one repair request (``on_repair`` is told just before it
    is made, so a caller whose call is cut knows how many were made)."""
    typed = request.model_copy(update={"response_schema": json_schema(schema), "schema_name": schema.__name__})
    first = await model.complete(typed, on_token, on_retry)
    parsed = _whole(first, parse_reply(first.text, schema))
    if not isinstance(parsed, ParseFailure):
        return StructuredOutcome(value=parsed.model_dump(mode="json"), responses=[first])
    if not repair:
        return StructuredOutcome(failure=parsed, responses=[first])
    truncated = first.finish_reason == "length"
    update: dict[str, Any] = {
        "messages": repair_messages(typed.messages, first.text, parsed.error, truncated=truncated)
    }
    if truncated and typed.max_tokens:
        update["response_schema"] = shorten_strings(typed.response_schema or {}, typed.max_tokens)
    retry = typed.model_copy(update=update)
    if on_repair is not None:
        on_repair()
    second = await model.complete(retry, on_token, on_retry)
    reparsed = _whole(second, parse_reply(second.text, schema))
    if not isinstance(reparsed, ParseFailure):
        return StructuredOutcome(value=reparsed.model_dump(mode="json"), responses=[first, second])
    return StructuredOutcome(
        failure=ParseFailure(error=reparsed.error, raw=second.text, attempts=2), responses=[first, second]
    )


def dumps_compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
