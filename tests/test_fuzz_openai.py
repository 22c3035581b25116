"""A standing check of the OpenAI routes against hostile input (issue 39): ``/v1/chat/completions``,
``/v1/responses`` and ``/v1/debates`` get hostile schemas (a remote ``$ref`` to a loopback listener,
catastrophic patterns, 5,000 tools, deep nesting), a lone surrogate in every text field, a value of
the wrong type in every field, and seeded random mutations of valid bodies (hypothesis). Throughout:

- a refused request is a 4xx, never a 5xx (a request that is valid after all may run its debate:
  2xx, or a 502 ``debate_failed`` when the fake model's reply does not follow the schema, which is the
  model's failure reported as such);
- the listener on 127.0.0.1 that every remote ``$ref`` names sees no connection;
- a health check (``GET /v1/protocols``) polled all along answers within 1 s.

Bodies are JSON-encoded with ``ensure_ascii``, so that a lone surrogate reaches the server as its
``\\udfff`` escape. The whole run is bounded: a fixed list, plus a fixed number of seeded examples."""

# ruff: noqa: F811  (make_server is test_serve_api's fixture, imported)

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from hostile import LEAKED, HealthWatch, Listener
from moot.server.openai.chat_wire import ChatCompletionRequest
from moot.server.openai.responses_request import ResponsesRequest
from moot.server.schemas import DebateRequest
from moot.testing.fake_openai import schema_reply
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

QUESTION = "Is 7 prime?"
SURROGATE = "\udfff"
EVIL = "a" * 30 + "!"
CATASTROPHIC = ["^(a+)+$", "^(a|a)*$", "^(a|aa)+$", "(x+x+)+y", "^(\\w+\\s?)*$"]


def parameters(url: str | None = None, pattern: str | None = None) -> dict[str, Any]:
    x: dict[str, Any] = {"type": "string", "description": "what to look up"}
    if url is not None:
        x = {"$ref": url}
    if pattern is not None:
        x["pattern"] = pattern
    return {"type": "object", "properties": {"x": x}, "required": ["x"]}


def chat_tool(params: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "looks x up", "parameters": params}}


def responses_tool(params: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {"type": "function", "name": name, "description": "looks x up", "parameters": params}


def bases() -> list[tuple[str, dict[str, Any], type[BaseModel]]]:
    """A valid body of each kind each route takes (the fuzz mutates these)."""
    typed = {"type": "object", "properties": {"verdict": {"type": "string", "description": "yes or no"}}}
    return [
        ("/v1/chat/completions", {
            "model": "moot/vote", "user": "u1", "metadata": {"k": "v"}, "stop": ["\n\n\n"],
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
            "tools": [chat_tool(parameters())],
        }, ChatCompletionRequest),
        ("/v1/chat/completions", {
            "model": "moot/affirmative-critical", "messages": [{"role": "user", "content": QUESTION}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "description": "a verdict",
                                                                       "schema": typed}},
        }, ChatCompletionRequest),
        ("/v1/responses", {
            "model": "moot/vote", "instructions": "Be brief.", "user": "u1", "metadata": {"k": "v"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
            "tools": [responses_tool(parameters())],
        }, ResponsesRequest),
        ("/v1/responses", {
            "model": "moot/affirmative-critical", "input": QUESTION,
            "text": {"format": {"type": "json_schema", "name": "r", "description": "a verdict", "schema": typed}},
        }, ResponsesRequest),
        ("/v1/debates", {
            "protocol": "vote", "question": QUESTION, "reference": "yes",
            "context": ["7 has no divisor but 1 and itself.", {"text": "Primes are odd but 2.", "source": "s.md"}],
        }, DebateRequest),
    ]  # fmt: skip


def reply(request: dict[str, Any]) -> str:
    """The fake model: where the schema it is sent has a pattern, text that defeats a backtracking
    matcher of it; else JSON that follows the schema."""
    fmt = json.dumps(request.get("response_format"))
    if '"pattern"' in fmt:
        if '"do"' in fmt:
            return json.dumps({"reasoning": "r", "do": "a", "arguments": {"x": EVIL}})
        return json.dumps({"x": EVIL, "verdict": EVIL})
    return schema_reply(request)


def send(client: httpx.Client, route: str, body: Any) -> httpx.Response:
    # ensure_ascii: a lone surrogate goes as its \\udfff escape (httpx's json= would fail to encode it).
    return client.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})


def leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every place in a body, containers and leaves."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))


def replaced(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(body)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return out


def schema_types(model: type[BaseModel]) -> dict[str, set[str] | None]:
    """The JSON types each field of a request model takes (None: any)."""

    def types(node: dict[str, Any], defs: dict[str, Any]) -> set[str] | None:
        if "$ref" in node:
            return types(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        if "anyOf" in node:
            found: set[str] = set()
            for option in node["anyOf"]:
                some = types(option, defs)
                if some is None:
                    return None
                found |= some
            return found
        kind = node.get("type")
        if kind is None:
            return None
        kinds = set(kind) if isinstance(kind, list) else {kind}
        if kinds & {"integer", "number", "boolean"}:
            kinds |= {"boolean"}  # pydantic takes true and false for a number (1 and 0), and 0 and 1 for a bool
        return kinds

    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    return {
        info.alias or name: types(schema["properties"][info.alias or name], defs)
        for name, info in model.model_fields.items()
    }


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


WRONG = [7, 1, 0, -1.5, "x", "0.5", "50", "no", True, [], [1, "a", None], {}, {"a": [{"b": SURROGATE}]}]


class Run:
    """The outcomes of one fuzz run: every response that broke a rule, by what was sent."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.broken: list[str] = []
        self.sent = 0

    def check(self, what: str, route: str, body: Any, *, refused: bool) -> None:
        """Send ``body``: ``refused``: it must be a 4xx; else anything but a 5xx other than a failed debate."""
        self.sent += 1
        try:
            response = send(self.client, route, body)
        except httpx.HTTPError as exc:
            self.broken.append(f"{what} on {route}: no response ({type(exc).__name__})")
            return
        code = response.status_code
        error = response.json().get("error", {}) if "json" in response.headers.get("content-type", "") else {}
        failed_debate = code == 502 and isinstance(error, dict) and error.get("code") == "debate_failed"
        if (code >= 500 and not failed_debate) or (refused and not 400 <= code < 500):
            self.broken.append(f"{what} on {route}: {code} {response.text[:200]}")
        if LEAKED in response.text:
            self.broken.append(f"{what} on {route}: the listener's content came back")


def test_hostile_input_is_refused_by_name_fetches_nothing_and_never_stalls(make_server: MakeServer) -> None:
    server, _ = make_server(reply=reply, latency=0.0)
    rng = random.Random(39)
    start = time.monotonic()
    with (
        Listener() as listener,
        HealthWatch(server.url) as health,
        # A connection a request of its own: a response cut short cannot take the next one's with it.
        httpx.Client(base_url=server.url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client,
    ):
        run = Run(client)
        for route, body, _ in bases():  # the bodies themselves are valid
            run.check("the valid base body", route, body, refused=False)
        hostile_schemas(run, listener.url)
        catastrophic_patterns(run)
        surrogates(run)
        wrong_types(run, rng)
        tool_history(run)
        mutations(run)
        time.sleep(0.3)  # a fetch in flight would have connected by now
        connections = listener.connections
    elapsed = time.monotonic() - start
    assert connections == 0, f"the server connected {connections} times to a URL a request named"
    assert health.ok, health
    assert not run.broken, f"{len(run.broken)} of {run.sent} requests broke a rule:\n" + "\n".join(run.broken)
    assert elapsed < 120, f"the fuzz run took {elapsed:.0f} s; keep it bounded"


def hostile_schemas(run: Run, url: str) -> None:
    """Remote references in every place a schema goes, 5,000 tools, deep nesting: each a 4xx."""
    remote = [
        parameters(url),
        {"type": "object", "$defs": {"s": {"$ref": url}}, "properties": {"x": {"$ref": "#/$defs/s"}}},
        {"$id": url, "type": "object", "properties": {"x": {"$ref": "other.json"}}},
        {"type": "object", "properties": {"x": {"$dynamicRef": url + "#meta"}}},
        {"$schema": url, "type": "object"},
        {"type": "object", "properties": {"x": {"items": {"$ref": url.replace("http://", "https://")}}}},
    ]
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    for schema in [*remote, deep]:
        typed = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        run.check(
            "a hostile tool schema",
            "/v1/chat/completions",
            {"model": "moot/vote", "messages": [{"role": "user", "content": QUESTION}], "tools": [chat_tool(schema)]},
            refused=True,
        )
        run.check("a hostile legacy function", "/v1/chat/completions", {"model": "moot/vote",
                  "messages": [{"role": "user", "content": QUESTION}],
                  "functions": [{"name": "a", "parameters": schema}]}, refused=True)  # fmt: skip
        run.check(
            "a hostile response_format",
            "/v1/chat/completions",
            {
                "model": "moot/affirmative-critical",
                "messages": [{"role": "user", "content": QUESTION}],
                "response_format": typed,
            },
            refused=True,
        )
        run.check("a hostile tool schema", "/v1/responses", {"model": "moot/vote", "input": QUESTION,
                  "tools": [responses_tool(schema)]}, refused=True)  # fmt: skip
        run.check(
            "a hostile text.format",
            "/v1/responses",
            {
                "model": "moot/affirmative-critical",
                "input": QUESTION,
                "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}},
            },
            refused=True,
        )
        run.check("a schema as a protocol's turn", "/v1/debates", {"question": QUESTION,
                  "protocol": {"preset": "vote", "turn": {"schema": schema}}}, refused=True)  # fmt: skip
    many = [chat_tool({"type": "object"}, f"t{i}") for i in range(5000)]
    run.check("5,000 tools", "/v1/chat/completions", {"model": "moot/vote",
              "messages": [{"role": "user", "content": QUESTION}], "tools": many}, refused=True)  # fmt: skip
    run.check("5,000 tools", "/v1/responses", {"model": "moot/vote", "input": QUESTION,
              "tools": [{"type": "function", **t["function"]} for t in many]}, refused=True)  # fmt: skip
    run.check(
        "a schema name of no schema",
        "/v1/debates",
        {"question": QUESTION, "protocol": {"preset": "vote", "turn": {"schema": "action-0"}}},
        refused=True,
    )


def catastrophic_patterns(run: Run) -> None:
    """Patterns that make a backtracking matcher take exponential time on the fake model's reply
    (it answers each with 30 "a"s and a "!"): not refused, but checked in linear time."""
    for pattern in CATASTROPHIC:
        schema = parameters(pattern=pattern)
        keyed = {"type": "object", "patternProperties": {pattern: {}}, "additionalProperties": False}
        for params in (schema, keyed):
            run.check("a catastrophic pattern", "/v1/chat/completions", {"model": "moot/vote",
                      "messages": [{"role": "user", "content": QUESTION}], "tools": [chat_tool(params)]},
                      refused=False)  # fmt: skip
        typed = {"type": "json_schema", "name": "r", "schema": schema}
        run.check("a catastrophic pattern", "/v1/responses", {"model": "moot/affirmative-critical",
                  "input": QUESTION, "text": {"format": typed}}, refused=False)  # fmt: skip


def surrogates(run: Run) -> None:
    """A lone surrogate in every text a body holds, alone or inside other text: each a 4xx."""
    for route, body, _ in bases():
        for path, value in list(leaves(body)):
            if not isinstance(value, str):
                continue
            for text in (SURROGATE, value + SURROGATE):
                run.check(f"a lone surrogate at {'.'.join(map(str, path))}", route, replaced(body, path, text),
                          refused=True)  # fmt: skip
        metadata = body.get("metadata")
        if isinstance(metadata, dict):  # its keys are text kept with the debate too
            run.check("a lone surrogate in a metadata key", route, {**body, "metadata": {SURROGATE: "v"}}, refused=True)


def wrong_types(run: Run, rng: random.Random) -> None:
    """Every field of each route's request model, set to values of types it does not take: a 4xx
    (a field that takes any type gets odd values too, and must not break the server). A string of
    digits for a number, 0 or 1 for a boolean, a boolean for a number: each refused, not converted."""
    seen: set[tuple[str, str]] = set()
    for route, body, model in bases():
        for name, types in schema_types(model).items():
            if (route, name) in seen:
                continue
            seen.add((route, name))
            # An integer is a number; nothing else stands for another JSON type (1 is not true, "50"
            # not 50): each is refused as OpenAI's API refuses it, not converted.
            wrong = [v for v in WRONG if types is None or (json_type(v) not in types and not
                     (json_type(v) == "integer" and "number" in types))]  # fmt: skip
            # A typed field gets every wrong value (each refused at once); one that takes any type, two.
            for value in wrong if types is not None else rng.sample(wrong, min(2, len(wrong))):
                run.check(f"{name} = {value!r}", route, {**body, name: value}, refused=types is not None)


def tool_history(run: Run) -> None:
    """Every place of a tool loop's history (a chat assistant's tool call and the tool's result; a
    Responses function_call item and its output, given as the standard's parts) set to each value of
    ``WRONG``: never a 5xx (an object as a call's id was one: an unhashable set member). Some are
    valid (any JSON is a tool's output), so only that holds."""
    call = {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x": "7"}'}}
    chat = {"model": "moot/single", "messages": [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "prime"}]},
        {"role": "user", "content": "And 9?"},
    ]}  # fmt: skip
    responses = {"model": "moot/single", "input": [
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": '{"x": "7"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "prime"}]},
        {"role": "user", "content": "And 9?"},
    ]}  # fmt: skip
    for route, body, history in (("/v1/chat/completions", chat, "messages"), ("/v1/responses", responses, "input")):
        for path, _ in list(leaves(body[history], (history,))):
            if len(path) < 3:  # (the list and each whole message or item: mutations() replaces those)
                continue
            for value in WRONG:
                run.check(f"{'.'.join(map(str, path))} = {value!r}", route, replaced(body, path, value), refused=False)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def mutations(run: Run) -> None:
    """Seeded random mutations of the valid bodies: any place replaced by any JSON value (surrogates
    and the hostile fragments included). Only "never a 5xx" holds for these: some are valid."""
    fragments = st.sampled_from([SURROGATE, {"$ref": "http://127.0.0.1:9/x"}, {"pattern": "^(a+)+$"}, [[[[[]]]]]])
    cases = [(route, body) for route, body, _ in bases()]

    @seed(39)
    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=st.sampled_from(cases), where=st.integers(0, 10_000), value=JSON | fragments)
    def mutate(case: tuple[str, dict[str, Any]], where: int, value: Any) -> None:
        route, body = case
        places = [path for path, _ in leaves(body)]
        path = places[where % len(places)]
        run.check(f"a mutation at {'.'.join(map(str, path)) or '(the body)'}", route, replaced(body, path, value),
                  refused=False)  # fmt: skip

    mutate()
