"""Three ``moot serve`` replicas on one PostgreSQL (issue 40): the shared queue, and the take-over of
a debate whose replica dies (kill -9), stops (SIGSTOP) or stops gracefully (SIGTERM), from its last
finished turn, with no turn recorded twice; and a PostgreSQL restart that the replicas outlive.

Each test starts its replicas as processes on loopback ports (tests/replicas.py), on a database of a
throwaway cluster of this module's own (it is restarted by one test); the model is the fake OpenAI
server, answering each call after 0.6 s, so a debate spans several seconds. Bounds are generous:
only a hang trips them."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.server import ServerSettings
from moot.server.schemas import DebateRequest
from moot.server.state import StoredEvent, Write
from moot.server.state.manager import TAKEOVER_ID_GAP
from moot.server.state.postgres import PostgresStore
from moot.testing.fake_openai import FakeOpenAIServer
from pg_cluster import PgCluster
from replicas import Deployment, deployment, restart_postgres, wait_running_on
from serving import FAKE_KEY, ServerThread, wait_for

pytestmark = [pytest.mark.xdist_group("replicas")]

#: affirmative-critical: two speakers a round, then one synthesis call.
ROUNDS = 4
CALLS = 2 * ROUNDS + 1


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    pg = PgCluster().start()
    try:
        yield pg
    finally:
        pg.stop()


def result_of(dep: Deployment, debate_id: str) -> DebateResult:
    row = dep.store.get(debate_id)
    assert row is not None and row.result is not None
    return row.result


def events_of(dep: Deployment, debate_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.id, e.name, json.loads(e.data)) for e in dep.store.events(debate_id)]


def assert_whole(dep: Deployment, debate_id: str) -> DebateResult:
    """Complete, every turn once, the events in order with one start and one end."""
    assert dep.status(debate_id) == "complete", (dep.status(debate_id), dep.store.get(debate_id, with_result=False))
    result = result_of(dep, debate_id)
    assert [(t.speaker, t.round) for t in result.turns()] == [
        (s, r) for r in range(1, ROUNDS + 1) for s in ("affirmative", "critical")
    ]
    assert all(t.ok for t in result.turns()) and len(result.decision_turns) == 1
    assert result.llm_calls == CALLS and result.final_answer
    events = events_of(dep, debate_id)
    ids = [i for i, _, _ in events]
    assert ids == sorted(set(ids))  # no id twice, in order
    names = [n for _, n, _ in events]
    assert names.count("debate_started") == 1 and names.count("debate_done") == 1 and names[-1] == "debate_done"
    assert names.count("turn_done") == CALLS  # no turn announced twice
    return result


def prompts(requests: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r["messages"], sort_keys=True) for r in requests]


def turn_prompt(turn: Any) -> str:
    return json.dumps([{"role": m.role, "content": m.content} for m in turn.messages], sort_keys=True)


def test_submissions_spread_over_the_replicas_all_finish(cluster: PgCluster, tmp_path: Path) -> None:
    with deployment(cluster, tmp_path) as dep:
        # Round-robin, as a balancer sends them; and eight at once to one replica, which runs four at
        # a time: the others' pollers take what waits in its queue.
        spread = [dep.submit(f"Spread question {i}?", rounds=2) for i in range(3)]
        with ThreadPoolExecutor(8) as pool:
            crowded = list(
                pool.map(lambda i: dep.submit(f"Crowded question {i}?", rounds=2, to=dep.replicas[0]), range(8))
            )
        runners: set[int] = set()

        def all_done() -> bool:
            for debate_id in crowded:
                runner = dep.runner(debate_id)
                if runner is not None and dep.status(debate_id) == "running":
                    runners.add(runner.index)
            return all(dep.status(i) not in ("queued", "running") for i in spread + crowded)

        wait_for(all_done, "every debate to end", timeout=240)
        for debate_id in spread + crowded:
            assert dep.status(debate_id) == "complete"
            assert result_of(dep, debate_id).llm_calls == 2 * 2 + 1
        assert len(runners) >= 2, f"the crowded replica's queue ran on replicas {runners} only"


def test_kill_9_of_the_runner_mid_debate_another_replica_finishes_it_with_the_turns_kept(
    cluster: PgCluster, tmp_path: Path
) -> None:
    with deployment(cluster, tmp_path) as dep:
        question = "Is the kill -9 debate's answer kept?"
        debate_id = dep.submit(question, rounds=ROUNDS)
        victim = wait_running_on(dep, debate_id, turns=3)  # in round 2
        victim.signal(signal.SIGKILL)
        victim.proc.wait(30)  # type: ignore[union-attr]
        time.sleep(0.5)  # a request the victim sent has reached the fake model
        kept = [t for t in result_of(dep, debate_id).turns() if t.ok]
        sent_before = dep.requests_of(question)
        in_flight = len(sent_before) - len(kept)
        assert len(kept) >= 3 and in_flight >= 0

        dep.wait_done(debate_id)
        result = assert_whole(dep, debate_id)
        # The recorded turns are kept as they were, none run again: each one's prompt reached the
        # model once; the only calls made again are those the kill cut.
        final = {(t.speaker, t.round): t for t in result.turns()}
        for t in kept:
            assert final[(t.speaker, t.round)].text == t.text
        sent = prompts(dep.requests_of(question))
        for t in kept:
            assert sent.count(turn_prompt(t)) == 1, f"{t.speaker}'s turn of round {t.round} was run again"
        assert len(sent) == CALLS + in_flight
        # The stream goes on with a resumed event, naming both replicas, after the stored events.
        events = events_of(dep, debate_id)
        at = [k for k, (_, n, _) in enumerate(events) if n == "resumed"]
        assert len(at) == 1
        rid, _, data = events[at[0]]
        # Its id goes on above the last event the victim stored, past any id the victim may have given
        # its own clients without storing it (its token deltas): TAKEOVER_ID_GAP.
        assert rid == events[at[0] - 1][0] + TAKEOVER_ID_GAP + 1
        assert data["kept_turns"] == len(kept) and data["round"] == kept[-1].round + (len(kept) % 2 == 0)
        assert data["previous_replica"].split(":")[-2] == str(victim.pid)
        assert data["replica"] != data["previous_replica"]
        assert any(w.startswith("resumed after an interruption") for w in result.warnings)


def test_sigstop_past_the_lease_another_takes_over_and_the_old_replica_writes_nothing(
    cluster: PgCluster, tmp_path: Path
) -> None:
    with deployment(cluster, tmp_path) as dep:
        for _ in range(3):
            debate_id = dep.submit("Does a stopped replica write after SIGCONT?", rounds=ROUNDS)
            stopped = wait_running_on(dep, debate_id, turns=2)
            stopped.signal(signal.SIGSTOP)
            owner, epoch_stopped = dep.store.lease(debate_id)
            if owner is not None and stopped.proc is not None and int(owner.split(":")[-2]) == stopped.proc.pid:
                break  # stopped holding the lease
            # On a loaded machine the debate ended (or moved) before the stop reached it: again.
            stopped.signal(signal.SIGCONT)
        else:
            raise AssertionError("three debates ended before their replica could be stopped")
        try:
            # The take-over, seen in the lease's epoch: the taker may finish the debate (and give its
            # lease up) before a look at the owner would find it there.
            try:
                epoch_taken = wait_for(
                    lambda: (epoch := dep.store.lease(debate_id)[1]) > epoch_stopped and epoch,
                    "another replica to take the debate over",
                    timeout=120,
                )
            except AssertionError as exc:  # (seen once in a full run under load: say what each replica did)
                logs = "\n".join(f"--- replica {r.index}: {r.text()[-1500:]}" for r in dep.replicas)
                raise AssertionError(f"{exc}; lease {dep.store.lease(debate_id)}\n{logs}") from None
            turns_taken = dep.turns_stored(debate_id)
        finally:
            stopped.signal(signal.SIGCONT)
        # Back, the old replica finds its lease gone: it stops the debate without writing.
        wait_for(lambda: "stops on this replica without writing" in stopped.text(), "the old replica to be fenced")
        dep.wait_done(debate_id)
        result = assert_whole(dep, debate_id)
        assert turns_taken >= 2 and len(result.turns()) == 2 * ROUNDS
        # No claim since the take-over (the old replica's epoch stayed stale), and its events are not there.
        assert dep.store.lease(debate_id) == (None, epoch_taken)
        events = events_of(dep, debate_id)
        resumed = [data for _, name, data in events if name == "resumed"]
        assert len(resumed) == 1
        taker = next(
            r for r in dep.replicas if r.proc is not None and str(r.proc.pid) == resumed[0]["replica"].split(":")[-2]
        )
        assert taker is not stopped and taker.alive() and stopped.alive()


def test_sigterm_hands_the_debates_back_at_once(cluster: PgCluster, tmp_path: Path) -> None:
    # A lease of a minute: only the hand-back explains a take-over within seconds.
    with deployment(cluster, tmp_path, lease_s=60) as dep:
        first = dep.replicas[0]
        ids = [dep.submit(f"Handed back question {i}?", rounds=ROUNDS, to=first) for i in range(2)]
        for debate_id in ids:
            # The replica it was sent to, with a free slot, runs it: no other's poller takes it first.
            assert wait_running_on(dep, debate_id, turns=2) is first
        epochs = {debate_id: dep.store.lease(debate_id)[1] for debate_id in ids}
        t0 = time.monotonic()
        first.signal(signal.SIGTERM)
        for debate_id in ids:
            # Seen in the lease's epoch: the taker may finish the debate before a look at the owner.
            wait_for(
                lambda d=debate_id: dep.store.lease(d)[1] > epochs[d],
                "another replica to take a handed-back debate",
                timeout=40,
            )
        took = time.monotonic() - t0
        assert took < 40, took
        first.proc.wait(30)  # type: ignore[union-attr]
        dep.wait_done(*ids)
        for debate_id in ids:
            assert_whole(dep, debate_id)
            resumed = [d for _, n, d in events_of(dep, debate_id) if n == "resumed"]
            assert len(resumed) == 1 and resumed[0]["previous_replica"].split(":")[-2] == str(first.pid)


def test_a_postgres_restart_mid_run_is_outlived_and_the_debates_finish(cluster: PgCluster, tmp_path: Path) -> None:
    with deployment(cluster, tmp_path) as dep:
        ids = [dep.submit(f"Restarted database question {i}?", rounds=ROUNDS) for i in range(2)]
        for debate_id in ids:
            wait_running_on(dep, debate_id, turns=2)
        restart_postgres(cluster)
        dep.wait_done(*ids)
        for debate_id in ids:
            assert_whole(dep, debate_id)
        assert all(r.alive() for r in dep.replicas)
        # The replicas still serve (their connections made again).
        again = dep.submit("After the restart?", rounds=1)
        dep.wait_done(again)
        assert dep.status(again) == "complete"


def test_a_taken_over_debate_this_replica_cannot_build_ends_failed_with_its_turns_kept(
    cluster: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its model is not among this replica's: it is not left hanging, it ends failed, saying why."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    database = cluster.create_database()
    url = cluster.url(database)
    store = PostgresStore(url, application_name="moot tests")
    try:
        request = DebateRequest.model_validate({"question": "Is 7 prime?", "rounds": 2, "model": "openai:elsewhere"})
        debate_id = "c" * 32
        store.create(
            debate_id, protocol="affirmative-critical", question="Is 7 prime?", model="openai:elsewhere",
            request=request.model_dump(mode="json", by_alias=True),
        )  # fmt: skip
        dead = store.claim("dead-host:1:dead", 1)
        assert dead is not None
        turn = Turn(
            speaker="affirmative",
            name="Affirmative",
            round=1,
            model="openai:elsewhere",
            messages=[],
            text="Yes.",
            calls=1,
        )
        partial = DebateResult(protocol="affirmative-critical", task=DebateTask(question="Is 7 prime?"),
                               rounds=[Round(index=1, turns=[turn])], llm_calls=1)  # fmt: skip
        started = [StoredEvent(id=1, name="debate_started", data="{}")]
        store.write_one(Write(debate_id, partial, started, started="t0", epoch=dead.epoch))
        with FakeOpenAIServer() as fake:
            settings = ServerSettings(
                models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(url), lease_s=3, poll_s=0.2
            )
            with ServerThread(settings):
                wait_for(lambda: dep_status(store, debate_id) == "failed", "the debate to end failed", timeout=120)
            assert fake.requests == []
        row = store.get(debate_id)
        assert row is not None and row.error is not None and row.result is not None
        assert "cannot run this debate" in row.error and "openai:elsewhere" in row.error and "\n" not in row.error
        assert [t.text for t in row.result.turns()] == ["Yes."] and row.result.status == "failed"
        last = store.events(debate_id)[-1]
        assert (last.id, last.name, json.loads(last.data)["status"]) == (TAKEOVER_ID_GAP + 2, "debate_done", "failed")
    finally:
        store.close()
        cluster.drop_database(database)


def dep_status(store: PostgresStore, debate_id: str) -> str | None:
    row = store.get(debate_id, with_result=False)
    return None if row is None else row.status


def test_a_chat_completion_whose_replica_dies_is_finished_by_another(cluster: PgCluster, tmp_path: Path) -> None:
    """Its request is stored whole: another replica builds its debate again and goes on with it (the
    caller's connection died with its replica; following the debate elsewhere is the live bus's)."""
    with deployment(cluster, tmp_path) as dep:
        question = "Is a chat completion taken over?"
        body = {
            "model": "moot/affirmative-critical",
            "messages": [{"role": "user", "content": question}],
            "temperature": 0.2,
            "moot": {"rounds": ROUNDS},
        }
        caller = dep.replicas[1]

        def ask() -> None:
            with contextlib.suppress(httpx.HTTPError):  # its replica is killed under it
                httpx.post(caller.url + "/v1/chat/completions", json=body, timeout=300)

        with ThreadPoolExecutor(1) as pool:
            pool.submit(ask)
            debate_id = wait_for(
                lambda: next((d.id for d in dep.store.page(status=None, limit=5, before=None)), None),
                "the chat completion's debate",
            )
            runner = wait_running_on(dep, debate_id, turns=3)
            assert runner is caller
            runner.signal(signal.SIGKILL)
            dep.wait_done(debate_id)
        result = assert_whole(dep, debate_id)
        assert [n for _, n, _ in events_of(dep, debate_id)].count("resumed") == 1
        assert result.final_answer
        request = dep.store.request(debate_id)
        assert request is not None and request["request"]["temperature"] == 0.2
        # Built again as asked: every call, on either replica, at the request's temperature.
        assert {r.get("temperature") for r in dep.requests_of(question)} == {0.2}


def test_sigterm_answers_a_waiting_chat_completion_at_once_with_where_its_debate_went(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """A chat completion waiting for its debate (not streamed: no event stream is open) when its
    replica gets SIGTERM: the debate is handed back at once, and the caller told so in a 503 naming
    the replica's hand-back (it waited out the graceful timeout, then got a 500, the debate still
    running and making calls on the stopping replica, and a retry started a second debate)."""
    with deployment(cluster, tmp_path, lease_s=60) as dep:
        question = "Is a waiting chat completion told where its debate went?"
        body = {"model": "moot/affirmative-critical", "messages": [{"role": "user", "content": question}]}
        caller = dep.replicas[0]
        answers: list[httpx.Response] = []

        def ask() -> None:
            answers.append(
                httpx.post(caller.url + "/v1/chat/completions", json={**body, "moot": {"rounds": ROUNDS}}, timeout=300)
            )

        streamed: list[str] = []

        def follow(debate_id: str) -> None:
            with httpx.stream("GET", f"{caller.url}/v1/debates/{debate_id}/events", timeout=300) as events:
                streamed.extend(events.iter_lines())

        with ThreadPoolExecutor(2) as pool:
            asked = pool.submit(ask)
            debate_id = wait_for(
                lambda: next((d.id for d in dep.store.page(status=None, limit=5, before=None)), None),
                "the chat completion's debate",
            )
            assert wait_running_on(dep, debate_id, turns=2) is caller
            following = pool.submit(follow, debate_id)
            wait_for(lambda: len(streamed) > 3 or None, "the stream to begin")
            caller.signal(signal.SIGTERM)
            asked.result(timeout=120)
            following.result(timeout=120)
        # The stream on the stopping replica says where the debate went (it ended with no word).
        assert streamed[-3] == "event: error" and "goes on at another replica" in streamed[-2], streamed[-4:]
        answer = answers[0]
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "server_stopping" and "goes on at another replica" in error["message"], error
        dep.wait_done(debate_id)
        assert_whole(dep, debate_id)
        assert [n for _, n, _ in events_of(dep, debate_id)].count("resumed") == 1


# ------------------------------------------- a replica back from SIGSTOP, before it hears its lease is gone


async def _stale_lease_run(cluster: PgCluster, stale_at: str) -> tuple[int, list[str], list[str], Any]:
    """One debate run in-process by a manager on a PostgreSQL store, whose lease goes stale (its last
    renewal made older than the lease, as a replica stopped past it finds it when it runs again)
    at ``stale_at``: ``"waiting"`` while its first call waits for the model's concurrency slot
    (its turn_started delivered already), ``"in-call"`` while its first call is in flight. Returns
    the calls the model received, the events delivered to its streams here, those stored, and the
    debate as it ended here."""
    import asyncio

    from moot.core.engine import Engine
    from moot.models.base import ChatRequest
    from moot.models.scripted import ScriptedModel
    from moot.protocols.affirmative_critical import affirmative_critical
    from moot.server.state.manager import DebateManager

    lease = 60.0  # no renewal comes during the test: the stale time is the test's
    database = cluster.create_database()
    store = PostgresStore(cluster.url(database), application_name="moot tests")
    manager = DebateManager(ServerSettings(db_url=SecretStr(cluster.url(database)), lease_s=lease), store)
    in_call, go_on = asyncio.Event(), asyncio.Event()

    async def answer(request: ChatRequest) -> str:
        in_call.set()
        await go_on.wait()
        return "An answer."

    model = ScriptedModel(fn=answer, name="scripted", max_concurrency=1)
    spec = affirmative_critical(rounds=2)
    try:
        slot = model.limiter._semaphore()
        assert slot is not None
        await slot.acquire()  # the first call waits for its slot
        request = {"question": "Is 7 prime?", "protocol": spec.name}
        live = manager.submit(spec, DebateTask(question="Is 7 prime?"), Engine(spec, model), "scripted", request)
        assert live.epoch is not None  # claimed at once: a free slot
        for _ in range(200):
            if any(e.name == "turn_started" for e in live.log.events):
                break
            await asyncio.sleep(0.02)
        assert [e.name for e in live.log.events][-1] == "turn_started"  # the speakers start together
        if stale_at == "waiting":
            live.renewed = time.monotonic() - lease - 1
            slot.release()
        else:
            slot.release()
            await asyncio.wait_for(in_call.wait(), 10)
            live.renewed = time.monotonic() - lease - 1
        go_on.set()
        await asyncio.wait_for(live.done.wait(), 10)
        delivered = [e.name for e in live.log.events]
        stored = [e.name for e in store.events(live.id)]
        return len(model.requests), delivered, stored, live
    finally:
        await manager.shutdown()
        store.close()
        cluster.drop_database(database)


async def test_a_stale_lease_sends_no_model_call_even_one_waiting_for_its_slot(cluster: PgCluster) -> None:
    """Its lease last renewed longer ago than it lasts (the process was stopped, SIGSTOP): the call
    that was waiting for the model's slot is not sent, no event follows, nothing is written."""
    calls, delivered, stored, live = await _stale_lease_run(cluster, "waiting")
    assert calls == 0
    assert set(delivered) == {"debate_started", "turn_started"}  # both speakers' (no phantom debate_done)
    assert "debate_done" not in stored and "turn_done" not in stored
    assert live.fenced and live.status == "interrupted"


async def test_a_stale_lease_delivers_no_event_after_the_call_in_flight_and_no_next_call(
    cluster: PgCluster,
) -> None:
    """The lease goes stale while a call is in flight: its answer is neither delivered to the
    streams here nor written, and the next turn's call is never sent."""
    calls, delivered, stored, live = await _stale_lease_run(cluster, "in-call")
    assert calls == 1
    assert delivered[-1] == "turn_started" and "turn_done" not in delivered and "debate_done" not in delivered
    assert "turn_done" not in stored and "debate_done" not in stored
    assert live.fenced
