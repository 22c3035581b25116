"""A running debate's stored transcript (ResultJson): its frame, and each finished turn encoded and
written once, read back (assemble) as ``DebateResult.to_json(indent=None)`` has it, at every write of
a debate as it grows, and through a real store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.models.base import Message, Usage
from moot.server.state.result_json import DECISION, ResultJson, Split, assemble, assembled


def turn(speaker: str, rnd: int, text: str) -> Turn:
    return Turn(
        speaker=speaker,
        name=speaker.title(),
        round=rnd,
        model="scripted",
        messages=[Message(role="user", content=f'question, then {text[:10]} \u00e9 "quoted"')],
        raw=text,
        text=text,
        parsed={"answer": text[:3], "n": 1.5e-05},
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        calls=1,
        latency_s=0.123456789,
    )


def growing() -> Iterator[DebateResult]:
    """One debate as it is at each of its writes, as a server's grows (one result, its turns
    appended): started, each turn, decided, done. Each is the same object: check it before the next."""
    result = DebateResult(protocol="p", task=DebateTask(question="Is 7 prime? \u2603"), participants=[{"id": "a"}])
    yield result
    for r in (1, 2):
        rnd = Round(index=r)
        result.rounds.append(rnd)
        for speaker in ("a", "b"):
            rnd.turns.append(turn(speaker, r, f"{speaker} says {r} " * 20))
            yield result
    result.decision_turns.append(turn("decision", 3, "yes"))
    yield result
    result.final_answer, result.status, result.stop_reason = "yes", "complete", "max_rounds"
    result.decision = {"kind": "vote", "answer": "yes"}
    yield result


def done() -> DebateResult:
    return list(growing())[-1]


def written(encoder: ResultJson, result: DebateResult, store: dict[int, tuple[int, str]], secrets: list[str]) -> Split:
    """One write of ``result`` into ``store`` (n -> (place, JSON)), as SqlStore makes it, committed."""
    split = encoder.split(result, secrets)
    if split.prune:
        for n in [n for n in store if n >= split.count]:
            del store[n]
    store.update({n: (place, text) for n, place, text in split.rows})
    encoder.stored(split)
    return split


def read(split: Split, store: dict[int, tuple[int, str]]) -> DebateResult:
    return assemble(split.frame, [store[n] for n in sorted(store)])


def test_each_write_reads_back_as_the_results_own_json() -> None:
    encoder, store = ResultJson(), dict[int, tuple[int, str]]()
    for state in growing():
        split = written(encoder, state, store, [])
        assert read(split, store).to_json(indent=None) == state.to_json(indent=None)
        assert assembled(split.frame, [store[n] for n in sorted(store)]) == json.loads(state.to_json(indent=None))


def test_a_finished_turn_is_encoded_and_written_once() -> None:
    encoder, store = ResultJson(), dict[int, tuple[int, str]]()
    calls = 0
    original = Turn.model_dump_json

    def counting(self: Turn, **kw: object) -> str:
        nonlocal calls
        calls += 1
        return original(self, **kw)  # type: ignore[arg-type]

    rows: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Turn, "model_dump_json", counting)
        for state in growing():
            rows += [n for n, _, _ in written(encoder, state, store, []).rows]
    assert calls == 5  # four debate turns and the decision's, each once, over seven writes
    assert rows == [0, 1, 2, 3, 4]  # and each written once
    assert [place for place, _ in store.values()] == [0, 0, 1, 1, DECISION]


def test_the_frame_holds_no_turn() -> None:
    split = ResultJson().split(done())
    assert "says" not in split.frame and '"turns"' not in split.frame
    assert json.loads(split.frame)["rounds"] == [{"index": 1}, {"index": 2}]


def test_a_write_that_was_not_committed_is_made_again() -> None:
    encoder, states = ResultJson(), growing()
    next(states)
    encoder.split(next(states))  # rolled back: never told stored()
    assert [n for n, _, _ in encoder.split(next(states)).rows] == [0, 1]


def test_a_shorter_transcript_prunes_the_rows_past_it() -> None:
    """A debate taken over goes on from the turns its store kept; a new replica's first write
    prunes whatever rows lie past its transcript, and so does one that has fewer turns."""
    store = dict[int, tuple[int, str]]()
    full = done()
    first = ResultJson()
    assert first.split(full).prune  # nothing known of the store yet
    written(first, full, store, [])
    assert not first.split(full).prune and not first.split(full).rows
    shorter = full.model_copy(deep=True)
    shorter.decision_turns.clear()
    shorter.rounds[1].turns.pop()
    split = written(first, shorter, store, [])
    assert split.prune and sorted(store) == [0, 1, 2]
    assert read(split, store).to_json(indent=None) == shorter.to_json(indent=None)


def test_secrets_are_redacted_in_the_turns_and_around_them() -> None:
    result = done()
    result.rounds[0].turns[0].text = "the key is sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"
    result.task.question = "use hunter2hunter2 please"
    store = dict[int, tuple[int, str]]()
    split = written(ResultJson(), result, store, ["hunter2hunter2"])
    stored = split.frame + "".join(text for _, text in store.values())
    assert "abcdefghijklmnop" not in stored and "hunter2hunter2" not in stored
    expected = json.loads(result.to_json(indent=None, secrets=["hunter2hunter2"]))
    assert assembled(split.frame, [store[n] for n in sorted(store)]) == expected


def test_a_new_secret_in_the_environment_writes_the_turns_it_changes_again(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder, store = ResultJson(), dict[int, tuple[int, str]]()
    result = done()
    result.rounds[0].turns[0].text = "token: s3cret-value-123"
    written(encoder, result, store, [])
    assert "s3cret-value-123" in store[0][1]
    monkeypatch.setenv("OPENAI_API_KEY", "s3cret-value-123")
    assert [n for n, _, _ in written(encoder, result, store, []).rows] == [0]
    assert "s3cret-value-123" not in store[0][1]


def test_forget_writes_a_changed_turn_again() -> None:
    encoder, store = ResultJson(), dict[int, tuple[int, str]]()
    result = done()
    written(encoder, result, store, [])
    result.rounds[1].turns[1].error = "cancelled: by its client"
    encoder.forget()
    split = written(encoder, result, store, [])
    assert [n for n, _, _ in split.rows] == [3]
    assert read(split, store).to_json(indent=None) == result.to_json(indent=None)


def test_a_transcript_stored_whole_is_read_as_it_is_whatever_rows_are_left() -> None:
    """A transcript stored whole (a write with no encoder; a replica of a moot before schema 5, in a
    rolling upgrade, writes only so) takes no rows: any left from an earlier writer are not its turns."""
    result, store = done(), dict[int, tuple[int, str]]()
    written(ResultJson(), result, store, [])
    shorter = result.model_copy(deep=True)
    shorter.rounds[1].turns.clear()
    shorter.decision_turns.clear()
    stale = [store[n] for n in sorted(store)]
    assert assemble(shorter.to_json(indent=None), stale).to_json(indent=None) == shorter.to_json(indent=None)
