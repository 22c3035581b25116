"""A caller's JSON schemas on ``moot serve`` (issue 39): a ``$ref`` outside the schema is a 400 and
nothing is ever fetched (S1), a pattern cannot stall the event loop (S2), tools and schemas are
bounded, read off the event loop and forgotten with their debate (S4), and ``text.format`` of the
wrong type is a 400 (E2). Debates run on the loopback fake OpenAI-compatible server; a loopback
listener stands for the operator's internal network."""

# ruff: noqa: F811  (make_server is test_serve_api's fixture, imported)

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import moot.core.tools
import moot.structured
from hostile import LEAKED, HealthWatch, Listener
from moot.testing.fake_openai import schema_reply
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

QUESTION = "Is 7 prime?"
MESSAGES = [{"role": "user", "content": QUESTION}]


def replying(value: str = "v", as_key: bool = False) -> Callable[[dict[str, Any]], str]:
    """The fake model: a call to tool ``a`` with ``{"x": value}`` (or ``{value: 1}``), a typed reply
    (the format named ``r``) the same, else placeholders. (On the code before the fix, validating
    these is what fetched the ``$ref``, and what stalled on a pattern.)"""
    arguments = {value: 1} if as_key else {"x": value}

    def reply(request: dict[str, Any]) -> str:
        fmt = json.dumps(request.get("response_format"))
        if '"do"' in fmt:
            return json.dumps({"reasoning": "r", "do": "a", "arguments": arguments})
        if '"name": "r"' in fmt:
            return json.dumps(arguments)
        return schema_reply(request)

    return reply


replies = replying()


def routes(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """Every place a request carries a schema: (route, body, the field a refusal names)."""
    return [
        ("/v1/responses", {"model": "moot/vote", "input": QUESTION,
                           "tools": [{"type": "function", "name": "a", "parameters": schema}]}, "tools[0].parameters"),
        ("/v1/responses", {"model": "moot/affirmative-critical", "input": QUESTION,
                           "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}}},
         "text.format.schema"),
        ("/v1/chat/completions", {"model": "moot/vote", "messages": MESSAGES,
                                  "tools": [{"type": "function", "function": {"name": "a", "parameters": schema}}]},
         "tools[0].function.parameters"),
        ("/v1/chat/completions", {"model": "moot/affirmative-critical", "messages": MESSAGES,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "r", "schema": schema}}},
         "response_format.json_schema.schema"),
        ("/v1/chat/completions", {"model": "moot/vote", "messages": MESSAGES,
                                  "functions": [{"name": "a", "parameters": schema}]}, "functions"),
    ]  # fmt: skip


def remote_refs(url: str) -> list[dict[str, Any]]:
    """Schemas that reach for ``url`` (or a neighbour of it) each in its own way."""
    return [
        {"type": "object", "properties": {"x": {"$ref": url}}, "required": ["x"]},
        {"type": "object", "$defs": {"s": {"$ref": url}}, "properties": {"x": {"$ref": "#/$defs/s"}}},
        {"$id": url, "type": "object", "properties": {"x": {"$ref": "other.json"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"$dynamicRef": url}}, "required": ["x"]},
        {"$schema": url, "type": "object", "properties": {"x": {"type": "string"}}},
    ]


def test_a_ref_outside_the_schema_is_refused_and_nothing_is_fetched(make_server: MakeServer) -> None:
    server, fake = make_server(reply=replies)
    with Listener() as listener:
        for schema in remote_refs(listener.url):
            for route, body, field in routes(schema):
                response = httpx.post(server.url + route, json=body, timeout=60)
                error = response.json()["error"]
                assert response.status_code == 400, (route, schema, response.text)
                assert error["param"] == field, (route, schema, error)
                assert LEAKED not in response.text and "Traceback" not in response.text
                if field != "functions" and "$schema" not in schema:
                    assert "is not local to the schema" in error["message"], error
        time.sleep(0.3)  # a fetch in flight would have connected by now
        assert listener.connections == 0
    assert fake.requests == []  # refused before any model call


def test_a_local_ref_works_and_one_to_nothing_is_refused(make_server: MakeServer) -> None:
    server, fake = make_server(reply=replies)
    local = {"type": "object", "$defs": {"s": {"type": "string", "enum": ["v"]}},
             "properties": {"x": {"$ref": "#/$defs/s"}}, "required": ["x"]}  # fmt: skip
    for route, body, field in routes(local):
        if field == "functions":
            continue
        ok = httpx.post(server.url + route, json=body, timeout=60)
        assert ok.status_code == 200, (route, ok.text)
    # The tool's definitions were moved into the action schema the agents were sent, references with them.
    sent = next(r["response_format"]["json_schema"]["schema"] for r in fake.requests if '"do"' in json.dumps(r))
    assert sent["$defs"]["a.$defs.s"] == {"type": "string", "enum": ["v"]}
    assert "#/$defs/a.$defs.s" in json.dumps(sent)
    nowhere = {**local, "properties": {"x": {"$ref": "#/$defs/missing"}}}
    for route, body, field in routes(nowhere)[:4]:
        response = httpx.post(server.url + route, json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text
        assert "points at nothing" in response.json()["error"]["message"]


CATASTROPHIC = "^(a+)+$"
#: Python's re takes seconds on this (twice as long for each more "a"); RE2 takes microseconds.
EVIL = "a" * 26 + "!"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": {"type": "string", "pattern": CATASTROPHIC}}, "required": ["x"]},
        {"type": "object", "patternProperties": {CATASTROPHIC: {}}, "additionalProperties": False},
    ],
    ids=["pattern", "patternProperties"],
)
def test_a_catastrophic_pattern_cannot_stall_the_server(make_server: MakeServer, schema: dict[str, Any]) -> None:
    """The model's reply is what an attacker steers: its text (or its key) meets the pattern."""
    server, _ = make_server(reply=replying(EVIL, as_key="patternProperties" in schema))
    for route, body, _ in routes(schema)[:4]:
        with HealthWatch(server.url) as health:
            response = httpx.post(server.url + route, json=body, timeout=300)
        # The reply does not follow the schema: a parse failure after its repair, named, not a hang.
        assert response.status_code == 502 and "match" in response.json()["error"]["message"], response.text
        assert health.ok, (route, health)


def test_tools_are_bounded_in_number_and_size(make_server: MakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server, fake = make_server(reply=replies)
    read: list[str] = []  # the tools' schemas read (the server runs in this process)
    check = moot.core.tools.check_user_schema
    monkeypatch.setattr(
        moot.core.tools, "check_user_schema", lambda schema, where: read.append(where) or check(schema, where)
    )
    tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}

    def tools(n: int, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            function = {**tool["function"], "name": f"t{i}"}  # type: ignore[dict-item]
            if parameters is not None:
                function["parameters"] = parameters
            out.append({"type": "function", "function": function})
        return out

    url = server.url + "/v1/chat/completions"
    start = time.monotonic()
    many = httpx.post(url, json={"model": "moot/vote", "messages": MESSAGES, "tools": tools(5000)}, timeout=60)
    assert many.status_code == 400 and many.json()["error"]["param"] == "tools", many.text
    assert "5000 tools is over the limit of 128" in many.json()["error"]["message"]
    assert read == []  # refused before any schema was read
    assert time.monotonic() - start < 60  # (a hang)
    over = httpx.post(url, json={"model": "moot/vote", "messages": MESSAGES, "tools": tools(129)}, timeout=60)
    assert over.status_code == 400 and "129 tools" in over.json()["error"]["message"]
    wide = {"type": "object", "description": "d" * 60_000}
    heavy = httpx.post(url, json={"model": "moot/vote", "messages": MESSAGES, "tools": tools(5, wide)}, timeout=60)
    assert heavy.status_code == 400 and heavy.json()["error"]["param"] == "tools", heavy.text
    assert "262144 bytes together" in heavy.json()["error"]["message"]
    big = {"type": "object", "description": "d" * 70_000}
    one = httpx.post(url, json={"model": "moot/vote", "messages": MESSAGES, "tools": tools(1, big)}, timeout=60)
    assert one.status_code == 400 and one.json()["error"]["param"] == "tools[0].function.parameters", one.text
    assert "over the limit of 65536" in one.json()["error"]["message"]
    assert read == ["parameters"]  # only this one was read (and refused by its size)
    assert fake.requests == []


def test_a_requests_schemas_are_read_off_the_event_loop(make_server: MakeServer) -> None:
    """Reading 128 tools of about 1.9 KB each (a JSON schema's metaschema check is pure Python: seconds
    for this) happens in a worker thread: the server goes on answering meanwhile."""
    server, _ = make_server(reply=replies)
    properties = {f"p{j}": {"type": "string", "description": "a parameter " * 3, "maxLength": 99} for j in range(20)}
    tools = [{"type": "function", "name": "a" if i == 0 else f"t{i}",
              "parameters": {"type": "object", "properties": {"x": {"type": "string"}, **properties}}}
             for i in range(128)]  # fmt: skip
    assert 200_000 < len(json.dumps(tools)) < 1_000_000
    with HealthWatch(server.url) as health:
        response = httpx.post(
            server.url + "/v1/responses", json={"model": "moot/vote", "input": QUESTION, "tools": tools}, timeout=120
        )
    assert response.status_code == 200, response.text
    assert health.ok, health


def test_the_schemas_of_a_request_never_enter_the_process_registry(make_server: MakeServer) -> None:
    """A request's tools and reply format go to its debate's engine as values: the process's schema
    registry is exactly as it was while every debate runs (read by the model as it is called) and
    after. (Before, each request's schemas were registered for its debate's life, and released by a
    task once it ended.)"""
    seen: list[dict[str, Any]] = []

    def reply(request: dict[str, Any]) -> str:
        seen.append(dict(moot.structured._SCHEMAS))
        return replies(request)

    server, _ = make_server(reply=reply)
    before = dict(moot.structured._SCHEMAS)
    for i in range(6):  # six distinct tool sets, and six distinct reply schemas
        function = {"name": "a", "description": f"tool set {i}", "parameters": {"type": "object"}}
        tool = {"type": "function", "function": function}
        called = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "moot/vote", "messages": MESSAGES, "tools": [tool]},
            timeout=60,
        )
        assert called.status_code == 200, called.text
        schema = {"type": "object", "properties": {"x": {"type": "string", "description": f"{i}"}}}
        typed = httpx.post(
            server.url + "/v1/responses",
            json={"model": "moot/affirmative-critical", "input": QUESTION,
                  "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}}},
            timeout=60,
        )  # fmt: skip
        assert typed.status_code == 200, typed.text
    assert seen and all(registry == before for registry in seen)
    assert dict(moot.structured._SCHEMAS) == before


@pytest.mark.parametrize("value", [[], ["json_schema"], "json_schema", True, 7])
def test_text_format_of_the_wrong_type_is_a_400(make_server: MakeServer, value: Any) -> None:
    server, fake = make_server()
    response = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/affirmative-critical", "input": QUESTION, "text": {"format": value}},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "text.format"
    assert fake.requests == []


def test_odd_kinds_of_content_parts_and_tools_are_refused_by_place(make_server: MakeServer) -> None:
    """Found by the fuzz test: a content part whose type is an object was a 500 (unhashable), and a
    tool type with a lone surrogate one too (the refusal quoted it raw); both are 400s by their place."""
    server, fake = make_server()
    part = {"model": "moot/vote", "messages": [{"role": "user", "content": [{"type": {"a": 1}, "text": QUESTION}]}]}
    odd_tool = {"model": "moot/vote", "input": QUESTION, "tools": [{"type": "\udfff", "name": "a"}]}
    for route, body, param in (
        ("/v1/chat/completions", part, "messages[0].content[0]"),
        ("/v1/responses", odd_tool, "tools[0].type"),  # the door's text check names the field
    ):
        response = httpx.post(
            server.url + route, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert fake.requests == []
