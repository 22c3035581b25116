"""``moot serve``'s HTTP API on a real loopback port: every endpoint, SSE resume, the OpenAI
endpoint through the official ``openai`` SDK, and each refusal. Debates run on the loopback fake
OpenAI-compatible server."""

from __future__ import annotations

import functools
import gc
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from moot.core.types import DebateResult
from moot.models.base import approx_tokens
from moot.server import Limits, ServerSettings
from moot.server.openai.catalogue import is_application
from moot.server.openai.chat import TokenCount
from moot.server.schemas import DebateRequest, TokenData
from moot.server.state import INTERRUPTED
from moot.server.state.manager import NEVER_STARTED
from moot.server.state.sqlite import SqliteStore
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from serving import FAKE_KEY, ServerThread, read_events, wait_for

MakeServer = Callable[..., tuple[ServerThread, FakeOpenAIServer]]


@pytest.fixture
def make_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeServer]:
    """Start a fake backend and ``moot serve``'s app on it: ``make_server(latency=..., **settings)``."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with ExitStack() as stack:

        def make(
            latency: float = 0.01, reply: Any = None, cached_tokens: int = 0, **overrides: Any
        ) -> tuple[ServerThread, FakeOpenAIServer]:
            fake = stack.enter_context(FakeOpenAIServer(latency=latency, reply=reply, cached_tokens=cached_tokens))
            settings = ServerSettings(
                db=tmp_path / f"moot-{fake.port}.sqlite",
                models=["openai:fake", "openai:fake-2"],
                base_url=fake.base_url,
                keepalive_s=overrides.pop("keepalive_s", 0.2),
                **overrides,
            )
            server = stack.enter_context(ServerThread(settings))
            return server, fake

        yield make


@pytest.fixture
def served(make_server: MakeServer) -> tuple[ServerThread, FakeOpenAIServer]:
    return make_server()


def start(url: str, **body: Any) -> str:
    response = httpx.post(url + "/v1/debates", json={"question": "Is 7 prime?", **body})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def finished(url: str, debate_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        info: dict[str, Any] = httpx.get(f"{url}/v1/debates/{debate_id}", headers=headers).json()
        return info if info["status"] not in ("queued", "running") else None

    result: dict[str, Any] = wait_for(done, f"debate {debate_id} to finish")
    return result


# ------------------------------------------------------------------------------------ catalogue


def test_protocols_and_models(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, _ = served
    protocols = httpx.get(server.url + "/v1/protocols").json()["protocols"]
    by = {p["name"]: p for p in protocols}
    assert by["affirmative-critical"]["calls"] == 5 and by["society-of-minds"]["decision"] == "vote"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    ids = [m.id for m in client.models.list()]
    # each protocol, then each again with its turns streamed as reasoning (for UIs that add no body field)
    chat = [name for name in sorted(by) if not is_application(name)]  # an application's protocols: apart
    assert ids == [f"moot/{name}" for name in chat] + [f"moot/{name}:trace" for name in chat]
    raw = httpx.get(server.url + "/v1/models").json()
    assert raw["backends"] == ["openai:fake", "openai:fake-2"] and raw["default_backend"] == "openai:fake"
    assert httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/debates"]["post"]
    # The OpenAPI page's script and style come from this server, not from a CDN.
    docs = httpx.get(server.url + "/docs").text
    assert "cdn." not in docs and "/static-offline-docs/swagger-ui-bundle.js" in docs
    script = httpx.get(server.url + "/static-offline-docs/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000


# -------------------------------------------------------------------------------------- debates


def test_a_debate_runs_in_the_background_and_is_stored(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, fake = served
    response = httpx.post(
        server.url + "/v1/debates",
        json={"question": "What is RAG?", "context": ["RAG retrieves passages.", {"text": "b", "source": "s.md"}]},
    )
    assert response.status_code == 202
    created = response.json()
    debate_id = created["id"]
    assert response.headers["location"] == f"/v1/debates/{debate_id}" and created["status"] in ("queued", "running")
    info = finished(server.url, debate_id)
    assert info["status"] == "complete" and info["protocol"] == "affirmative-critical"
    result = DebateResult.model_validate(info["result"])
    assert result.schema_version == "moot.debate/1" and result.llm_calls == 5 == info["calls"] == len(fake.requests)
    assert result.final_answer and result.task.context[1].source == "s.md"
    assert info["tokens"] == result.usage.total_tokens > 0
    # the download is the bare transcript, as moot.load_result reads it
    download = httpx.get(f"{server.url}/v1/debates/{debate_id}/result")
    assert "attachment" in download.headers["content-disposition"]
    assert DebateResult.model_validate_json(download.content) == result


@pytest.mark.parametrize("end", ["complete", "cancelled", "timeout"])
def test_a_finished_debate_is_freed_without_the_garbage_collector(make_server: MakeServer, end: str) -> None:
    """Nothing a debate holds (its log, its engine, its task's context, the frames of the exception
    that stopped it) closes over the debate: each such closure was a reference cycle that only the
    collector freed, every debate's whole graph, and its passes cost the server about 6% of its CPU at
    64 debates at once (docs/benchmarks.md, "Session 40"). A cancel or a timeout stops the debate in a
    simultaneous stage, through its TaskGroup (a cycle of CPython's own there)."""
    server, fake = make_server(latency=0.05, finished_logs_in_memory=1)  # (the first debates' logs are dropped)
    kept = {"LiveDebate", "EventLog", "Engine", "DebateResult", "Turn"}
    gc.collect()
    gc.disable()  # (what the debates leave behind is found below, not collected meanwhile)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        if end == "cancelled":  # round 1's two turns wait for minutes: cancelled in the simultaneous stage
            fake.faults.extend([Fault.delay(60), Fault.delay(60)])
            stopped = start(server.url)
            wait_for(lambda: len(fake.requests) >= 2, "round 1's calls")
            assert httpx.post(f"{server.url}/v1/debates/{stopped}/cancel").json()["status"] == "cancelled"
        elif end == "timeout":
            fake.faults.extend([Fault.delay(60), Fault.delay(60)])
            stopped = start(server.url, budget={"timeout_s": 0.5})
            assert finished(server.url, stopped)["result"]["stop_reason"] == "timeout"
        fake.faults.clear()
        ids = [start(server.url, question=f"Q{i}?") for i in range(3)]
        for debate_id in ids:
            assert finished(server.url, debate_id)["status"] == "complete"
            assert read_events(f"{server.url}/v1/debates/{debate_id}/events")[-1]["event"] == "debate_done"
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage} & kept)
        # nor does the log kept for late readers keep its debate (engine, transcript) alive
        alive = [o for o in gc.get_objects() if type(o).__name__ == "LiveDebate"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == [] and alive == []


def test_events_are_the_engines_own_numbered_without_gaps(make_server: MakeServer) -> None:
    # A live reader's stream (token deltas included): one arriving after the end reads the stored
    # events, without them. The model is slow enough that the reader is there first, on a loaded
    # machine too (at 10 ms a call the debate ended first about once in three runs of `-n 2`).
    server, _ = make_server(latency=0.3)
    debate_id = start(server.url)
    events = read_events(f"{server.url}/v1/debates/{debate_id}/events")
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    names = [e["event"] for e in events]
    assert names[0] == "debate_started" and names[-1] == "debate_done"
    assert names.count("turn_started") == names.count("turn_done") == 5 and names.count("round_done") == 2
    # the tokens of each turn add up to its text
    streamed: dict[tuple[str, int], str] = {}
    for e in events:
        if e["event"] == "token":
            assert TokenData.model_validate(e["data"]).model_dump() == e["data"]  # the documented shape
            key = (e["data"]["speaker"], e["data"]["round"])
            streamed[key] = streamed.get(key, "") + e["data"]["text"]
    for e in events:
        if e["event"] == "turn_done":
            turn = e["data"]["turn"]
            assert streamed[(turn["speaker"], turn["round"])] == turn["text"]
            assert "messages" not in turn
    done = events[-1]["data"]
    assert done["status"] == "complete" and done["stop_reason"] == "max_rounds" and done["totals"]["calls"] == 5
    started = events[0]["data"]
    assert [p["id"] for p in started["participants"]] == ["affirmative", "critical"] and started["rounds"] == 2


@pytest.mark.parametrize("window", [1.0, 0.0])
def test_token_deltas_are_gathered_over_the_servers_window(make_server: MakeServer, window: float) -> None:
    """A turn's pieces are gathered into few ``token`` events over the window (not one per streamed
    piece, which cost more than the rest of a served debate), its first piece sent at once;
    ``token_window_s=0`` keeps an event per piece."""
    words = " ".join(f"word{i}" for i in range(40))
    server, fake = make_server(reply=lambda request: words, token_window_s=window)
    # A word a chunk, 10 ms apart (0.4 s a turn, within the window of 1 s): the model passes each on
    # as its own piece, but those a loaded machine reads together, which it passes on as one.
    fake.faults.extend([Fault.trickle(0.01), Fault.trickle(0.01)])
    debate_id = start(server.url, rounds=1, **{"with": {"synthesize": False}})
    events = read_events(f"{server.url}/v1/debates/{debate_id}/events")
    tokens = [e["data"] for e in events if e["event"] == "token"]
    for speaker in ("affirmative", "critical"):
        mine = [t["text"] for t in tokens if t["speaker"] == speaker]
        assert "".join(mine) == words
        # The first piece is sent at once, alone (the words read with it, on a loaded machine): it
        # never waits for the window, the rest of the turn is gathered, here until the turn ends.
        assert words.startswith(mine[0]) and len(mine[0]) < len(words)
        assert 2 <= len(mine) < 10 if window else len(mine) > 10


@pytest.mark.parametrize("in_memory", [64, 0])
def test_a_reader_arriving_after_the_end_gets_no_token_deltas(make_server: MakeServer, in_memory: int) -> None:
    """Token deltas are a live reader's only: never stored, never redacted (a key split across two of
    them could not be). A reader arriving after the end got them from memory (the debate's log, or
    the bus, which still held them), a key the model echoed included (an outside attack, session 38).
    It now reads what the store keeps, whichever way the events reach it."""
    shaped = "sk-proj-" + "Echoed0123456789" * 2
    server, _ = make_server(
        reply=lambda request: f"my key is {shaped} as you asked", latency=0.3, finished_logs_in_memory=in_memory
    )
    debate_id = start(server.url, rounds=1, **{"with": {"synthesize": False}})
    live = read_events(f"{server.url}/v1/debates/{debate_id}/events")
    assert any(e["event"] == "token" for e in live)  # the live reader gets them, as generated
    late = read_events(f"{server.url}/v1/debates/{debate_id}/events")
    assert [e["event"] for e in late] == [e["event"] for e in live if e["event"] != "token"]
    assert shaped not in json.dumps(late) and "***" in json.dumps(late)


def test_moot_serve_takes_the_token_window_in_milliseconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import moot.server
    from moot.cli.main import app

    served: list[ServerSettings] = []

    def app_of(settings: ServerSettings, store: Any = None) -> Any:
        if store is not None:
            store.close()  # opened (and locked) by `moot serve` before the app: released for the next call
        served.append(settings)
        raise RuntimeError("not started: the test reads the settings only")

    monkeypatch.setattr(moot.server, "create_app", app_of)
    script = tmp_path / "replies.json"
    script.write_text('["unused"]', encoding="utf-8")
    args = ["serve", "--models", f"scripted:{script}", "--db", str(tmp_path / "moot.sqlite"), "--port", "0"]
    CliRunner().invoke(app, [*args, "--token-window-ms", "20"])
    CliRunner().invoke(app, args)
    assert [s.token_window_s for s in served] == [0.02, 0.05]  # the default: 50 ms
    wrong = CliRunner().invoke(app, [*args, "--token-window-ms", "2000"])
    assert wrong.exit_code == 2 and "--token-window-ms" in wrong.output and len(served) == 2


def test_token_count_of_a_growing_text_is_the_count_of_the_whole() -> None:
    text = "Don't split: word-pieces, numbers 12.5 and ünïcode wörds; end."
    for size in (1, 2, 3, 5):
        count = TokenCount()
        for i in range(0, len(text), size):
            piece = text[i : i + size]
            assert count.after(piece) == approx_tokens(text[: i + size])
            count.add(piece)
        assert count.count == approx_tokens(text)


def test_sse_resumes_after_last_event_id_without_gap_or_repeat(
    make_server: MakeServer,
) -> None:
    server, _ = make_server(latency=0.15)
    debate_id = start(server.url)
    url = f"{server.url}/v1/debates/{debate_id}/events"
    first = read_events(url, limit=4)  # the client drops after 4 events, mid-debate
    rest = read_events(url, after=first[-1]["id"])
    ids = [e["id"] for e in first + rest]
    assert ids == list(range(1, len(ids) + 1)) and rest[-1]["event"] == "debate_done"
    # a late client gets the same log from the start, and so does one that sends an empty Last-Event-ID,
    # but for the token deltas: a live reader's only (never stored, never redacted)
    stored = [e for e in first + rest if e["event"] != "token"]
    assert read_events(url) == stored
    assert read_events(url, headers={"Last-Event-ID": ""}) == stored


def test_a_finished_debate_log_is_rebuilt_from_the_store_under_the_same_ids(make_server: MakeServer) -> None:
    server, _ = make_server(finished_logs_in_memory=0)
    debate_id = start(server.url)
    url = f"{server.url}/v1/debates/{debate_id}/events"
    live = read_events(url)
    assert finished(server.url, debate_id)["status"] == "complete"
    rebuilt = read_events(url)
    # every event but the token deltas (their text is in each turn_done), with the same ids and data
    assert rebuilt == [e for e in live if e["event"] != "token"]
    middle = rebuilt[len(rebuilt) // 2]["id"]
    assert read_events(url, after=middle) == [e for e in rebuilt if e["id"] > middle]


def test_list_pages_newest_first_and_filters_by_status(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, _ = served
    ids = [start(server.url, question=f"Question {i}?") for i in range(3)]
    for debate_id in ids:
        finished(server.url, debate_id)
    page = httpx.get(server.url + "/v1/debates", params={"limit": 2}).json()
    assert [d["id"] for d in page["debates"]] == ids[::-1][:2] and page["next_cursor"]
    rest = httpx.get(server.url + "/v1/debates", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [d["id"] for d in rest["debates"]] == [ids[0]] and rest["next_cursor"] is None
    assert "result" not in rest["debates"][0]
    complete = httpx.get(server.url + "/v1/debates", params={"status": "complete"}).json()["debates"]
    assert len(complete) == 3
    assert httpx.get(server.url + "/v1/debates", params={"status": "failed"}).json()["debates"] == []
    bad = httpx.get(server.url + "/v1/debates", params={"status": "done"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "status"


def test_cancel_keeps_the_partial_transcript(make_server: MakeServer) -> None:
    server, fake = make_server(latency=0.05)
    fake.faults.extend([Fault.delay(0.05), Fault.delay(0.05), Fault.delay(60), Fault.delay(60)])
    debate_id = start(server.url)

    def round_one_stored() -> bool:
        result = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"]
        return bool(result and result["rounds"] and len(result["rounds"][0]["turns"]) == 2)

    wait_for(round_one_stored, "round 1 to be stored")  # round 2 is then in flight, for 60 s
    response = httpx.post(f"{server.url}/v1/debates/{debate_id}/cancel", timeout=30)
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["status"] == "cancelled" and "cancelled by a request" in info["error"]
    result = DebateResult.model_validate(info["result"])
    assert [len(r.turns) for r in result.rounds] == [2, 2]
    assert result.status == "interrupted" and result.error and "cancelled" in result.error  # not "running"
    cut = result.rounds[1].turns
    assert all(t.error and t.error.startswith("cancelled:") for t in cut)
    events = read_events(f"{server.url}/v1/debates/{debate_id}/events")
    assert events[-1]["event"] == "debate_done" and events[-1]["data"]["status"] == "cancelled"
    # one end, the server's (the engine, cancelled, ends the debate too, without knowing by whom)
    assert [e["event"] for e in events].count("debate_done") == 1
    assert events[-1]["data"]["stop_reason"] == "cancelled" and "by a request" in events[-1]["data"]["error"]
    again = httpx.post(f"{server.url}/v1/debates/{debate_id}/cancel")
    assert again.status_code == 409 and "already ended" in again.json()["error"]["message"]
    assert httpx.post(f"{server.url}/v1/debates/nope/cancel").status_code == 404


def test_a_full_queue_answers_429_with_retry_after(make_server: MakeServer) -> None:
    server, _ = make_server(latency=60, max_running=1, max_queued=1)
    running, queued = start(server.url), start(server.url)
    response = httpx.post(server.url + "/v1/debates", json={"question": "one too many?"})
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    assert "retry later" in response.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/debates/{queued}").json()["status"] == "queued"
    early = httpx.get(f"{server.url}/v1/debates/{queued}/result")
    assert early.status_code == 409 and "no transcript yet" in early.json()["error"]["message"]
    cancelled = httpx.post(f"{server.url}/v1/debates/{queued}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["result"] is None
    assert httpx.post(f"{server.url}/v1/debates/{running}/cancel", timeout=30).json()["status"] == "cancelled"
    assert start(server.url)  # room again


def test_debates_still_queued_when_the_server_died_run_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a kill -9 leaves: rows still ``queued``, never started. They run at the next start under
    their ids; one that cannot (a chat completion, whose caller is gone; a model no longer offered)
    says that it never ran and how to send it again, not that it was cut while running."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    store = SqliteStore(db)
    waiting = DebateRequest.model_validate({"question": "Is 7 prime?", "rounds": 1, "with": {"synthesize": False}})
    gone = DebateRequest.model_validate({"question": "Is 9 prime?", "model": "openai:retired"})
    chat = {"chat_completion": True, "model": "moot/single", "moot": {}}
    responses = chat | {"endpoint": "/v1/responses"}  # what POST /v1/responses records
    for debate_id, request in (
        ("a" * 32, waiting.model_dump(mode="json", by_alias=True)),
        ("b" * 32, chat),
        ("d" * 32, responses),
    ):
        store.create(debate_id, protocol="affirmative-critical", question="Q?", model="openai:fake", request=request)
    store.create(
        "c" * 32,
        protocol="affirmative-critical",
        question="Q?",
        model="openai:retired",
        request=gone.model_dump(mode="json", by_alias=True),
    )
    store.close()
    with FakeOpenAIServer(latency=0.01) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url)
        with ServerThread(settings) as server:
            info = finished(server.url, "a" * 32)
            assert info["status"] == "complete" and info["calls"] == 2 == len(fake.requests)
            events = read_events(f"{server.url}/v1/debates/{'a' * 32}/events")
            assert events[0]["event"] == "debate_started" and events[-1]["data"]["status"] == "complete"
            chat_info = httpx.get(f"{server.url}/v1/debates/{'b' * 32}").json()
            assert chat_info["status"] == "interrupted" and NEVER_STARTED in chat_info["error"]
            assert "POST /v1/chat/completions again" in chat_info["error"] and INTERRUPTED not in chat_info["error"]
            # A queued Responses stream is told the route it came from, not the chat route.
            resp_info = httpx.get(f"{server.url}/v1/debates/{'d' * 32}").json()
            assert resp_info["status"] == "interrupted" and NEVER_STARTED in resp_info["error"]
            assert "it was a Responses API request" in resp_info["error"]
            assert "POST /v1/responses again" in resp_info["error"] and "chat" not in resp_info["error"]
            retired = httpx.get(f"{server.url}/v1/debates/{'c' * 32}").json()
            assert retired["status"] == "interrupted" and NEVER_STARTED in retired["error"]
            assert "openai:retired" in retired["error"] and "submit it again (POST /v1/debates)" in retired["error"]
            done = read_events(f"{server.url}/v1/debates/{'c' * 32}/events")
            assert [e["event"] for e in done] == ["debate_done"] and done[0]["data"]["error"] == retired["error"]


def test_budgets_are_capped_by_the_servers_limits(make_server: MakeServer) -> None:
    server, fake = make_server(limits=Limits(max_tokens_per_turn=120, max_calls=3))
    info = finished(server.url, start(server.url))
    # 5 planned calls, but the server allows 3: one round, and the synthesis
    assert info["calls"] == 3 and info["result"]["stop_reason"] == "call_budget"
    assert {r["max_tokens"] for r in fake.requests} == {120}  # the protocol's 500 and 800 lowered


def test_a_requests_turn_limit_bounds_the_synthesis_too(make_server: MakeServer) -> None:
    """budget.max_tokens_per_turn is every turn's, the synthesis's included, as the CLI's --max-tokens
    (it bounded the agents only: a synthesis ran to its own 800 tokens under a limit of 30)."""
    server, fake = make_server()
    info = finished(server.url, start(server.url, rounds=1, budget={"max_tokens_per_turn": 30}))
    assert info["status"] == "complete" and len(fake.requests) == 3  # two agents, the synthesis
    assert [r["max_tokens"] for r in fake.requests] == [30, 30, 30]


# ------------------------------------------------------------------------------------ refusals

REFUSALS: list[tuple[str, dict[str, Any], int, str | None, str]] = [
    ("scripted model", {"model": "scripted:/etc/passwd"}, 400, "model", "cannot name scripted: models"),
    ("langchain model", {"model": "langchain:os:system"}, 400, "model", "cannot name langchain: models"),
    ("model not offered", {"model": "openai:gpt-4o"}, 400, "model", "not offered by this server"),
    ("per-participant model", {"models": {"critical": "scripted:x.json"}}, 400, "models.critical", "scripted"),
    ("unknown participant", {"models": {"judge": "openai:fake"}}, 400, "models", "affirmative, critical"),
    ("base url", {"base_url": "http://evil.example/v1"}, 400, "base_url", "cannot choose an endpoint"),
    ("api key", {"api_key": "sk-mine-000000000000"}, 400, "api_key", "cannot choose an endpoint"),
    ("protocol file path", {"protocol": "/etc/passwd"}, 400, "protocol", "no preset named"),
    # a misspelt preset gets a did-you-mean, as the CLI's (a newcomer's trial, session 38)
    ("misspelt preset", {"protocol": "society-of-mind"}, 400, "protocol", "(did you mean 'society-of-minds'?)"),
    (
        "parameters in the name",
        {"protocol": "weighted-vote(signal=answer_prob,softmax_t=0.2)"},
        400,
        "protocol",
        '`with`: {"protocol": "weighted-vote", "with": {"signal": "answer_prob", "softmax_t": 0.2}}',
    ),
    ("vote@K", {"protocol": "vote@5"}, 400, "protocol", '{"protocol": "vote", "with": {"k": 5}}'),
    ("a run-level vote", {"protocol": "vote@uab(budget=4)"}, 400, "protocol", "run-level vote (moot batch, moot eval)"),
    ("a malformed value", {"protocol": "mad(rounds=[)"}, 400, "protocol", "no preset named"),
    ("the sample count twice", {"protocol": "vote@3(k=2)"}, 400, "protocol", "gives the sample count twice"),
    (
        "inline spec model",
        {
            "protocol": {
                "preset": "panel",
                "participants": [{"id": "a", "persona": {"name": "A"}, "model": "scripted:f"}],
            }
        },
        400,
        "protocol.participants.a.model",
        "scripted",
    ),
    (
        "inline spec endpoint",
        {"protocol": {"preset": "panel", "decision": {"kind": "synthesize", "base_url": "http://x"}}},
        400,
        "protocol.decision.base_url",
        "protocol.decision.base_url",
    ),
    ("inline spec invalid", {"protocol": {"name": "x", "participants": []}}, 400, "protocol", "participants"),
    ("budget over limit", {"budget": {"max_calls": 1000}}, 400, "budget.max_calls", "limit of 100"),
    ("timeout over limit", {"budget": {"timeout_s": 99999}}, 400, "budget.timeout_s", "limit of 600"),
    ("rounds over limit", {"rounds": 50}, 400, "rounds", "limit of 10"),
    ("preset rounds over limit", {"protocol": "society-of-minds", "with": {"rounds": 50}}, 400, "with.rounds", "10"),
    ("too many agents", {"protocol": "society-of-minds", "with": {"agents": 500}}, 400, "with.agents", "limit of 12"),
    ("too many samples", {"protocol": "vote", "with": {"k": 500}}, 400, "with.k", "limit of 12"),
    ("preset parameter unknown", {"protocol": "society-of-minds", "with": {"colour": 1}}, 400, "with", "colour"),
    ("unknown field", {"temperature": 2}, 400, "temperature", "unknown field"),
    ("too many passages", {"context": ["p"] * 51}, 400, "context", "limit of 50"),
    ("negative budget", {"budget": {"max_calls": 0}}, 400, "budget.max_calls", "greater than or equal to 1"),
    ("blank question", {"question": "  \n "}, 400, "question", "the question is blank"),
    ("blank passage", {"context": ["a passage", "   "]}, 400, "context", "passage 2 is blank"),
    ("agents as text", {"protocol": "society-of-minds", "with": {"agents": "3000"}}, 400, "with.agents", "limit of 12"),
    (
        "agents as float",
        {"protocol": "society-of-minds", "with": {"agents": 3000.0}},
        400,
        "with.agents",
        "limit of 12",
    ),
    (
        "inline preset with agents",
        {"protocol": {"preset": "society-of-minds", "with": {"agents": 20000}}},
        400,
        "protocol.with.agents",
        "limit of 12",
    ),
    (
        "inline participants",
        {"protocol": {"name": "x", "participants": [{"id": f"a{i}", "persona": {"name": "A"}} for i in range(13)]}},
        400,
        "protocol.participants",
        "limit of 12",
    ),
    ("protocol of the wrong type", {"protocol": 5}, 400, "protocol", "protocol:"),
    ("preset tokens over limit", {"protocol": "panel", "with": {"max_tokens": 999999}}, 400, "with.max_tokens", "2000"),
    # The CLI's pre-flight checks, before the debate is queued (not a failed debate after the fact).
    (
        "call budget below one round",
        {"protocol": "society-of-minds", "budget": {"max_calls": 2}},
        400,
        "budget.max_calls",
        "budget.max_calls: the call budget of 2 calls cannot fit one round (3 calls) plus the decision (0): "
        "give at least 3",
    ),
    (
        "call budget below the decision",
        {"budget": {"max_calls": 2}},
        400,
        "budget.max_calls",
        "cannot fit one round (2 calls) plus the decision (1): give at least 3",
    ),
    (
        "inline spec call budget",
        {"protocol": {"preset": "panel", "budget": {"max_calls": 1}}},
        400,
        "protocol.budget.max_calls",
        "protocol.budget.max_calls: the call budget of 1 call",
    ),
    (
        "temperature out of range",
        {"protocol": "society-of-minds", "with": {"temperature": 7}},
        400,
        "with.temperature",
        "temperature 7 (participant agent1) is out of range; give 0 to 2",
    ),
    (
        "seed out of range",
        {"protocol": "vote", "with": {"first_seed": 2**40}},
        400,
        "with.first_seed",
        "give 0 to 2147483647",
    ),
    (
        "inline seed out of range",
        {"protocol": {"name": "x", "participants": [{"id": "a", "persona": {"name": "A"}, "seed": -5}]}},
        400,
        "protocol.participants.a.seed",
        "seed -5 is out of range",
    ),
]


@pytest.mark.parametrize(("body", "status", "param", "needle"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_bad_debate_requests_are_refused_with_the_field_and_the_fix(
    served: tuple[ServerThread, FakeOpenAIServer], body: dict[str, Any], status: int, param: str | None, needle: str
) -> None:
    server, fake = served
    response = httpx.post(server.url + "/v1/debates", json={"question": "Q?", **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert needle in error["message"] and "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param
    assert fake.requests == []  # nothing ran


def test_malformed_and_oversized_bodies(make_server: MakeServer) -> None:
    server, _ = make_server(max_body_bytes=4096)
    bad_json = httpx.post(
        server.url + "/v1/debates", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    no_body = httpx.post(server.url + "/v1/debates")
    assert no_body.status_code == 400 and "the body is missing" in no_body.json()["error"]["message"]
    missing = httpx.post(server.url + "/v1/debates", json={"protocol": "panel"})
    assert missing.status_code == 400 and missing.json()["error"]["message"] == "question: required; add it"
    huge = httpx.post(server.url + "/v1/debates", json={"question": "x" * 10_000})
    assert huge.status_code == 413 and "limit of 4096 bytes" in huge.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"question": "'
        yield b"y" * 8000
        yield b'"}'

    streamed = httpx.post(server.url + "/v1/debates", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    long_question = httpx.post(server.url + "/v1/debates", json={"question": "z" * 3000})
    assert long_question.status_code == 202  # under both limits
    unknown = httpx.get(server.url + "/v1/debates/does-not-exist")
    assert unknown.status_code == 404 and "GET /v1/debates" in unknown.json()["error"]["message"]
    nowhere = httpx.get(server.url + "/v2/debates")
    assert nowhere.status_code == 404 and "no such path: GET /v2/debates" in nowhere.json()["error"]["message"]
    wrong_method = httpx.delete(server.url + "/v1/debates")
    assert wrong_method.status_code == 405 and "see /docs" in wrong_method.json()["error"]["message"]


def test_a_call_budget_the_servers_limit_cannot_fit_is_refused_naming_the_protocol(make_server: MakeServer) -> None:
    server, fake = make_server(limits=Limits(max_calls=2))
    response = httpx.post(server.url + "/v1/debates", json={"question": "Q?", "protocol": "society-of-minds"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "protocol" and "needs at least 3 calls" in error["message"]
    assert "limit of 2 calls" in error["message"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:  # the chat endpoint names its own field: model
        client.chat.completions.create(model="moot/society-of-minds", messages=[{"role": "user", "content": "Q?"}])
    assert err.value.body["param"] == "model" and "needs at least 3 calls" in err.value.message  # type: ignore[index]
    assert fake.requests == []


def test_parse_errors_say_what_is_wrong_with_the_body(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, fake = served
    json_headers = {"content-type": "application/json"}

    def post(path: str, content: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
        response = httpx.post(server.url + path, content=content, headers=headers or json_headers)
        assert 400 <= response.status_code < 500 and "Traceback" not in response.text, response.text
        error: dict[str, Any] = response.json()["error"]
        return {"status": response.status_code, **error}

    for path in ("/v1/debates", "/v1/chat/completions"):
        # JSON sent as text/plain: the content type is named, not "the body must be a JSON object"
        plain = post(path, b'{"question": "Q?"}', {"content-type": "text/plain"})
        assert plain["status"] == 415 and plain["param"] == "Content-Type"
        assert "'text/plain' is not JSON" in plain["message"] and "Content-Type: application/json" in plain["message"]
        form = post(path, b"question=Q", {"content-type": "application/x-www-form-urlencoded"})
        assert form["status"] == 415 and "application/x-www-form-urlencoded" in form["message"]
        latin1 = post(path, '{"question": "Café?"}'.encode("latin-1"))
        assert latin1["status"] == 400 and "not valid UTF-8 (byte 17 is 0xe9)" in latin1["message"]
        for depth in (40, 100_000):  # below and beyond the parser's own recursion limit
            deep = post(path, b"[" * depth + b"]" * depth)
            assert deep["status"] == 400 and "nests deeper than 32 levels" in deep["message"]
        nan = post(path, b'{"question": "Q?", "rounds": NaN}')
        assert nan["message"] == "rounds: NaN is not a JSON number; give a number" and nan["param"] == "rounds"
    assert post("/v1/debates", b'{"question": "Q?",}')["message"].startswith("the body is not valid JSON (")
    untyped = httpx.post(server.url + "/v1/debates", content=b'{"question": "Q?"}')
    assert untyped.status_code == 415 and untyped.json()["error"]["message"].startswith("Content-Type: missing; send")
    assert fake.requests == []
    charset = {"content-type": "application/json; charset=utf-8"}
    response = httpx.post(server.url + "/v1/debates", content=b'{"question": "Q?", "rounds": 1}', headers=charset)
    assert response.status_code == 202
    # the legacy functions API is refused as functions, not as tools (tools go through the debate)
    body = {"model": "moot/single", "messages": [{"role": "user", "content": "Q?"}]}
    for field, value in (("functions", [{"name": "f"}]), ("function_call", "auto")):
        refused = post("/v1/chat/completions", json.dumps({**body, field: value}).encode())
        assert refused["param"] == field and refused["message"].startswith(f"{field}: the legacy field; send")
        assert "tool" in refused["message"] and "cannot call" not in refused["message"]
    refused = post("/v1/chat/completions", json.dumps({**body, "tool_choice": "required"}).encode())
    assert refused["param"] == "tool_choice" and "has no tools" in refused["message"]


def test_question_length_limit(make_server: MakeServer) -> None:
    server, _ = make_server(limits=Limits(max_question_chars=100))
    response = httpx.post(server.url + "/v1/debates", json={"question": "q" * 101})
    assert response.status_code == 400 and response.json()["error"]["param"] == "question"


# ------------------------------------------------------------------------------------ the key


def test_an_api_key_guards_every_v1_route_and_never_leaks(make_server: MakeServer) -> None:
    key = "moot-server-key-0123456789abcdef"
    server, _ = make_server(api_key=key)
    assert httpx.get(server.url + "/v1/debates").status_code == 401
    wrong = httpx.get(server.url + "/v1/debates", headers={"Authorization": "Bearer sk-wrong-0123456789abcdef"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert "sk-wrong" not in wrong.text and key not in wrong.text
    assert "Authorization: Bearer <key>" in wrong.json()["error"]["message"]
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(server.url + "/v1/debates", headers={"Authorization": f"bearer {key}"}).status_code == 200
    assert httpx.get(server.url + "/v1/debates", headers={"Authorization": key}).status_code == 401
    debate_id = start_with(server.url, auth)
    info = finished(server.url, debate_id, auth)
    assert info["status"] == "complete" and key not in json.dumps(info)
    # the viewer trades the key for a session token, its bearer (no cookie: one would reach every
    # service on the same host name, whatever its port)
    with httpx.Client(base_url=server.url) as browser:
        assert browser.post("/v1/session").status_code == 401
        opened = browser.post("/v1/session", headers=auth)
        token = opened.json()["token"]
        assert opened.status_code == 200 and "set-cookie" not in opened.headers and key not in opened.text
        assert opened.json()["expires_in"] == server.settings.session_max_age_s
        session = {"Authorization": f"Bearer {token}"}
        assert browser.get("/v1/debates", headers=session).status_code == 200
        assert browser.get("/v1/debates", headers={"cookie": f"moot_session={token}"}).status_code == 401
        browser.headers.update(session)
        assert [e["event"] for e in read_events_with(browser, debate_id)][-1] == "debate_done"
        # the token alone does not renew itself (a session then never ended without the key)
        renewed = browser.post("/v1/session")
        assert renewed.status_code == 401 and "send the key" in renewed.json()["error"]["message"]
    # the pages themselves hold no data and need no key
    assert httpx.get(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/static/moot.js").status_code == 200
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key)
    assert client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": "Hi?"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope").models.list()


def test_a_secret_pasted_as_a_field_name_is_redacted_in_the_errors_param_too(
    served: tuple[ServerThread, FakeOpenAIServer],
) -> None:
    """An unknown field is named in the error's param by its key: a key pasted there came back whole
    in param (redacted in the message)."""
    server, _ = served
    secret = "sk-proj-Zq8yXw7VuT6sR5qP4oN3mL2kJ1iH0gFeDcBa"
    for path, body in [
        ("/v1/chat/completions", {"model": "moot/single", "messages": [{"role": "user", "content": "Q?"}]}),
        ("/v1/responses", {"model": "moot/single", "input": "Q?"}),
    ]:
        response = httpx.post(server.url + path, json={**body, secret: 1})
        assert response.status_code == 400 and secret not in response.text, response.text
        assert response.json()["error"]["param"] == "***", response.text


def test_the_store_holds_no_secret_typed_into_a_question(make_server: MakeServer) -> None:
    """A key typed into a question (the server's own, one shaped like a provider's, the backend's from
    the environment) and echoed by the model reaches no column of the server's store: not the
    question, the request, the transcript, the events nor an error."""
    key = "moot-server-key-0123456789abcdef"
    # The finished debates' live logs stay in memory (read below), not rebuilt from the store.
    server, _ = make_server(api_key=key, finished_logs_in_memory=8)
    auth = {"Authorization": f"Bearer {key}"}
    ids = []
    for secret in (key, "sk-typed-by-mistake-0123456789", FAKE_KEY):
        question = f"{secret} is my key: is 7 prime?"  # the fake model's replies quote the question's start
        response = httpx.post(server.url + "/v1/debates", json={"question": question, "rounds": 2}, headers=auth)
        assert response.status_code == 202, response.text
        ids.append(str(response.json()["id"]))
        assert finished(server.url, ids[-1], auth)["status"] == "complete"
    # The stream's events are the stored ones, redacted alike (only the token deltas, never stored,
    # reach a live reader as generated: this one arrives after the end).
    from httpx_sse import connect_sse

    with httpx.Client(base_url=server.url, headers=auth) as client:
        for debate_id in ids:
            with connect_sse(client, "GET", f"/v1/debates/{debate_id}/events") as source:
                events = [(int(e.id), e.event, e.data) for e in source.iter_sse() if e.data]
            live = [e for e in events if e[1] != "token"]
            assert live == events  # read after the end: no token deltas
            with sqlite3.connect(server.settings.db) as conn:
                kept = list(
                    conn.execute("SELECT id, name, data FROM events WHERE debate_id = ? ORDER BY id", (debate_id,))
                )
            assert live == kept and len(live) > 3
    # an inline protocol's name is the caller's text too (the store's protocol column)
    named = {"question": "Is 7 prime?", "protocol": {"preset": "single", "name": f"mine-{key}"}}
    response = httpx.post(server.url + "/v1/debates", json=named, headers=auth)
    assert response.status_code == 202, response.text
    assert finished(server.url, str(response.json()["id"]), auth)["status"] == "complete"
    with sqlite3.connect(server.settings.db) as conn:
        stored = [
            *conn.execute("SELECT protocol, question, request, result, COALESCE(error, '') FROM debates"),
            *conn.execute("SELECT name, data FROM events"),
        ]
    text = "\n".join("\t".join(row) for row in stored)
    assert len(stored) > 3 and text.count("is my key: is 7 prime?") >= 3  # the rest of the question is kept
    for secret in (key, "sk-typed-by-mistake", FAKE_KEY):
        assert secret not in text
    assert "*** is my key" in text


def start_with(url: str, headers: dict[str, str]) -> str:
    response = httpx.post(url + "/v1/debates", json={"question": "Is 7 prime?"}, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def read_events_with(client: httpx.Client, debate_id: str) -> list[dict[str, Any]]:
    from httpx_sse import connect_sse

    with connect_sse(client, "GET", f"/v1/debates/{debate_id}/events") as source:
        return [{"id": int(s.id), "event": s.event} for s in source.iter_sse() if s.data]


# ------------------------------------------------------------------------- OpenAI-compatible


def test_chat_completion_through_the_openai_sdk(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, _ = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model="moot/affirmative-critical",
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "Let me think."},
            {"role": "user", "content": "Is 7 prime?"},
        ],
        temperature=0.7,
    )
    extra = reply.model_extra or {}
    debate_id = extra["moot"]["debate_id"]
    assert reply.id == f"moot-{debate_id}" and reply.model == "moot/affirmative-critical"
    info = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()
    result = DebateResult.model_validate(info["result"])
    assert reply.choices[0].message.content == result.final_answer and reply.choices[0].finish_reason == "stop"
    # usage is the sum over every call of the debate, debaters and synthesis alike
    turns = [t for r in result.rounds for t in r.turns] + result.decision_turns
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(t.usage.prompt_tokens for t in turns) == result.usage.prompt_tokens
    assert reply.usage.completion_tokens == sum(t.usage.completion_tokens for t in turns)
    assert reply.usage.total_tokens == result.usage.total_tokens
    assert extra["moot"]["calls"] == 5 == result.llm_calls and extra["moot"]["url"].endswith(f"/debates/{debate_id}")
    # the last user message is the question, the others its context; the system message instructs
    assert result.task.question == "Is 7 prime?"
    assert [(c.source, c.text) for c in result.task.context] == [
        ("user", "What is 2 + 2?"),
        ("assistant", "Let me think."),
    ]
    listed = httpx.get(server.url + "/v1/debates").json()["debates"]
    assert listed[0]["id"] == debate_id


def test_streamed_chat_completion_sends_the_synthesis_as_it_is_generated(make_server: MakeServer) -> None:
    server, fake = make_server()
    # The synthesis (the fifth call) comes a word every 30 ms: it streams out over several chunks,
    # each holding what came over the server's 50 ms token window.
    fake.faults.extend([Fault.delay(0.01)] * 4 + [Fault.trickle(0.03)])
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="moot/affirmative-critical",
        messages=[{"role": "user", "content": "Is 7 prime?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    debate_id = chunks[0].id.removeprefix("moot-")
    assert {c.id for c in chunks} == {f"moot-{debate_id}"}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    result = DebateResult.model_validate(httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"])
    assert "".join(pieces) == result.final_answer and len(pieces) > 3  # as it comes, not one block
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    assert (finals[0].model_extra or {})["moot"]["calls"] == 5
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert (
        usage.usage.total_tokens == result.usage.total_tokens
        and usage.usage.prompt_tokens == result.usage.prompt_tokens
    )


def test_stream_sends_keepalives_while_rounds_run_and_a_vote_at_once(make_server: MakeServer) -> None:
    server, _ = make_server(latency=0.5, keepalive_s=0.1)
    body = {"model": "moot/society-of-minds", "messages": [{"role": "user", "content": "Is 7 prime?"}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert any(line.startswith(": keepalive") for line in lines)
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    # the vote's reply (a winning agent's own), known at once
    assert contents[0] == "" and [c for c in contents if c] == ["a fake model's reasoning\n\nok"]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)


def test_a_client_that_disconnects_does_not_stop_the_debate(make_server: MakeServer) -> None:
    server, _ = make_server(latency=0.2)
    body = {"model": "moot/affirmative-critical", "messages": [{"role": "user", "content": "Q?"}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    debate_id = json.loads(first.removeprefix("data: "))["id"].removeprefix("moot-")
    assert finished(server.url, debate_id)["status"] == "complete"


def test_a_failed_debate_is_an_error_for_the_sdk(make_server: MakeServer) -> None:
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "bad request upstream")] * 8)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": "Q?"}])
    assert err.value.status_code == 502 and "ended failed" in str(err.value)
    with pytest.raises(openai.APIError, match="ended failed"):
        list(
            client.chat.completions.create(
                model="moot/single", messages=[{"role": "user", "content": "Q?"}], stream=True
            )
        )


CHAT_REFUSALS: list[tuple[str, dict[str, Any], int, str]] = [
    ("not a debate model", {"model": "gpt-4o"}, 404, "use moot/<protocol>"),
    ("unknown preset", {"model": "moot/nope"}, 404, "moot/society-of-minds"),
    ("n", {"n": 2}, 400, "one answer"),
    ("a tool of another kind", {"tools": [{"type": "web_search"}]}, 400, "a tool is"),
    ("json on a selection", {"model": "moot/usc", "response_format": {"type": "json_object"}}, 400, "by a selection"),
    ("logprobs", {"logprobs": True}, 400, "log-probabilities"),
    ("endpoint in extra body", {"moot": {"model": "openai:fake", "base_url": "http://x"}}, 400, "cannot choose"),
    ("scripted model in extra body", {"moot": {"model": "scripted:/etc/passwd"}}, 400, "cannot name scripted"),
    ("budget in extra body", {"moot": {"budget": {"max_calls": 10_000}}}, 400, "limit of 100"),
    ("no user message", {"messages": [{"role": "system", "content": "x"}]}, 400, "user message"),
    ("unknown field", {"frobnicate": True}, 400, "unknown field"),
    ("functions", {"functions": [{"name": "f", "parameters": {}}]}, 400, 'tools=[{"type": "function"'),
    (
        "call budget below one round",
        {"model": "moot/affirmative-critical", "moot": {"budget": {"max_calls": 2}}},
        400,
        "moot.budget.max_calls: the call budget of 2 calls cannot fit one round (2 calls) plus the decision (1)",
    ),
    ("question over limit", {"messages": [{"role": "user", "content": "q" * 20_001}]}, 400, "messages: 20001"),
    ("temperature out of range", {"temperature": 5}, 400, "temperature: Input should be less than or equal to 2"),
]


@pytest.mark.parametrize(
    ("body", "status", "needle"), [r[1:] for r in CHAT_REFUSALS], ids=[r[0] for r in CHAT_REFUSALS]
)
def test_bad_chat_requests_are_refused_through_the_sdk(
    served: tuple[ServerThread, FakeOpenAIServer], body: dict[str, Any], status: int, needle: str
) -> None:
    server, fake = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    args: dict[str, Any] = {"model": "moot/single", "messages": [{"role": "user", "content": "Q?"}]}
    extra = {k: v for k, v in body.items() if k in ("moot", "frobnicate")}
    args.update({k: v for k, v in body.items() if k not in extra})
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**args, extra_body=extra or None)
    assert err.value.status_code == status and needle in err.value.message
    assert fake.requests == []


def test_a_request_may_pick_another_offered_model(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, fake = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    client.chat.completions.create(
        model="moot/affirmative-critical",
        messages=[{"role": "user", "content": "Q?"}],
        extra_body={"moot": {"model": "openai:fake-2", "models": {"critical": "openai:fake"}, "rounds": 1}},
    )
    assert sorted(r["model"] for r in fake.requests) == ["fake", "fake-2", "fake-2"]


# -------------------------------------------------------------------------------------- quality


def test_a_debate_carries_seed_004s_quality_when_asked(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    server, fake = served
    plain = finished(server.url, start(server.url, protocol="society-of-minds"))
    assert plain["result"]["quality"] is None
    # Without a judge: the model-free dimensions, and the judged ones absent with their reason.
    info = finished(server.url, start(server.url, protocol="society-of-minds", quality=True))
    quality = info["result"]["quality"]
    assert {"consensus_quality", "decision_confidence"} <= set(quality["scores"])
    assert "logical_consistency" in quality["unmeasured"] and quality["judge"] is None
    # With a judge (one of the server's models): one more call on it, named in the result, and the
    # quality is in the debate_done event, which comes only once it is there.
    calls = len(fake.requests)
    debate_id = start(server.url, protocol="society-of-minds", quality={"judge_model": "openai:fake-2"})
    info = finished(server.url, debate_id)
    quality = info["result"]["quality"]
    assert quality["judge"] == "openai:fake-2" and quality["judge_calls"] >= 1
    assert [r["model"] for r in fake.requests[calls:]].count("fake-2") == quality["judge_calls"]
    assert "logical_consistency" in quality["scores"] or "logical_consistency" in quality["unmeasured"]
    done = [e for e in read_events(f"{server.url}/v1/debates/{debate_id}/events") if e["event"] == "debate_done"]
    assert len(done) == 1 and done[0]["data"]["quality"] == quality
    # A judge the server does not offer is refused before anything runs.
    response = httpx.post(
        server.url + "/v1/debates", json={"question": "Q?", "quality": {"judge_model": "openai:gpt-5"}}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "quality.judge_model"


def test_every_debate_carries_its_cost_at_the_servers_prices(make_server: MakeServer) -> None:
    from moot.models.pricing import Price, PriceTable

    server, _ = make_server(prices=PriceTable(prices={"openai:fake": Price(input=1.0, output=2.0)}))
    info = finished(server.url, start(server.url))
    cost = info["result"]["cost"]
    usage = info["result"]["usage"]
    assert cost["usd"] == pytest.approx((usage["prompt_tokens"] + 2 * usage["completion_tokens"]) / 1e6)
    assert cost["unpriced"] == [] and cost["ratio_to_single_usd"] > 1
    # the OpenAI endpoint says what the debate cost beside the usage; a model without a price: tokens only
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    done = client.chat.completions.create(
        model="moot/affirmative-critical", messages=[{"role": "user", "content": "Q?"}]
    )
    assert done.model_extra is not None and done.model_extra["moot"]["cost_usd"] > 0
    other = finished(server.url, start(server.url, model="openai:fake-2"))
    assert other["result"]["cost"]["usd"] is None and other["result"]["cost"]["unpriced"] == ["openai:fake-2"]


def test_prompt_tokens_from_the_models_cache_are_reported_and_priced(make_server: MakeServer) -> None:
    """The upstream server's ``prompt_tokens_details.cached_tokens``, summed over the debate's calls,
    reaches the chat completion's usage (plain and streamed), the event totals and the cost."""
    from moot.models.pricing import Price, PriceTable

    price = Price(input=1.0, output=2.0, cached_input=0.25)
    server, _ = make_server(cached_tokens=8, prices=PriceTable(prices={"openai:fake": price}))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model="moot/affirmative-critical", messages=[{"role": "user", "content": "Q?"}]
    )
    debate_id = (reply.model_extra or {})["moot"]["debate_id"]
    info = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()
    result = DebateResult.model_validate(info["result"])
    turns = [t for r in result.rounds for t in r.turns] + result.decision_turns
    assert [t.usage.cached_prompt_tokens for t in turns] == [8] * 5
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 40 == result.usage.cached_prompt_tokens
    u = result.usage
    assert result.cost is not None and result.cost.cached_prompt_tokens == 40
    assert result.cost.usd == pytest.approx(
        ((u.prompt_tokens - 40) * 1.0 + 40 * 0.25 + u.completion_tokens * 2.0) / 1e6
    )
    done = [e for e in read_events(f"{server.url}/v1/debates/{debate_id}/events") if e["event"] == "debate_done"]
    assert done[0]["data"]["totals"]["cached_prompt_tokens"] == 40
    chunks = list(
        client.chat.completions.create(
            model="moot/affirmative-critical",
            messages=[{"role": "user", "content": "Q?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1].usage
    assert last is not None and last.prompt_tokens_details is not None
    assert last.prompt_tokens_details.cached_tokens == 40


def test_a_traceback_in_the_log_is_redacted_too() -> None:
    import logging

    from moot.server.http.redaction import RedactingFilter

    key = "sk-server-key-0123456789abcdef"
    try:
        raise RuntimeError(f"the upstream said: bad key {key}")
    except RuntimeError:
        record = logging.LogRecord("moot.server", logging.ERROR, __file__, 1, "crash in %s", ("handler",), None)
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter([key]).filter(record)
    text = logging.Formatter().format(record)
    assert "RuntimeError" in text and "crash in handler" in text and key not in text


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/v1/debates?cursor=%73k-proj-PCTQLEAKaaaaaaaaaaaaaa", "/v1/debates?cursor=***"),
        ("/v1/debates/redis%3A%2F%2F%3APATH2pw9%40h", "/v1/debates/redis://:***@h"),
        ("/v1/debates/Bearer%20PATH3aaaaaaaaaaaaa1", "/v1/debates/***"),
        ("/v1/debates?status=running&cursor=a%20b", "/v1/debates?status=running&cursor=a%20b"),  # as written
    ],
)
def test_the_access_log_redacts_a_secret_written_with_percent_escapes(path: str, logged: str) -> None:
    """uvicorn's access log writes a request's path and query as sent: a key in a query value (which
    clients percent-encode) or a path passed redaction (a re-attack, session 38). It is also read
    decoded, and written so where that redacted more."""
    import logging

    from moot.server.http.redaction import RedactingFilter

    fmt = '%s - "%s %s HTTP/%s" %d'
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, fmt, ("127.0.0.1:1", "GET", path, "1.1", 200), None
    )
    assert RedactingFilter([]).filter(record)
    assert record.getMessage() == f'127.0.0.1:1 - "GET {logged} HTTP/1.1" 200'


def test_the_websocket_librarys_frame_lines_are_not_logged_even_at_debug() -> None:
    """At --log-level debug the WebSocket library logged each frame (on uvicorn.error, the logger uvicorn
    hands it) with its text cut in its middle: a key at the start of a message showed 30 characters,
    past the redaction of whole values. Such a line is not written; others are, redacted."""
    import logging

    from websockets.frames import Frame, Opcode

    from moot.server.http.redaction import RedactingFilter

    key = "sk-proj-" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 2
    frame = Frame(Opcode.TEXT, ('{"input": "' + key + '"}').encode())
    record = logging.LogRecord("uvicorn.error", logging.DEBUG, __file__, 1, "< %s", (frame,), None)
    assert key[:30] in record.getMessage()  # (what it wrote)
    assert not RedactingFilter([key]).filter(record)
    other = logging.LogRecord("uvicorn.error", logging.DEBUG, __file__, 1, "got %s", (key,), None)
    assert RedactingFilter([key]).filter(other) and key not in other.getMessage()


def test_langchains_chat_openai_uses_a_debate_as_one_model(served: tuple[ServerThread, FakeOpenAIServer]) -> None:
    """LangChain's ChatOpenAI, pointed at moot serve, sends chat completions and reads the decision,
    whole and streamed, with the usage."""
    langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is a dev dependency")
    from langchain_core.messages import HumanMessage, SystemMessage

    server, _ = served
    chat = langchain_openai.ChatOpenAI(
        model="moot/affirmative-critical", base_url=server.url + "/v1", api_key="unused", max_retries=0
    )
    messages = [SystemMessage("Answer briefly."), HumanMessage("Is 7 prime?")]
    reply = chat.invoke(messages)
    debate_id = str(reply.response_metadata["id"]).removeprefix("moot-")
    result = DebateResult.model_validate(httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"])
    assert reply.content == result.final_answer and result.task.question == "Is 7 prime?"
    assert reply.usage_metadata is not None and reply.usage_metadata["total_tokens"] == result.usage.total_tokens
    streamed = "".join(str(chunk.content) for chunk in chat.stream(messages))
    assert streamed and streamed == result.final_answer  # the fake model answers the same question the same way


def test_every_paths_allow_header_names_every_method_its_routes_serve(tmp_path: Path) -> None:
    """Schemathesis' ST205: OPTIONS /v1/debates said `Allow: POST` while GET is served there too
    (Starlette names the first route whose path matched). Every route of the app is walked, and the
    405 to OPTIONS at its path names exactly the methods the routes matching that path serve."""
    import re

    from fastapi.testclient import TestClient

    from moot.server.http.app import create_app

    script = tmp_path / "replies.json"
    script.write_text('["unused"]', encoding="utf-8")
    app = create_app(ServerSettings(db=tmp_path / "moot.sqlite", models=[f"scripted:{script}"]))
    try:  # FastAPI 0.12x+ keeps included routers as one route each: their routes are walked too
        from fastapi.routing import iter_route_contexts

        routes: list[Any] = list(iter_route_contexts(app.routes))
    except ImportError:
        routes = list(app.routes)
    served = [(r.path_format, set(r.methods)) for r in routes if getattr(r, "methods", None)]
    assert len(served) > 15 and {"/v1/debates", "/v1/chat/completions", "/v1/responses"} <= {p for p, _ in served}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for path_format, _ in served:
            path = re.sub(r"\{[^}]+\}", "x" * 32, path_format)
            expected = {m for p, methods in served if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path)
                        for m in methods}  # fmt: skip
            answer = client.options(path)
            assert answer.status_code == 405, path
            assert set(answer.headers["allow"].split(", ")) == expected, path
        assert client.options("/static/moot.js").headers["allow"] == "GET, HEAD"  # the mount's own
        debates = client.options("/v1/debates")
        assert set(debates.headers["allow"].split(", ")) == {"GET", "POST"}
        assert "see /docs" in debates.json()["error"]["message"]
        # The viewer's pages answer HEAD (a health check's), headers alone, as the static files do.
        for page in ("/", "/debates/" + "x" * 32, "/docs", "/redoc"):  # (the OpenAPI pages said 405 to HEAD)
            head = client.head(page)
            assert (
                head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("text/html")
            )
            assert set(client.options(page).headers["allow"].split(", ")) == {"GET", "HEAD"}


# ------------------------------------------------- issue 39, S3: one debate's failed write is its own


def test_a_write_that_fails_rolls_back_that_debate_alone(tmp_path: Path) -> None:
    """The writes of one moment share a transaction; a write the store cannot take (here a model's
    reply holding half a surrogate pair, which no UTF-8 text can encode) is rolled back alone: its
    debate is marked failed with the reason, and the other debates' transcripts and events are kept."""
    from moot.core.types import DebateTask
    from moot.server.state import StoredEvent, Write

    store = SqliteStore(tmp_path / "m.sqlite", secrets=["sk-secret-in-the-reason-0123456789"])
    for name in ("a", "b", "c"):
        store.create(name * 32, protocol="single", question=f"{name}?", model="openai:fake", request={})

    def write(name: str, answer: str) -> Write:
        result = DebateResult(protocol="single", task=DebateTask(question=f"{name}?"), final_answer=answer)
        events = [StoredEvent(id=n, name="turn_done", data=json.dumps({"n": n})) for n in (1, 2)]
        return Write(name * 32, result, events, started="2026-01-01T00:00:00")

    failed = store.write_all([write("a", "A"), write("b", "B\udfff"), write("c", "C")])
    assert [f.debate_id for f in failed] == ["b" * 32]
    assert failed[0].reason is not None and "could not store this debate" in failed[0].reason
    for name in ("a", "c"):
        kept = store.get(name * 32)
        assert kept is not None and kept.status == "running" and kept.result is not None
        assert kept.result.final_answer == name.upper() and [e.id for e in store.events(name * 32)] == [1, 2]
    broken = store.get("b" * 32)
    assert broken is not None and broken.status == "failed" and broken.result is None
    assert broken.error is not None and "could not store this debate" in broken.error
    assert [e.id for e in store.events("b" * 32)] == [1, 2]  # its events could be stored: they are
    store.close()


def test_a_debate_the_store_refuses_fails_alone_while_others_run(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, S3: a debate whose writes failed stayed ``queued`` for ever, and another client's
    finished debate was stored ``running`` without 8 of the events its client had received. Now the
    one debate ends ``failed`` with the reason, on its stream and in the store, and every other
    debate running beside it is stored whole: its status, transcript and each of its events."""
    original = DebateResult.to_json

    def to_json(self: DebateResult, *args: Any, **kwargs: Any) -> str:
        if self.task.question.startswith("poison"):
            raise UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DebateResult, "to_json", to_json)
    server, _ = make_server(latency=0.05, max_running=6)
    healthy = [start(server.url, question=f"Is {n} prime?") for n in (2, 3, 5, 7)]
    poisoned = start(server.url, question="poison: is 9 prime?")
    more = [start(server.url, question=f"Is {n} prime?") for n in (11,)]
    info = finished(server.url, poisoned)
    assert info["status"] == "failed" and "could not store this debate" in (info["error"] or "")
    assert "UnicodeEncodeError" in info["error"]
    events = read_events(f"{server.url}/v1/debates/{poisoned}/events")
    assert events[-1]["event"] == "debate_done" and events[-1]["data"]["status"] == "failed"
    assert "could not store this debate" in events[-1]["data"]["error"]
    for debate_id in [*healthy, *more]:
        assert finished(server.url, debate_id)["status"] == "complete"
        live = [(e["id"], e["event"]) for e in read_events(f"{server.url}/v1/debates/{debate_id}/events")]
        with sqlite3.connect(server.settings.db) as conn:
            stored = list(conn.execute("SELECT id, name FROM events WHERE debate_id = ? ORDER BY id", (debate_id,)))
            row = conn.execute("SELECT status, result FROM debates WHERE id = ?", (debate_id,)).fetchone()
        assert stored == [e for e in live if e[1] != "token"] and stored[-1][1] == "debate_done"
        assert row[0] == "complete" and DebateResult.model_validate_json(row[1]).status == "complete"
    with sqlite3.connect(server.settings.db) as conn:
        status, error = conn.execute("SELECT status, error FROM debates WHERE id = ?", (poisoned,)).fetchone()
    assert status == "failed" and "could not store this debate" in error


def test_a_models_reply_holding_half_a_surrogate_pair_is_written_with_a_replacement(make_server: MakeServer) -> None:
    """The other way one in: a backend's reply (or a typed reply's JSON) holding a ``"\\udfff"`` escape
    left its debate ``running`` for ever, its events and end never stored. A model's text becomes
    U+FFFD where it holds one, so its debate is stored like any other."""
    from pydantic import BaseModel

    from moot.structured import parse_reply
    from moot.testing.fake_openai import default_reply

    def reply(request: dict[str, Any]) -> str:
        return "Yes\udfff it is" if "poison" in json.dumps(request) else default_reply(request)

    server, _ = make_server(latency=0.02, reply=reply)
    poisoned = start(server.url, question="poison: is 9 prime?")
    healthy = start(server.url)
    info = finished(server.url, poisoned)
    assert info["status"] == "complete", info["error"]
    assert DebateResult.model_validate(info["result"]).final_answer == "Yes\ufffd it is"
    assert finished(server.url, healthy)["status"] == "complete"

    class Typed(BaseModel):
        answer: str
        reasoning: str

    typed = parse_reply('{"answer": "A\\udfff", "reasoning": "r\\ud800"}', Typed)
    assert typed == Typed(answer="A\ufffd", reasoning="r\ufffd")
    # a NUL, which no PostgreSQL text can hold, likewise (a typed reply's JSON escape, or the text itself)
    assert parse_reply('{"answer": "A\\u0000", "reasoning": "r"}', Typed) == Typed(answer="A\ufffd", reasoning="r")
    from moot.files import scrub_surrogates

    assert scrub_surrogates({"k\x00": ["a\x00b"]}) == {"k\ufffd": ["a\ufffdb"]}


# ------------------------------------------------------------------ Idempotency-Key on POST /v1/debates


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_post_debates_with_an_idempotency_key_gives_the_same_debate_on_any_replica(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A client retrying a POST whose answer was lost (its replica killed) sends the same key: it gets
    the same debate (its current status), on any replica, and no second one is started or paid for;
    the same key with another body is a 409, never a debate."""
    from pydantic import SecretStr

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with ExitStack() as stack:
        fake = stack.enter_context(FakeOpenAIServer(latency=0.05))
        where: dict[str, Any] = {"db": tmp_path / "moot.sqlite"}
        replicas = 1
        if backend == "postgres":
            cluster = request.getfixturevalue("pg_cluster")
            database = cluster.create_database()
            stack.callback(cluster.drop_database, database)
            where, replicas = {"db_url": SecretStr(cluster.url(database))}, 2
        settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2, **where)
        servers = [stack.enter_context(ServerThread(settings)) for _ in range(replicas)]
        a, b = servers[0], servers[-1]
        body = {"question": "Is 7 prime?", "rounds": 1}

        def send(server: ServerThread, sent: dict[str, Any], key: str | None = "key-1") -> httpx.Response:
            headers = {"Idempotency-Key": key} if key is not None else {}
            return httpx.post(server.url + "/v1/debates", json=sent, headers=headers, timeout=30)

        def count() -> int:
            return len(httpx.get(a.url + "/v1/debates", params={"limit": 200}).json()["debates"])

        first = send(a, body)
        assert first.status_code == 202, first.text
        debate_id = first.json()["id"]
        again = send(b, body)  # the retry, through the balancer to the other replica
        assert again.status_code == 202 and again.json()["id"] == debate_id, again.text
        assert finished(a.url, debate_id)["status"] == "complete"
        calls = len(fake.requests)
        late = send(b, body)
        assert late.status_code == 202 and late.json() == {**first.json(), "status": "complete"}
        assert len(fake.requests) == calls and count() == 1
        refused = send(a, {**body, "question": "Is 9 prime?"})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
        assert count() == 1
        assert send(a, body, "two words").status_code == 400
        assert send(a, body, key=None).json()["id"] != debate_id and count() == 2


def test_a_debate_posted_with_an_idempotency_key_is_built_again_from_its_stored_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's record is stored beside the body: the replica that takes the debate over (or a
    restart that queues it again) builds it from that request as from any other."""
    from moot.server.state import open_store
    from moot.server.state.idempotency import Idempotency
    from moot.server.state.manager import DebateManager, LiveDebate

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    store = open_store(tmp_path / "moot.sqlite")
    try:
        settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url="http://127.0.0.1:9/v1")
        manager = DebateManager(settings, store)
        body = DebateRequest.model_validate({"question": "Is 7 prime?", "rounds": 1})
        request = body.model_dump(mode="json", by_alias=True) | Idempotency("key-1", "d" * 32, "h").recorded()
        built = manager.recovery.rebuild("d" * 32, request)
        assert isinstance(built, LiveDebate), built
        assert built.task.question == "Is 7 prime?"
    finally:
        store.close()


def test_a_presets_spec_is_made_once_per_parameters_and_each_request_gets_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server builds a preset's spec once per preset and parameters (its factory, validated,
    was about 1% of a served debate's CPU), and hands each request a copy; a parameter the preset
    does not have is refused by name as before."""
    import moot.protocols as protocols
    from moot.server import policy
    from moot.server.policy import RequestError, build_spec
    from moot.server.schemas import DebateOptions
    from moot.server.settings import ServerSettings

    policy._made_preset.cache_clear()
    calls = 0
    factory = protocols.get_preset_factory("society-of-minds")

    @functools.wraps(factory)  # its signature: its parameters are checked by name
    def counted(**params: Any) -> Any:
        nonlocal calls
        calls += 1
        return factory(**params)

    monkeypatch.setitem(protocols._PRESETS, "society-of-minds", counted)
    settings = ServerSettings(models=["openai:fake"])
    three = DebateOptions.model_validate({"with": {"agents": 3}})
    first, second = build_spec("society-of-minds", three, settings), build_spec("society-of-minds", three, settings)
    assert calls == 1 and first == second and first is not second
    four = DebateOptions.model_validate({"with": {"agents": 4}})
    assert len(build_spec("society-of-minds", four, settings).participants) == 4
    assert calls == 2
    with pytest.raises(RequestError, match="has no parameter colour"):
        build_spec("society-of-minds", DebateOptions.model_validate({"with": {"colour": 1}}), settings)
    # Thousands of unknown names: ten are named, the rest counted (the whole list was a 469 KB error body).
    many = DebateOptions.model_validate({"with": {f"k{i:05d}": 0 for i in range(60_000)}})
    with pytest.raises(RequestError) as caught:
        build_spec("society-of-minds", many, settings)
    assert "has no parameter k00000, k00001," in str(caught.value) and "k00009 and 59990 more;" in str(caught.value)
    assert len(str(caught.value)) < 400


def test_a_store_out_of_reach_is_a_503_with_retry_after_not_a_bug(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL out of reach for a moment: each request that needs it was a 500 with a traceback
    in the log (65 in 16 s); it is a 503 with Retry-After, and a line in the log now and then."""
    from moot.server.state import StoreUnavailable
    from moot.server.state.sql import SqlStore

    server, _ = make_server()

    def unreachable(self: SqlStore, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("moot store: PostgreSQL cannot be reached (connection refused)")

    monkeypatch.setattr(SqlStore, "page", unreachable)
    answers = [httpx.get(server.url + "/v1/debates") for _ in range(3)]
    for answer in answers:
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5", answer.text
        assert answer.json()["error"]["code"] == "store_unavailable"
    assert "Traceback" not in caplog.text
    assert caplog.text.count("requests answered 503") == 1
    # The API keys cannot be checked either: the same code (it was null: an outside trial's, session 37).
    from moot.server.state.keyring import KeyRing

    def no_keys(self: KeyRing, given: str) -> Any:
        raise StoreUnavailable("moot store: PostgreSQL cannot be reached (connection refused)")

    monkeypatch.setattr(KeyRing, "lookup", no_keys)
    answer = httpx.get(server.url + "/v1/debates", headers={"Authorization": "Bearer moot_sk_not_the_server_key"})
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "store_unavailable", answer.text


def test_a_request_body_is_decoded_once(make_server: MakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request guard decodes and checks a body's JSON; the route validates its model from that
    value (moot.server.asgi.DecodedRoute), so FastAPI's own decode (Starlette's ``Request.json``)
    never runs on the debate routes nor the OpenAI door's."""
    import json as json_module

    import starlette.requests

    from moot.server import bodies

    decoded: dict[str, int] = {"guard": 0, "starlette": 0}

    class Counting:
        def __init__(self, who: str) -> None:
            self.who = who

        def loads(self, *args: Any, **kwargs: Any) -> Any:
            decoded[self.who] += 1
            return json_module.loads(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(json_module, name)

    monkeypatch.setattr(bodies, "json", Counting("guard"))
    monkeypatch.setattr(starlette.requests, "json", Counting("starlette"))
    server, _ = make_server()
    posts = [
        ("/v1/debates", {"question": "Is 7 prime?", "protocol": "single"}),
        ("/v1/chat/completions", {"model": "moot/single", "messages": [{"role": "user", "content": "Is 7 prime?"}]}),
        ("/v1/responses", {"model": "moot/single", "input": "Is 7 prime?", "store": False}),
    ]
    for path, body in posts:
        response = httpx.post(server.url + path, json=body, timeout=60)
        assert response.status_code in (200, 202), response.text
    assert decoded == {"guard": len(posts), "starlette": 0}
    # A body the guard refuses never reaches a route.
    refused = httpx.post(
        server.url + "/v1/debates", content=b'{"question": NaN}', headers={"content-type": "application/json"}
    )
    assert refused.status_code == 400 and "NaN is not a JSON number" in refused.json()["error"]["message"]


def test_an_outage_is_said_when_it_starts_then_now_and_then_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    """A replica logged 190 lines over a 100 s PostgreSQL outage, a retry every half second (an
    outside trial's, session 37)."""
    import logging
    import time

    from moot.server.state.base import Outage

    outage = Outage(logging.getLogger("moot.server"), every_s=3600)
    with caplog.at_level(logging.WARNING, logger="moot.server"):
        for _ in range(200):
            outage.warn("the store cannot be reached (%s)", "refused")
    assert caplog.text.count("the store cannot be reached") == 1
    outage.every_s = 0
    with caplog.at_level(logging.WARNING, logger="moot.server"):
        outage.warn("the store cannot be reached (%s)", "refused")
    assert "again 199 times since the last such line" in caplog.text
    # A store failing every other moment is one outage, not a line a moment (a review's)...
    outage = Outage(logging.getLogger("moot.server"), every_s=3600)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="moot.server"):
        for _ in range(50):
            outage.warn("the store cannot be reached (%s)", "refused")
            outage.over()
    assert caplog.text.count("the store cannot be reached") == 1
    # ... and one reached for every_s on end is over: the next failure is said at once, the count told.
    outage = Outage(logging.getLogger("moot.server"), every_s=0.05)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="moot.server"):
        outage.warn("the store cannot be reached (%s)", "refused")
        outage.warn("the store cannot be reached (%s)", "refused")
        outage.over()
        time.sleep(0.06)
        outage.over()
        outage.warn("the store cannot be reached (%s)", "refused again")
    assert caplog.text.count("the store cannot be reached") == 2 and "1 times more before it was reached" in caplog.text


def test_a_debate_costs_its_store_a_transaction_a_moment_and_each_turn_is_written_once(
    served: tuple[ServerThread, FakeOpenAIServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A debate run alone (nothing to share its transactions with) is added claimed, in one
    transaction (no claim of its own after), then written once a moment: its start, each moment a
    turn or a round ended, its end. Each of its five turns is written once: its transcript is
    stored turn by turn, never whole again (docs/benchmarks.md, "Session 41")."""
    from moot.server.state.result_json import ResultJson, Split
    from moot.server.state.sqlite import SqliteStore

    server, _ = served
    transactions, claims, rows = [0], [0], list[int]()
    tx, claim, stored = SqliteStore._tx, SqliteStore.claim, ResultJson.stored

    def counted_tx(self: SqliteStore) -> Any:
        transactions[0] += 1
        return tx(self)

    def counted_claim(self: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        claims[0] += 1
        return claim(self, *args, **kwargs)

    def counted_rows(self: ResultJson, split: Split) -> None:
        rows.extend(n for n, _, _ in split.rows)
        stored(self, split)

    monkeypatch.setattr(SqliteStore, "_tx", counted_tx)
    monkeypatch.setattr(SqliteStore, "claim", counted_claim)
    monkeypatch.setattr(ResultJson, "stored", counted_rows)
    debate_id = start(server.url)
    assert finished(server.url, debate_id)["status"] == "complete"
    assert claims[0] == 0 and sorted(rows) == [0, 1, 2, 3, 4]
    # At most one a moment: added, started, its five turns, its two rounds (each usually with its last
    # turn's), its end (7 on an idle machine; a loaded one parts more of them).
    assert transactions[0] <= 10
