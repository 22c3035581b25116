"""``moot serve`` against a careful attacker: the key checked before a byte of body is read, slow
requests dropped, connections capped, every numeric input of every route range-checked into a 400,
the security headers and the session cookie, and an OpenAPI schema that lists the errors the server
really sends. The server runs with ``moot serve``'s own uvicorn configuration (its guarded protocol)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from moot.server import ServerSettings, create_app
from moot.server.http.connections import guarded_protocol, server_config
from moot.server.http.routes import ViewerSessions
from moot.server.schemas import ErrorBody
from moot.testing.fake_openai import FakeOpenAIServer
from serving import FAKE_KEY, ServerThread, wait_for

KEY = "moot-hardening-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


class GuardedServer(ServerThread):
    """The app served as ``moot serve`` serves it: :func:`moot.server.http.connections.server_config`."""

    def __init__(self, settings: ServerSettings, parser: str = "auto") -> None:
        config = server_config(
            create_app(settings), settings, host="127.0.0.1", port=0, log_level="warning", parser=parser
        )
        super().__init__(settings, config)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)


MakeGuarded = Callable[..., GuardedServer]


@pytest.fixture
def guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeGuarded]:
    """``guarded(latency=..., **settings)``: a fake backend and the guarded server on it."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with ExitStack() as stack:

        def make(latency: float = 0.01, parser: str = "auto", **overrides: Any) -> GuardedServer:
            fake = stack.enter_context(FakeOpenAIServer(latency=latency))
            settings = ServerSettings(
                db=tmp_path / f"moot-{fake.port}.sqlite",
                models=["openai:fake"],
                base_url=fake.base_url,
                keepalive_s=0.2,
                **overrides,
            )
            server = GuardedServer(settings, parser)
            stack.enter_context(server)
            return server

        yield make


# ------------------------------------------------------------------------------- raw HTTP/1.1


def connect(server: GuardedServer) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=30)  # a bound only a hang reaches
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response off a raw socket: status, headers (lower-cased), body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed mid-response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (reads to the end)."""
    try:
        while chunk := sock.recv(65536):
            del chunk
    except ConnectionResetError:
        pass
    return True


# --------------------------------------------------------------------------- 10. the key first


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


def test_the_key_is_checked_before_a_byte_of_the_body_is_read(tmp_path: Path) -> None:
    app = create_app(ServerSettings(db=tmp_path / "m.sqlite", models=["openai:fake"], api_key=SecretStr(KEY)))
    declared = [(b"content-type", b"application/json"), (b"content-length", b"900000")]

    def call(headers: list[tuple[bytes, bytes]]) -> tuple[list[dict[str, Any]], int]:
        reads = 0
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal reads
            reads += 1
            return {"type": "http.request", "body": b" " * 100_000, "more_body": True}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        asyncio.run(app(_scope("POST", "/v1/debates", headers), receive, send))
        return sent, reads

    sent, reads = call(declared)
    assert sent[0]["status"] == 401 and reads == 0  # refused on the headers: the body never read
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b"Authorization: Bearer <key>" in sent[1]["body"]
    # with the key, the body is read (and then refused for its size): the check above can fail
    sent, reads = call([*declared, (b"authorization", f"Bearer {KEY}".encode())])
    assert sent[0]["status"] == 413 and reads > 0


def test_a_keyless_client_gets_401_at_once_without_sending_its_body(guarded: MakeGuarded) -> None:
    server = guarded(api_key=KEY)
    with connect(server) as sock:
        sock.sendall(
            b"POST /v1/debates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 900000\r\n\r\n"
        )
        status, headers, body = read_response(sock)  # no byte of the 900 KB was sent
        assert status == 401 and headers["www-authenticate"] == "Bearer" and headers["connection"] == "close"
        assert ErrorBody.model_validate_json(body).error.message.startswith("missing or wrong API key")
        assert closed(sock)
    # the pages hold no data and need no key; a body to any path does
    assert httpx.get(server.url + "/").status_code == 200
    assert httpx.post(server.url + "/", content=b"x" * 2000).status_code == 401
    assert httpx.get(server.url + "/v1/protocols", headers=AUTH).status_code == 200


# ------------------------------------------------------------------------- 10. slow requests


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_slow_headers_and_slow_bodies_are_answered_408_and_dropped(guarded: MakeGuarded, parser: str) -> None:
    server = guarded(request_timeout_s=0.5, parser=parser)
    with connect(server) as sock:  # a header trickled in and never finished (slowloris)
        sock.sendall(b"POST /v1/debates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        status, headers, body = read_response(sock)
        assert status == 408 and headers["connection"] == "close" and headers["x-request-id"].startswith("req_")
        assert "headers did not arrive within 0.5 s" in ErrorBody.model_validate_json(body).error.message
        assert closed(sock)
    with connect(server) as sock:  # a connection that never says anything
        assert read_response(sock)[0] == 408 and closed(sock)
    with connect(server) as sock:  # whole headers, then a body that stops coming
        sock.sendall(
            b"POST /v1/debates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n"
            b'{"question"'
        )
        status, headers, body = read_response(sock)
        error = ErrorBody.model_validate_json(body).error
        assert status == 408 and error.code == "request_timeout" and headers["connection"] == "close"
        assert "body did not arrive within 0.5 s (11 bytes came)" in error.message
        assert closed(sock)
    with connect(server) as sock:  # a kept-alive connection may idle longer than the deadline between requests
        for _ in range(2):
            sock.sendall(b"GET /v1/protocols HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(sock)[0] == 200
            threading.Event().wait(1.0)  # twice the deadline, well within the keep-alive timeout (15 s)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_connections_over_the_cap_get_503_and_are_closed(guarded: MakeGuarded, parser: str) -> None:
    server = guarded(max_connections=2, request_timeout_s=30, parser=parser)
    held = [connect(server), connect(server)]
    try:
        wait_for(lambda: len(server.server.server_state.connections) == 2, "the two connections")
        with connect(server) as sock:
            status, headers, body = read_response(sock)
            assert status == 503 and headers["retry-after"] == "1" and closed(sock)
            assert headers["x-request-id"].startswith("req_")  # (on every response, this one too)
            error = ErrorBody.model_validate_json(body).error
            assert error.code == "too_many_connections" and "2 connections open, its limit" in error.message
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: not server.server.server_state.connections, "the connections to close")
    assert httpx.get(server.url + "/v1/protocols").status_code == 200


# ---------------------------------------------------------------------- 11. numbers everywhere

HOSTILE = ["9223372036854775808", "1" * 5000, "²", "-1"]


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    return schema


def numeric_fields(schema: dict[str, Any], spec: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """The numeric fields of a request body's schema (objects followed, lists and free maps not)."""
    schema = _resolve(schema, spec)
    out: list[tuple[str, dict[str, Any]]] = []
    for name, field in schema.get("properties", {}).items():
        where = f"{path}.{name}" if path else name
        members = [_resolve(m, spec) for m in field.get("anyOf", [field])]
        numbers = [m for m in members if m.get("type") in ("integer", "number")]
        if numbers:
            out.append((where, numbers[0]))
        for member in members:
            if member.get("properties"):
                out += numeric_fields(member, spec, where)
    return out


BASE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/debates": {"question": "Is 7 prime?"},
    "/v1/chat/completions": {"model": "moot/single", "messages": [{"role": "user", "content": "Is 7 prime?"}]},
    "/v1/responses": {"model": "moot/single", "input": "Is 7 prime?"},
}


def with_literal(body: dict[str, Any], path: str, literal: str) -> bytes:
    """``body`` with the field at ``path`` set to a raw JSON literal (a 5,000-digit number stays one)."""
    data = json.loads(json.dumps(body))
    node = data
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = "@@LITERAL@@"
    return json.dumps(data).replace('"@@LITERAL@@"', literal).encode()


def test_every_numeric_input_of_every_route_is_range_checked(guarded: MakeGuarded) -> None:
    server = guarded(request_timeout_s=30)
    debate = httpx.post(server.url + "/v1/debates", json={"question": "Q?", "rounds": 1}).json()["id"]
    wait_for(lambda: httpx.get(f"{server.url}/v1/debates/{debate}").json()["status"] == "complete", "the debate")
    spec = httpx.get(server.url + "/openapi.json").json()
    checked: list[str] = []
    json_headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for template, operations in spec["paths"].items():
            for method, operation in operations.items():
                # Query, path and header parameters: each hostile value in each, the others valid.
                for parameter in operation.get("parameters", []):
                    name, where = parameter["name"], parameter["in"]
                    numeric = parameter["schema"].get("type") == "integer" or name in ("cursor", "last-event-id")
                    for value in HOSTILE:
                        path = template.replace("{debate_id}", value if name == "debate_id" else debate)
                        response = client.request(
                            method.upper(),
                            path,
                            params={name: value} if where == "query" else None,
                            headers={name: value.encode()} if where == "header" else None,
                        )
                        assert response.status_code < 500, (template, name, value[:20], response.text)
                        error = response.json()["error"]
                        if numeric:
                            assert response.status_code == 400, (template, name, value[:20], response.text)
                            assert error["param"].lower() == name, (template, name, error)
                        checked.append(f"{method} {template} {name}")
                # Body fields: every number the request schema has, at any depth.
                body_schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
                if "schema" not in body_schema:
                    continue
                for field, field_schema in numeric_fields(body_schema["schema"], spec):
                    negatives_allowed = field_schema.get("minimum", 0) < 0
                    for value in HOSTILE:
                        if value == "-1" and negatives_allowed:
                            continue
                        literal = '"²"' if value == "²" else value
                        content = with_literal(BASE_BODIES[template], field, literal)
                        response = client.post(template, content=content, headers=json_headers)
                        assert response.status_code == 400, (template, field, value[:20], response.text)
                        assert response.json()["error"]["param"] == field, (template, field, response.text)
                    checked.append(f"{method} {template} {field}")
    # the walk reached what it had to (a schema that lost its fields would pass it vacuously)
    for needle in (
        "get /v1/debates cursor",
        "get /v1/debates limit",
        "get /v1/debates/{debate_id}/events after",
        "get /v1/debates/{debate_id}/events last-event-id",
        "post /v1/debates budget.max_calls",
        "post /v1/debates rounds",
        "post /v1/chat/completions moot.budget.timeout_s",
        "post /v1/chat/completions seed",
        "post /v1/chat/completions temperature",
        "post /v1/responses max_output_tokens",
        "post /v1/responses temperature",
    ):
        assert needle in checked, needle
    # numbers in a preset's parameters and in an inline spec, which the schema leaves free
    for body, param in (
        ({"protocol": "society-of-minds", "with": {"agents": "@@"}}, "with.agents"),
        ({"protocol": {"preset": "panel", "rounds": "@@"}}, "protocol.rounds"),
    ):
        for value in HOSTILE[:2]:
            content = json.dumps({"question": "Q?", **body}).replace('"@@"', value).encode()
            response = httpx.post(server.url + "/v1/debates", content=content, headers=json_headers)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


# ------------------------------------------------------------- 13. headers, cookie, the schema


def test_security_headers_on_pages_and_api_and_a_session_cookie_that_expires(guarded: MakeGuarded) -> None:
    server = guarded(api_key=KEY, session_max_age_s=3600)
    for path, headers in (
        ("/", {}),
        ("/debates/abc", {}),
        ("/static/moot.js", {}),
        ("/docs", {}),
        ("/v1/protocols", AUTH),
        ("/v1/protocols", {}),  # a 401 too
        ("/v1/nowhere", AUTH),  # and a 404
    ):
        response = httpx.get(server.url + path, headers=headers)
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"], path
    page = httpx.get(server.url + "/").headers["content-security-policy"]
    assert "script-src 'self';" in page and "unsafe-inline" not in page and "connect-src 'self'" in page
    api = httpx.get(server.url + "/v1/protocols", headers=AUTH).headers["content-security-policy"]
    assert api.startswith("default-src 'none'")
    opened = httpx.post(server.url + "/v1/session", headers=AUTH)
    assert opened.status_code == 200 and "set-cookie" not in opened.headers and KEY not in opened.text
    assert opened.json()["expires_in"] == 3600
    assert httpx.get(server.url + "/v1/debates", headers=bearer(opened.json()["token"])).status_code == 200
    expired = ViewerSessions(KEY, -60).issue()  # one this server issued, an hour ago
    late = httpx.get(server.url + "/v1/debates", headers=bearer(expired))
    assert late.status_code == 401 and "session has expired" in late.json()["error"]["message"]
    forged = ViewerSessions("another-key-0123456789abcdef", 3600).issue()
    wrong = httpx.get(server.url + "/v1/debates", headers=bearer(forged))
    assert wrong.status_code == 401 and wrong.json()["error"]["message"].startswith("missing or wrong API key")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_session_token_is_no_cookie_and_a_cookie_is_no_credential(guarded: MakeGuarded) -> None:
    """The viewer's session was a cookie, and a cookie reaches every service on the same host name
    whatever its port: a page on localhost:3000 received it, replayed it for 12 hours of full API
    access, and could cancel debates with it across ports, SameSite=Strict notwithstanding (an
    outside attack, session 38). The token is sent as a bearer, kept in the viewer's sessionStorage
    (its origin's: this port's alone); a cookie carrying it is no credential."""
    server = guarded(api_key=KEY)
    token = httpx.post(server.url + "/v1/session", headers=AUTH).json()["token"]
    debate_id = httpx.post(server.url + "/v1/debates", json={"question": "Q?"}, headers=AUTH).json()["id"]
    # a leaked token is not a model to chat with, an MCP client or a Responses WebSocket (a re-attack)
    for path in ("/v1/chat/completions", "/v1/responses", "/mcp"):
        other = httpx.post(server.url + path, headers={"Authorization": f"Bearer {token}"}, json={})
        assert other.status_code == 401 and "viewer's own routes only" in other.json()["error"]["message"], path
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    for name in ("moot_session", "session", "token"):
        jar = {"cookie": f"{name}={token}", "Origin": "http://localhost:3000"}
        assert httpx.post(f"{server.url}/v1/debates/{debate_id}/cancel", headers=jar).status_code == 401
        assert httpx.get(server.url + "/v1/debates", headers=jar).status_code == 401


def declared(spec: dict[str, Any], method: str, template: str) -> set[str]:
    return set(spec["paths"][template][method]["responses"])


def test_the_openapi_schema_lists_the_responses_the_server_sends(guarded: MakeGuarded) -> None:
    server = guarded(latency=60, max_running=1, max_queued=1, max_body_bytes=4096)
    spec = httpx.get(server.url + "/openapi.json").json()
    assert '"422"' not in json.dumps(spec) and "HTTPValidationError" not in json.dumps(spec)
    assert '"401"' not in json.dumps(spec)  # no key: never sent
    for template, operations in spec["paths"].items():  # a store out of reach, a stop: any route's 503
        for method, operation in operations.items():
            assert "store_unavailable" in operation["responses"]["503"]["description"], (method, template)
    json_headers = {"content-type": "application/json"}
    running = httpx.post(server.url + "/v1/debates", json={"question": "Q?"}).json()["id"]
    queued = httpx.post(server.url + "/v1/debates", json={"question": "Q?"}).json()["id"]
    chat = {"model": "moot/single", "messages": [{"role": "user", "content": "Q?"}]}
    samples: list[tuple[str, str, str, dict[str, Any]]] = [
        ("get", "/v1/debates", "/v1/debates", {"params": {"limit": 0}}),
        ("get", "/v1/debates", "/v1/debates", {}),
        ("post", "/v1/debates", "/v1/debates", {"json": {"question": " "}}),
        ("post", "/v1/debates", "/v1/debates", {"content": b"{}", "headers": {"content-type": "text/plain"}}),
        ("post", "/v1/debates", "/v1/debates", {"json": {"question": "x" * 5000}}),
        ("post", "/v1/debates", "/v1/debates", {"json": {"question": "one too many"}}),
        ("get", "/v1/debates/{debate_id}", "/v1/debates/nope", {}),
        ("get", "/v1/debates/{debate_id}", f"/v1/debates/{queued}", {}),
        ("get", "/v1/debates/{debate_id}/result", f"/v1/debates/{queued}/result", {}),
        ("get", "/v1/debates/{debate_id}/result", "/v1/debates/nope/result", {}),
        ("get", "/v1/debates/{debate_id}/events", "/v1/debates/nope/events", {}),
        ("get", "/v1/debates/{debate_id}/events", f"/v1/debates/{queued}/events", {"params": {"after": -1}}),
        ("post", "/v1/debates/{debate_id}/cancel", f"/v1/debates/{queued}/cancel", {}),
        ("post", "/v1/debates/{debate_id}/cancel", f"/v1/debates/{queued}/cancel", {}),
        ("post", "/v1/debates/{debate_id}/cancel", "/v1/debates/nope/cancel", {}),
        ("post", "/v1/chat/completions", "/v1/chat/completions", {"json": {**chat, "model": "moot/nope"}}),
        ("post", "/v1/chat/completions", "/v1/chat/completions", {"json": {**chat, "n": 3}}),
        ("post", "/v1/chat/completions", "/v1/chat/completions", {"content": b"[", "headers": json_headers}),
        ("get", "/v1/protocols", "/v1/protocols", {}),
        ("get", "/v1/models", "/v1/models", {}),
        ("post", "/v1/session", "/v1/session", {}),
    ]
    seen: set[int] = set()
    for method, template, path, kwargs in samples:
        response = httpx.request(method.upper(), server.url + path, timeout=60, **kwargs)
        assert str(response.status_code) in declared(spec, method, template), (method, path, response.status_code)
        if response.status_code >= 400:
            ErrorBody.model_validate_json(response.content)  # the shape the schema declares
        seen.add(response.status_code)
    assert {400, 404, 409, 413, 415, 429} <= seen  # the sample did reach each error
    httpx.post(f"{server.url}/v1/debates/{running}/cancel", timeout=30)
    # with a key, every /v1 route declares its 401 and the bearer scheme
    keyed = guarded(api_key=KEY)
    spec = httpx.get(keyed.url + "/openapi.json").json()
    assert spec["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    for template, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "401" in operation["responses"] and operation["security"] == [{"bearer": []}], (method, template)
    refused = httpx.post(keyed.url + "/v1/debates", json={"question": "Q?"})
    assert refused.status_code == 401 and "401" in declared(spec, "post", "/v1/debates")


# ---------------------------------------- issue 39: lone surrogates, the Host header, OpenAI's limits


def raw_json(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    """A JSON body as a client writes it, escapes and all: ``"\\udfff"`` reaches the server as six
    characters (httpx's own encoder cannot write half a surrogate pair)."""
    content = json.dumps(body).encode()  # ensure_ascii: a lone surrogate becomes its \\u escape
    return httpx.post(url, content=content, headers={"content-type": "application/json", **headers}, timeout=30)


CHAT = {"model": "moot/vote", "messages": [{"role": "user", "content": "Q"}]}
RESPONSES = {"model": "moot/vote", "input": "Q"}
LONE = "\udfff"


@pytest.mark.parametrize(
    ("path", "body", "field", "at"),
    [
        ("/v1/responses", {**RESPONSES, "instructions": LONE}, "instructions", 0),
        ("/v1/responses", {**RESPONSES, "input": f"Q{LONE}"}, "input", 1),
        ("/v1/responses", {**RESPONSES, "input": [{"role": "system", "content": f"ab{LONE}"},
                                                  {"role": "user", "content": "Q"}]}, "input[0].content", 2),
        ("/v1/responses", {**RESPONSES, "metadata": {"k": LONE}}, "metadata.k", 0),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "system", "content": LONE},
                                                       {"role": "user", "content": "Q"}]}, "messages[0].content", 0),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text",
                                                                                      "text": f"Q{LONE}"}]}]},
         "messages[0].content[0].text", 1),
        ("/v1/chat/completions", {**CHAT, "metadata": {"k": f"v{LONE}"}}, "metadata.k", 1),
        ("/v1/debates", {"question": f"Q{LONE}?"}, "question", 1),
        ("/v1/debates", {"question": "Q?", "context": [{"text": LONE}]}, "context[0].text", 0),
        ("/v1/debates", {"question": "Q?", "context": ["ok", f"x{LONE}"]}, "context[1]", 1),
        ("/v1/debates", {"question": "Q?", "reference": LONE}, "reference", 0),
        ("/v1/debates", {"question": "Q?", "protocol": {"preset": "single", "name": LONE}}, "protocol.name", 0),
        ("/v1/debates/anything/cancel", {"reason": LONE}, "reason", 0),  # any other POST, at the door
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_the_field_on_every_route(
    guarded: MakeGuarded, path: str, body: dict[str, Any], field: str, at: int
) -> None:
    """Half a UTF-16 pair in any text field (issue 39, S3 and E1): no UTF-8 store can hold it, so it
    was a 500 (a question, metadata) or, worse, a write that failed and took other clients' writes
    with it. It is refused at the door, naming the field, before any debate is queued."""
    server = guarded()
    response = raw_json(server.url + path, body)
    error = ErrorBody.model_validate_json(response.content).error
    assert response.status_code == 400, response.text
    assert error.message == (
        f"{field}: contains a lone surrogate (U+{ord(LONE):04X}) at position {at}; send valid UTF-16/UTF-8 text"
    )
    assert error.param == field
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []  # nothing was queued
    # a key holding one is named by its place too, and a whole pair (an emoji) is text like any other
    keyed = raw_json(server.url + "/v1/chat/completions", {**CHAT, "metadata": {f"k{LONE}": "v"}})
    message = keyed.json()["error"]["message"]
    assert keyed.status_code == 400 and message.startswith("metadata: the key 'k\\udfff' contains a lone surrogate")
    pair = raw_json(server.url + "/v1/debates", {"question": "Is \U0001f600 a smile?", "rounds": 1})
    assert pair.status_code == 202, pair.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/debates", {"question": "nul\u0000byte"}, "question"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi\u0000there"}]},
         "messages[0].content"),
        ("/v1/responses", {**RESPONSES, "input": "hi\u0000there"}, "input"),
    ],
)  # fmt: skip
def test_a_nul_is_a_400_naming_the_field_on_every_route(
    guarded: MakeGuarded, path: str, body: dict[str, Any], field: str
) -> None:
    """A NUL (U+0000) in a text field: no PostgreSQL text can hold it, so on that store it was a 500
    with a traceback in the log (MCP: the driver's own words). It is refused at the door on every
    store, as half a UTF-16 pair is, naming the field, before any debate is queued."""
    server = guarded()
    response = raw_json(server.url + path, body)
    error = ErrorBody.model_validate_json(response.content).error
    assert response.status_code == 400, response.text
    at = body_text(body, field).index("\x00")
    assert error.message == f"{field}: contains a NUL character (U+0000) at position {at}, which is not text; remove it"
    assert error.param == field
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []


def test_a_nul_in_the_address_is_a_400_on_every_route(guarded: MakeGuarded) -> None:
    """A NUL in a debate's id (``/v1/debates/a%00b``) or a query parameter reached the store's lookup:
    on PostgreSQL a 500 with a traceback (a review, session 38). Refused at the door, on any route."""
    server = guarded()
    for method, path in (
        ("GET", "/v1/debates/a%00b"),
        ("GET", "/v1/debates/a%00b/result"),
        ("GET", "/v1/debates/a%00b/events"),
        ("POST", "/v1/debates/a%00b/cancel"),
        ("GET", "/v1/debates?status=%00"),
        ("GET", "/debates/a%00b"),
    ):
        response = httpx.request(method, server.url + path)
        assert response.status_code == 400, (method, path, response.text)
        assert response.json()["error"]["message"] == (
            "the address holds a NUL character (%00), which is not text; remove it"
        )


def body_text(body: dict[str, Any], field: str) -> str:
    """The string at ``field`` (``messages[0].content``) of ``body``."""
    value: Any = body
    for part in field.replace("]", "").replace("[", ".").split("."):
        value = value[int(part)] if part.isdigit() else value[part]
    assert isinstance(value, str)
    return value


def _alias_bomb(levels: int) -> str:
    """A protocol whose parameter is a list of nested YAML aliases: 10**levels items once expanded."""
    rows = ["&a0 [" + ",".join(["0"] * 10) + "]"]
    rows += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return f"vote(x=[{','.join(rows)}])"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/debates", {"question": "Q?", "protocol": _alias_bomb(7)}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "vote@" + "9" * 5000}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=" + "9" * 5000 + ")"}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "vote(x=" + "[" * 3000 + "]" * 3000 + ")"}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=" + "- " * 400 + "1)"}, "protocol"),
        # YAML 1.1's base-60 integers were read in quadratic time (400 KB: 5 s), its hexadecimal ones past
        # Python's digit limit (a 500 from the hint's JSON): both are words now, refused as rounds
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=1" + ":0" * 200_000 + ")"}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=0x" + "f" * 20_000 + ")"}, "protocol"),
        # its octal ones too (a 500), and its timestamps (a date the hint's JSON could not write: a 500)
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=0" + "7" * 6_000 + ")"}, "protocol"),
        ("/v1/debates", {"question": "Q?", "protocol": "mad(rounds=2024-01-01)"}, "protocol"),
    ],
)
def test_a_protocol_string_costs_what_its_length_does(
    guarded: MakeGuarded, path: str, body: dict[str, Any], field: str
) -> None:
    """A 311-character protocol string of nested YAML aliases held the event loop 1.5 s and answered
    a 36 MB error (each 46 characters more, ten times that); a 5,000-digit count or 3,000 nested
    brackets were a 500. Each is a short 400 naming the field now, before anything is queued."""
    server = guarded()
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 400 and len(response.content) < 2000, (response.status_code, len(response.content))
    assert response.json()["error"]["param"] == field, response.text
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []


def test_a_prompt_template_cannot_multiply_the_question(guarded: MakeGuarded) -> None:
    """An inline spec whose opening was ``{question}`` a thousand times, with a 20,000-character
    question, was queued (the size check counted a placeholder once) and sent the model a prompt of
    20 million characters, stored too. A placeholder may be used four times in a prompt, and the
    check counts each use."""
    server = guarded()
    base = {"preset": "single", "prompts": {"opening": "{question}" * 1000}}
    many = httpx.post(server.url + "/v1/debates", json={"question": "Q " * 9_000, "protocol": base}, timeout=60)
    assert many.status_code == 400, many.text
    assert "prompts.opening uses {question} 1000 times; each placeholder may appear at most 4 times" in many.text
    # four uses of a question that fits once but not four times: refused before anything is queued
    four = {"preset": "single", "prompts": {"opening": "{question}\n" * 4}, "budget": {"max_prompt_tokens": 5_000}}
    refused = httpx.post(server.url + "/v1/debates", json={"question": "word " * 3_000, "protocol": four}, timeout=60)
    assert refused.status_code == 400 and "more than 5,000 tokens" in refused.text, refused.text
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []
    fits = httpx.post(server.url + "/v1/debates", json={"question": "word " * 500, "protocol": four}, timeout=60)
    assert fits.status_code == 202, fits.text
    # the rebuttal's uses count too (only the opening's did), and so does what the persona repeats: a
    # 300 KB inline spec of goals and {goal}s made a 2.7 MB prompt
    again = {"opening": "{question}", "rebuttal": "{question}\n" * 4 + "{history}"}
    rebuttal = {"preset": "affirmative-critical", "prompts": again, "budget": {"max_prompt_tokens": 5_000}}
    late = httpx.post(server.url + "/v1/debates", json={"question": "word " * 1_500, "protocol": rebuttal}, timeout=60)
    assert late.status_code == 400 and "the question alone comes to more than 5,000 tokens" in late.text, late.text
    goal = "win " * 30_000
    persona = {"preset": "single", "prompts": {"opening": "{question} {goal} {goal} {goal} {goal}"},
               "participants": [{"id": "a", "persona": {"name": "A", "goal": goal}}],
               "budget": {"max_prompt_tokens": 50_000}}  # fmt: skip
    posed = httpx.post(server.url + "/v1/debates", json={"question": "Q?", "protocol": persona}, timeout=60)
    refused = "the question and the agent's persona alone come to more than"
    assert posed.status_code == 400 and refused in posed.text, posed.text


def test_only_loopback_names_reach_a_loopback_server(guarded: MakeGuarded) -> None:
    """DNS rebinding (issue 39, S5): a web page whose name its attacker points at 127.0.0.1 sends that
    name as its Host; the server on loopback answers only to loopback names (any port) and to
    ``--allowed-hosts``, on every path, before the key or a byte of the body."""
    server = guarded()
    _, port = server.address
    evil = {"Host": "evil.example"}
    started = httpx.post(server.url + "/v1/debates", json={"protocol": "single", "question": "x"}, headers=evil)
    error = ErrorBody.model_validate_json(started.content).error
    assert started.status_code == 400 and error.param == "Host" and error.code == "host_not_allowed"
    assert "Host 'evil.example' is not a name this server answers to" in error.message
    assert "--allowed-hosts evil.example" in error.message
    for path in ("/v1/debates", "/", "/static/moot.js", "/docs", "/openapi.json"):
        refused = httpx.get(server.url + path, headers=evil)
        assert refused.status_code == 400 and refused.headers["x-frame-options"] == "DENY", path
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []  # nothing was started
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST", "localhost."):
        assert httpx.get(server.url + "/v1/debates", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example", "[::2]", ""):
        assert httpx.get(server.url + "/v1/protocols", headers={"Host": host}).status_code == 400, host
    # (a review: what follows a bracket or a colon must be a port, and one Host header only)
    for host in ("[::1]evil.example", "localhost:80@evil.example", "localhost:abc", "[::1]:80x"):
        assert httpx.get(server.url + "/v1/protocols", headers={"Host": host}).status_code == 400, host
    with connect(server) as sock:
        sock.sendall(b"GET /v1/protocols HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n")
        status, _, body = read_response(sock)
        assert status == 400 and "(more than one)" in ErrorBody.model_validate_json(body).error.message
    # the names given, any port; a *. name allows its subdomains
    named = guarded(allowed_hosts=["moot.example.com", "*.corp.example"])
    for host, status in (("moot.example.com:8443", 200), ("a.corp.example", 200), ("corp.example", 400),
                         ("localhost", 200), ("evil.example", 400)):  # fmt: skip
        assert httpx.get(named.url + "/v1/protocols", headers={"Host": host}).status_code == status, host
    # bound elsewhere (with a key): any name, unless --allowed-hosts names some
    anywhere = guarded(host="0.0.0.0", api_key=KEY)
    assert httpx.get(anywhere.url + "/v1/protocols", headers={**AUTH, "Host": "moot.lan"}).status_code == 200
    listed = guarded(host="0.0.0.0", api_key=KEY, allowed_hosts=["moot.lan"])
    assert httpx.get(listed.url + "/v1/protocols", headers={**AUTH, "Host": "moot.lan:8000"}).status_code == 200
    assert httpx.get(listed.url + "/v1/protocols", headers={**AUTH, "Host": "evil.example"}).status_code == 400


def test_a_refused_host_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    app = create_app(ServerSettings(db=tmp_path / "m.sqlite", models=["openai:fake"]))
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b" " * 100_000, "more_body": True}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = _scope("POST", "/v1/debates", [(b"content-type", b"application/json"), (b"content-length", b"900000")])
    scope["headers"] = [(b"host", b"evil.example"), *scope["headers"][1:]]
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400 and reads == 0 and (b"connection", b"close") in sent[0]["headers"]


def test_cross_origin_requests_get_no_cors_headers_and_no_credentials(guarded: MakeGuarded) -> None:
    """A page on another origin may send a request but never read its answer: no response carries an
    Access-Control-Allow-* header (moot serve has no CORS configuration), a preflight is refused, and
    the viewer's session is a bearer token, not a cookie, so a request from another page carries no
    credentials."""
    server = guarded(api_key=KEY)
    origin = {"Origin": "http://evil.example"}
    preflight = httpx.options(
        server.url + "/v1/debates",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"},
    )
    assert preflight.status_code >= 400
    for response in (
        preflight,
        httpx.get(server.url + "/v1/protocols", headers={**origin, **AUTH}),
        httpx.post(server.url + "/v1/session", headers={**origin, **AUTH}),
        httpx.get(server.url + "/", headers=origin),
    ):
        assert not [h for h in response.headers if h.lower().startswith("access-control-")], response.headers
        assert "set-cookie" not in response.headers  # the viewer's session is a bearer token, no cookie


def test_bad_allowed_hosts_are_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from moot.cli.main import app

    result = CliRunner().invoke(
        app, ["serve", "--allowed-hosts", "moot.lan,http://evil.example/", "--db", str(tmp_path / "m.sqlite")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--allowed-hosts: 'http://evil.example/' is not a host name" in " ".join(result.output.split())
    assert ServerSettings(allowed_hosts=[" Moot.LAN. ", "::1", ""]).allowed_hosts == ["moot.lan", "[::1]"]


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/v1/responses", {**RESPONSES, "input": [
            {"role": "user", "content": "Q"},
            {"type": "function_call_output", "call_id": "call_nope", "output": "21 C"}]},
         "input[1].call_id", "no function_call item with call_id 'call_nope'"),
        ("/v1/responses", {**RESPONSES, "input": [
            {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_b", "output": "x"},
            {"role": "user", "content": "Q"}]},
         "input[1].call_id", "call_id 'call_b'"),
        ("/v1/chat/completions", {**CHAT, "messages": [
            {"role": "user", "content": "Q"}, {"role": "tool", "tool_call_id": "call_nope", "content": "21 C"}]},
         "messages[1].tool_call_id", "no earlier assistant message made a tool call with id 'call_nope'"),
        ("/v1/chat/completions", {**CHAT, "metadata": {f"k{i}": "v" for i in range(17)}},
         "metadata", "17 keys is over the limit of 16"),
        ("/v1/responses", {**RESPONSES, "metadata": {"k" * 65: "v"}}, "metadata",
         "65 characters, over the limit of 64"),
        ("/v1/responses", {**RESPONSES, "metadata": {"k": "v" * 513}}, "metadata.k",
         "513 characters is over the limit of 512"),
        ("/v1/chat/completions", {**CHAT, "metadata": {"k": 5}}, "metadata.k", "valid string"),
    ],
)  # fmt: skip
def test_tool_outputs_without_their_call_and_metadata_over_openais_limits_are_400(
    guarded: MakeGuarded, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    """As OpenAI's API answers them (issue 39, L3): a tool's result must answer a call the input
    made, and metadata holds 16 keys of 64 characters at most, with string values of 512 at most."""
    server = guarded()
    response = httpx.post(server.url + path, json=body, timeout=30)
    error = ErrorBody.model_validate_json(response.content).error
    assert response.status_code == 400 and error.param == param and says in error.message, response.text
    assert httpx.get(server.url + "/v1/debates").json()["debates"] == []


def test_metadata_at_openais_limits_is_kept() -> None:
    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.openai.responses_request import ResponsesRequest

    full = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert ChatCompletionRequest.model_validate({**CHAT, "metadata": full}).metadata == full
    assert ResponsesRequest.model_validate({**RESPONSES, "metadata": full}).metadata == full
    # a response's metadata sent back (a client's 16 keys, and the server's two, spoofed or not): the
    # server's left out, to be set again for the new debate (it was 400 "18 keys is over the limit")
    echoed = {**full, "moot_debate_id": "spoof", "moot_url": "http://elsewhere/debates/spoof"}
    assert ResponsesRequest.model_validate({**RESPONSES, "metadata": echoed}).metadata == full


def test_the_guarded_protocol_is_httptools_where_installed_and_h11_on_request(tmp_path: Path) -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    settings = ServerSettings(db=tmp_path / "moot.sqlite")
    assert issubclass(guarded_protocol(settings), HttpToolsProtocol)  # the dev extra installs httptools
    assert issubclass(guarded_protocol(settings, "h11"), H11Protocol)
    assert guarded_protocol(settings, "h11").max_connections == settings.max_connections


def test_an_integer_field_takes_a_whole_float_as_json_schema_does_and_nothing_else() -> None:
    """Strict: "5", true and 5.5 are refused for an integer; 5.0 is the integer 5, as JSON Schema's
    integer takes it and the MCP tools do."""
    import pydantic

    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.openai.responses_request import ResponsesRequest
    from moot.server.schemas import DebateRequest

    assert ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 5.0, "n": 1.0}).max_tokens == 5
    assert ResponsesRequest.model_validate({**RESPONSES, "max_output_tokens": 64.0}).max_output_tokens == 64
    body = DebateRequest.model_validate({"question": "Q?", "rounds": 2.0, "budget": {"max_calls": 10.0}})
    assert body.rounds == 2 and body.budget.max_calls == 10
    for wrong in ("5", True, 5.5, 1e300):  # (1e300 is whole, and past any integer the body reader takes)
        with pytest.raises(pydantic.ValidationError, match="max_tokens") as refused:
            ChatCompletionRequest.model_validate({**CHAT, "max_tokens": wrong})
        assert refused.value.errors()[0]["type"] == "int_type"  # (1e300 was made a 301-digit int first)
