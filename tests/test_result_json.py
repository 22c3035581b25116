"""A running debate's stored JSON made with each finished turn encoded once (ResultJson): the same
text as ``DebateResult.to_json(indent=None)``, at every write of a debate as it grows."""

from __future__ import annotations

import json

import pytest

from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.models.base import Message, Usage
from moot.server.state.result_json import ResultJson


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


def growing() -> list[DebateResult]:
    """One debate as it is at each of its writes: started, each turn, each round, decided, done."""
    result = DebateResult(protocol="p", task=DebateTask(question="Is 7 prime? \u2603"), participants=[{"id": "a"}])
    states = [result.model_copy(deep=True)]
    for r in (1, 2):
        rnd = Round(index=r)
        result.rounds.append(rnd)
        for speaker in ("a", "b"):
            rnd.turns.append(turn(speaker, r, f"{speaker} says {r} " * 20))
            states.append(result)
    result.decision_turns.append(turn("decision", 3, "yes"))
    result.final_answer, result.status, result.stop_reason = "yes", "complete", "max_rounds"
    result.decision = {"kind": "vote", "answer": "yes"}
    return [*states, result]


def test_each_write_is_the_results_own_json() -> None:
    encoder = ResultJson()
    for state in growing():
        assert encoder.encode(state) == state.to_json(indent=None)


def test_a_finished_turn_is_encoded_once() -> None:
    encoder = ResultJson()
    calls = 0
    original = Turn.model_dump_json

    def counting(self: Turn, **kw: object) -> str:
        nonlocal calls
        calls += 1
        return original(self, **kw)  # type: ignore[arg-type]

    states = growing()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Turn, "model_dump_json", counting)
        for state in states:
            encoder.encode(state)
    assert calls == 5  # four debate turns and the decision's, each once, over seven writes


def test_secrets_are_redacted_in_the_turns_and_around_them(monkeypatch: pytest.MonkeyPatch) -> None:
    result = growing()[-1]
    result.rounds[0].turns[0].text = "the key is sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"
    result.task.question = "use hunter2hunter2 please"
    encoded = ResultJson().encode(result, ["hunter2hunter2"])
    assert "abcdefghijklmnop" not in encoded and "hunter2hunter2" not in encoded
    assert json.loads(encoded) == json.loads(result.to_json(indent=None, secrets=["hunter2hunter2"]))


def test_a_new_secret_in_the_environment_encodes_the_turns_again(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = ResultJson()
    result = growing()[-1]
    result.rounds[0].turns[0].text = "token: s3cret-value-123"
    assert "s3cret-value-123" in encoder.encode(result)
    monkeypatch.setenv("OPENAI_API_KEY", "s3cret-value-123")
    assert "s3cret-value-123" not in encoder.encode(result)


def test_forget_encodes_a_changed_turn_again() -> None:
    encoder = ResultJson()
    result = growing()[-1]
    encoder.encode(result)
    result.rounds[1].turns[1].error = "cancelled: by its client"
    encoder.forget()
    assert encoder.encode(result) == result.to_json(indent=None)
