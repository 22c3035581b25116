"""A typed reply: the JSON schema a request asks the reply in (``response_format``,
``text.format``), checked, made a model, and the protocol whose decision writes it."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import best_match
from pydantic import BaseModel, ConfigDict, model_validator

from moot.core.spec import (
    JudgeDecision,
    ProtocolSpec,
    SynthesizeDecision,
    decision_noun,
)
from moot.core.user_schemas import SchemaProblem, UserSchema, check_user_schema, is_text
from moot.protocols import get_preset, preset_names
from moot.server.limits import RequestError
from moot.server.openai.catalogue import (
    PREFIX,
    accepts_typed_output,
    is_application,
)
from moot.server.openai.refusals import FieldRefusal, refuse_unless

#: OpenAI's rule for a response format's name.
_FORMAT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

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
