"""A caller's JSON schema in the library (issue 39): a tool's ``parameters`` and every schema moot
validates against are checked before any model call (no ``$ref`` outside the schema, bounded,
patterns RE2 can run), validated without fetching anything, and a pattern cannot stall; a tool's
local references still work inside the action schema its agents are sent."""

from __future__ import annotations

import contextlib
import json
import pickle
import time
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field, ValidationError
from referencing.exceptions import Unresolvable

from hostile import Listener
from moot import ScriptedModel
from moot.core import Engine
from moot.core.spec import SpecError
from moot.core.tools import MAX_TOOLS, Tool, action_schema, with_tools
from moot.core.user_schemas import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    NO_RETRIEVAL,
    SchemaProblem,
    check_user_schema,
)
from moot.protocols import get_preset
from moot.structured import _SCHEMAS, get_schema, schema_names

EVIL = "a" * 26 + "!"  # Python's re takes seconds on ^(a+)+$ against this, twice as long per more "a"


def tool(parameters: dict[str, Any], name: str = "a") -> Tool:
    return Tool(name=name, parameters=parameters)


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


def test_a_ref_outside_the_schema_is_refused_and_nothing_is_fetched() -> None:
    with Listener() as listener:
        for parameters in (
            obj(x={"$ref": listener.url}),
            {**obj(x={"$ref": "#/$defs/s"}), "$defs": {"s": {"$ref": listener.url}}},
            {**obj(x={"$ref": "other.json"}), "$id": listener.url},
            obj(x={"$dynamicRef": listener.url}),
            obj(x={"allOf": [{"$ref": listener.url + "#/x"}]}),
        ):
            with pytest.raises(ValidationError) as caught:
                tool(parameters)
            message = caught.value.errors()[0]["msg"]
            assert "tool a: parameters: $" in message and "is not local to the schema" in message, message
            assert "\n" not in message
        time.sleep(0.3)
        assert listener.connections == 0


def test_a_validator_fetches_nothing_even_for_a_ref_that_got_past_the_check() -> None:
    """The backstop: every validator of a caller's schema is built on a registry that retrieves nothing."""
    with Listener() as listener:
        validator = Draft202012Validator(obj(x={"$ref": listener.url}), registry=NO_RETRIEVAL)
        with pytest.raises(Unresolvable):
            list(validator.iter_errors({"x": "v"}))
        time.sleep(0.3)
        assert listener.connections == 0


def test_a_local_ref_must_point_at_something() -> None:
    with pytest.raises(SchemaProblem, match=r"\$ref '#/\$defs/missing' points at nothing"):
        check_user_schema(obj(x={"$ref": "#/$defs/missing"}), "where")
    with pytest.raises(SchemaProblem, match="points at nothing"):
        check_user_schema(obj(x={"$ref": "#nowhere"}))
    defined = {**obj(x={"$ref": "#/$defs/s"}), "$defs": {"s": {"type": "string", "enum": ["v"]}}}
    checked = check_user_schema(defined)
    assert checked.errors({"x": "v"}) == [] and "'w' is not one of ['v']" in checked.errors({"x": "w"})[0].message


@pytest.mark.parametrize(
    ("parameters", "arguments", "fails"),
    [
        (obj(x={"type": "string", "pattern": "^(a+)+$"}), {"x": EVIL}, True),
        ({"type": "object", "patternProperties": {"^(a+)+$": {}}, "additionalProperties": False}, {EVIL: 1}, True),
        ({"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}}, {EVIL: "text"}, False),
        (obj(x={"type": "object", "propertyNames": {"pattern": "^(a+)+$"}}), {"x": {EVIL: 1}}, True),
    ],
    ids=["pattern", "additionalProperties", "patternProperties", "propertyNames"],
)
def test_a_catastrophic_pattern_checks_a_reply_in_linear_time(
    parameters: dict[str, Any], arguments: dict[str, Any], fails: bool
) -> None:
    """A model's reply is attacker-steered: checking it against a backtracking-prone pattern is as
    quick as any other check (RE2), and it decides as it should."""
    action = action_schema([tool(parameters)], "required")
    call = {"reasoning": "r", "do": "a", "arguments": arguments}
    start = time.monotonic()
    if fails:
        with pytest.raises(ValidationError, match=r"match|regexes"):
            action.model_validate(call)
    else:
        action.model_validate(call)  # the key matches no pattern: no subschema applies to it
    assert time.monotonic() - start < 1.0


DRAFT7 = "http://json-schema.org/draft-07/schema#"


def test_a_reference_back_to_a_root_that_names_its_draft_stays_on_re2() -> None:
    """jsonschema picks a subschema's validator by its ``$schema``: a ``$ref`` back to a root that
    names its draft went on with the stock validator, whose patterns run on ``re`` (26 characters
    took 1.6 s, each two more four times as long). moot's validator stays itself at every step."""
    schema = {
        "$schema": DRAFT7,
        "type": "object",
        "properties": {"answer": {"type": "string", "pattern": "^(a+)+$"}, "more": {"$ref": "#"}},
    }
    checked = check_user_schema(schema)
    start = time.monotonic()
    errors = checked.errors({"more": {"more": {"answer": EVIL}}})
    assert time.monotonic() - start < 1.0
    assert len(errors) == 1 and "does not match" in errors[0].message


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        (obj(x={"$schema": DRAFT7, "type": "string", "pattern": "^(a+)+$"}), "a subschema names its own $schema"),
        (
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"$schema": DRAFT7}}},
            "a subschema names its own $schema",
        ),
        (obj(x={"type": "string", "pattern": "(?=a)b"}), "invalid perl operator"),
        (obj(x={"type": "string", "pattern": r"(a)\1"}), "invalid escape sequence"),
        (obj(x={"type": "string", "pattern": "(?:a{1000}){1000}"}), "invalid repetition size"),
        (obj(x={"type": "string", "pattern": "(("}), "missing )"),
        ({"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False}, "cannot be checked"),
        ({"allOf": [{"type": "string", "pattern": "^.{0,1000}$" + "x" * i} for i in range(12)]}, "RE2 instructions"),
        ({"type": "object", "description": "d" * MAX_SCHEMA_BYTES}, f"over the limit of {MAX_SCHEMA_BYTES}"),
        (obj(x={"type": "string", "description": "\udfff"}), "lone surrogate"),
        ({"$schema": "http://127.0.0.1:9/meta", "type": "object"}, "is not a draft moot checks"),
        ({"type": "nope"}, "not a valid JSON schema"),
        ({"type": "number", "minimum": float("nan")}, "is not JSON"),
    ],
)
def test_what_cannot_be_checked_safely_is_refused_by_name(schema: dict[str, Any], needle: str) -> None:
    with pytest.raises(SchemaProblem) as caught:
        check_user_schema(schema, "tools[0].parameters")
    assert str(caught.value).startswith("tools[0].parameters: ") and needle in str(caught.value), caught.value


def test_a_schema_nested_too_deep_is_refused() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(SchemaProblem, match=f"deeper than {MAX_SCHEMA_DEPTH}"):
        check_user_schema(schema)


def test_a_tools_description_is_text_and_its_count_is_bounded() -> None:
    with pytest.raises(ValidationError, match="tool a: description: holds a lone surrogate"):
        Tool(name="a", description="\ud800")
    tools = [Tool(name=f"t{i}") for i in range(MAX_TOOLS + 1)]
    with pytest.raises(SpecError, match=f"over the limit of {MAX_TOOLS}"):
        action_schema(tools)


async def test_a_tools_local_references_work_in_the_action_its_agents_are_sent() -> None:
    """The tool's ``$defs`` move to the action's ``$defs``, its references with them (before, pydantic
    failed on them: KeyError '#/$defs/City')."""
    city = {"type": "string", "enum": ["Paris", "Oslo"]}
    weather = tool(
        {"type": "object", "$defs": {"City": city}, "properties": {"city": {"$ref": "#/$defs/City"},
         "also": {"$ref": "#/properties/city"}}, "required": ["city"]},
        name="get_weather",
    )  # fmt: skip
    action = action_schema([weather])
    sent = action.model_json_schema()
    assert sent["$defs"]["get_weather.$defs.City"] == city
    check_user_schema(sent)  # every reference in it resolves within it
    spec = with_tools(get_preset("vote", k=1), [weather])
    call = {"reasoning": "r", "do": "get_weather", "arguments": {"city": "Lyon"}}
    model = ScriptedModel([call, {**call, "arguments": {"city": "Paris", "also": "Oslo"}}])
    result = await Engine(spec, model).run("What is the weather in Paris?")
    assert "'Lyon' is not one of ['Paris', 'Oslo']" in model.requests[1].messages[-1].content
    assert result.decision is not None and result.decision["action"]["arguments"] == {"city": "Paris", "also": "Oslo"}
    assert json.loads(json.dumps(model.requests[0].response_schema)) == sent


async def test_an_engines_own_schema_is_a_value_nobody_else_can_name() -> None:
    """A schema given to one engine (a server request's tools) types its debate's turns, and never
    enters the process's registry: no other spec can name it, and nothing is left to forget."""
    before = dict(_SCHEMAS)
    weather = tool({"type": "object", "properties": {"city": {"type": "string"}}}, name="get_weather")
    spec = with_tools(get_preset("vote", k=1), [weather], schema="request-action")
    call = {"reasoning": "r", "do": "get_weather", "arguments": {"city": "Lyon"}}
    model = ScriptedModel([call])
    result = await Engine(spec, model, schemas={"request-action": action_schema([weather])}).run("Weather in Lyon?")
    assert result.decision is not None and result.decision["action"]["arguments"] == {"city": "Lyon"}
    assert dict(_SCHEMAS) == before and "request-action" not in schema_names()
    with pytest.raises(KeyError) as caught:
        get_schema("request-action")
    assert "request-action" in str(caught.value)


def test_the_embedded_grammar_fetches_no_remote_ref() -> None:
    """Were a remote ``$ref`` to reach the embedded model's grammar (it cannot: it is refused before),
    llama.cpp's conversion would not fetch it either."""
    xllamacpp = pytest.importorskip("xllamacpp")
    with Listener() as listener:
        for url in (listener.url, listener.url.replace("http://", "https://")):
            with contextlib.suppress(Exception):  # refusing it is as good
                xllamacpp.json_schema_to_grammar(json.dumps(obj(x={"$ref": url})))
        time.sleep(0.3)
        assert listener.connections == 0


def test_a_tool_still_pickles() -> None:
    """A tool crosses processes (a Ray worker, a batch job) as before: its checked schema is checked
    again where it lands."""
    weather = tool(obj(city={"type": "string", "pattern": "^[A-Z]"}), name="get_weather")
    again = pickle.loads(pickle.dumps(weather))
    assert again == weather and "does not match" in again.checked.errors({"city": "paris"})[0].message


def test_a_schema_whose_references_unfold_past_the_limit_is_refused_before_any_call() -> None:
    """Definitions each allOf two references to the next: 2 KB of schema, 2^N subschemas to validate
    (a security test: N=21 held the server's event loop 45 s, past the debate's own timeout)."""
    import time

    from moot.core.user_schemas import MAX_SCHEMA_EXPANSION

    n = 40
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    bomb = {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "required": ["a"], "$defs": defs}
    started = time.monotonic()
    with pytest.raises(SchemaProblem, match=f"more than {MAX_SCHEMA_EXPANSION:,} subschemas"):
        check_user_schema(bomb)
    assert time.monotonic() - started < 30  # (counted, not unfolded: only a hang trips this)
    # The chain again, behind a recursion whose count was reused from elsewhere as if it were small (a
    # review: counted 9,675, and a reply took 8 s to validate).
    chain: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(8)}
    chain["d8"] = {"type": "string"}
    chain["P"] = {"allOf": [{"$ref": "#/$defs/d0"}, {"$ref": "#/$defs/X"}]}
    chain["X"] = {"properties": {"p": {"$ref": "#/$defs/P"}}}
    behind = {"$ref": "#/$defs/P", "$defs": chain, "allOf": [{"$ref": "#/$defs/X"}] * 1400}
    with pytest.raises(SchemaProblem, match="subschemas"):
        check_user_schema(behind)

    # What a caller's schema looks like holds: a definition shared by many fields, and a recursive one.
    company = check_user_schema(_Company.model_json_schema())
    assert company.errors({"people": [], "owner": {}, "offices": []})
    assert check_user_schema(_Node.model_json_schema()).errors({"label": "x", "children": [{"label": "y"}]}) == []


def test_a_recursive_schema_whose_alternatives_branch_checks_a_reply_in_bounded_steps() -> None:
    """A review: a 192-byte schema passes the expansion's bound (a recursive reference counts once),
    yet each level of a reply's nesting doubles the validation (anyOf of two references back into the
    recursion): 17 lists deep held the event loop 51 s. A validation now stops after its steps, with
    one error that says why; replies of ordinary schemas take far fewer."""
    from moot.core.user_schemas import MAX_VALIDATION_STEPS

    branching = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}},
        "required": ["a"],
        "$defs": {
            "n": {"anyOf": [{"$ref": "#/$defs/m"}, {"$ref": "#/$defs/m"}]},
            "m": {"type": "array", "items": {"$ref": "#/$defs/n"}},
        },
    }
    checked = check_user_schema(branching)
    cls: Any = type(checked.validator)
    stock = cls.evolve
    evolved = [0]

    def counted(self: Any, **changes: Any) -> Any:
        evolved[0] += 1
        return stock(self, **changes)

    nested: Any = 1
    for _ in range(40):
        nested = [nested]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cls, "evolve", counted)
        errors = checked.errors({"a": nested})
    assert [e.message.split(" (")[0] for e in errors] == [
        f"checking the value against the schema took over {MAX_VALIDATION_STEPS:,} steps"
    ]
    assert evolved[0] <= MAX_VALIDATION_STEPS + 1  # 2^40 steps otherwise
    assert checked.errors({"a": [[[]]]}) == []  # a value it fits still validates
    # An ordinary nested model's reply: 20 invoices of 20 lines well within the steps.
    ledger = check_user_schema(_Company.model_json_schema())
    person = {"name": "n", "home": {"street": "s", "city": "c", "country": "x"}}
    company = {"people": [person] * 300, "owner": person, "offices": [person["home"]] * 300}
    assert ledger.errors(company) == []


class _Address(BaseModel):
    street: str
    city: str
    country: str


class _Person(BaseModel):
    name: str
    home: _Address
    work: _Address | None = None


class _Company(BaseModel):
    people: list[_Person]
    owner: _Person
    offices: list[_Address]


class _Node(BaseModel):
    label: str
    children: list[_Node] = Field(default_factory=list)


def test_a_long_flat_reply_is_not_refused_for_its_length() -> None:
    """A review: the fixed 10,000 steps refused 1,500 records of five fields (one nullable), 116 KB,
    blaming recursion. The steps grow with the values a reply holds; a recursion's blow-up does not."""
    record = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "integer"},
            "c": {"type": "number"},
            "d": {"type": "boolean"},
            "e": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["a", "b", "c", "d", "e"],
    }
    schema = check_user_schema({"type": "object", "properties": {"rows": {"type": "array", "items": record}}})
    rows = [{"a": "x", "b": 1, "c": 0.5, "d": True, "e": None}] * 3000
    assert schema.errors({"rows": rows}) == []
