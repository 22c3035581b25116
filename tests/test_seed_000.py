"""Seed 000's five test scenarios (SPEC-DEBATE-001), on the scripted model, through the seed's facade.

The seed's first scenario asks for 2 calls after one round; with the synthesis a round-1 debate
makes 3, so it is run with ``synthesize=False`` (the issue: 2R+1 calls with synthesis, 2R without).
"""

from __future__ import annotations

import time

import pytest

from moot import DebateEngine, DebateTimeout, ScriptedModel
from moot.models.base import ChatRequest

CONTEXT = [{"text": "RAG is Retrieval-Augmented Generation: a retriever finds passages, a generator answers."}]


def role_reply(request: ChatRequest) -> str:
    system = request.messages[0].content
    for role in ("Synthesizer", "Affirmative", "Critical"):
        if role in system:
            return f"{role} says RAG retrieves then generates."
    raise AssertionError("unknown speaker")


@pytest.mark.req("S000-ROUND1", "S000-RESULT")
async def test_round1_independent_answers() -> None:
    model = ScriptedModel(fn=role_reply)
    result = await DebateEngine(model=model).run_debate(
        query="What is RAG?", context=CONTEXT, max_rounds=1, synthesize=False
    )
    assert result.affirmative_answer == "Affirmative says RAG retrieves then generates."
    assert result.critical_answer == "Critical says RAG retrieves then generates."
    assert result.final_answer is None
    assert result.llm_calls == 2
    # Independent: neither saw the other's answer.
    for request in model.requests:
        assert "says RAG" not in request.messages[1].content


@pytest.mark.req("S000-ROUND2", "S000-RESULT", "S000-PROMPTS")
async def test_round2_critique() -> None:
    model = ScriptedModel(fn=role_reply)
    result = await DebateEngine(model=model).run_debate(
        query="What is RAG?", context=CONTEXT, max_rounds=2, synthesize=False
    )
    assert result.llm_calls == 4
    assert result.rounds == 2
    round2 = [r for r in model.requests[2:4]]
    for request in round2:
        prompt = request.messages[1].content
        assert "Affirmative says" in prompt and "Critical says" in prompt  # refines against the opponent


@pytest.mark.req("S000-SYNTHESIS", "S000-CALLS")
async def test_synthesis() -> None:
    model = ScriptedModel(fn=role_reply)
    result = await DebateEngine(model=model).run_debate(query="What is RAG?", context=CONTEXT, max_rounds=2)
    assert result.final_answer == "Synthesizer says RAG retrieves then generates."
    assert result.llm_calls == 5
    synthesis_prompt = model.requests[4].messages[1].content
    assert "Affirmative says" in synthesis_prompt and "Critical says" in synthesis_prompt
    assert model.requests[4].max_tokens == 800
    assert all(r.max_tokens == 500 for r in model.requests[:4])


@pytest.mark.req("S000-TIMEOUT")
async def test_timeout_fallback() -> None:
    model = ScriptedModel(fn=role_reply, latency=30.0)
    start = time.perf_counter()
    with pytest.raises(TimeoutError) as info:
        await DebateEngine(model=model).run_debate(query="Complex query...", context=CONTEXT, timeout=0.001)
    assert time.perf_counter() - start < 10.0  # in-flight calls (30 s each) were cancelled, not waited for
    assert isinstance(info.value, DebateTimeout)
    partial = info.value.result
    assert partial.status == "timeout" and partial.stop_reason == "timeout"
    cancelled = partial.turns()
    assert {t.speaker for t in cancelled} == {"affirmative", "critical"}
    assert all(t.error and "cancelled" in t.error for t in cancelled)


@pytest.mark.req("S000-TOKENS")
async def test_token_limit() -> None:
    long_answer = " ".join(f"word{i}" for i in range(1200))
    model = ScriptedModel(fn=lambda r: long_answer)
    result = await DebateEngine(model=model).run_debate(query="Long query...", context=CONTEXT)
    assert result.affirmative_answer is not None and result.critical_answer is not None
    assert len(result.affirmative_answer.split()) <= 500
    assert len(result.critical_answer.split()) <= 500
    assert result.final_answer is not None and len(result.final_answer.split()) <= 800
    turns = [*result.transcript.turns(), *result.transcript.decision_turns]
    assert len(turns) == 5 and all(t.trimmed for t in turns)
    assert len(result.final_answer.split()) == 800
    assert all(t.raw == long_answer for t in turns)  # what the model said is kept, flagged


@pytest.mark.parametrize("context", [CONTEXT, []])
async def test_citations_are_asked_for_only_where_passages_were_given(context: list[dict[str, str]]) -> None:
    """`[n]` cites a passage of the context: a debate with none (a question alone, through the CLI or
    the OpenAI endpoints) asks no turn, nor the synthesis, to cite by it, nor to answer using it."""
    model = ScriptedModel(fn=role_reply)
    await DebateEngine(model=model).run_debate(query="What is RAG?", context=context, max_rounds=2)
    assert len(model.requests) == 5
    for request in model.requests:
        asked = " ".join(m.content for m in request.messages)
        assert ("[n]" in asked) == bool(context), asked
        assert context or "using the context" not in asked, asked  # none is named where none was given
    assert not context or "using the context" in " ".join(m.content for m in model.requests[0].messages)


@pytest.mark.parametrize("context", ["just a string", {"text": "a passage"}])
async def test_one_passage_not_in_a_list_is_refused_before_any_call(context: object) -> None:
    """A string is a sequence too: its characters became the passages ([1] j [2] u ...), and a dict
    its keys (an outside trial)."""
    model = ScriptedModel(fn=role_reply)
    with pytest.raises(TypeError, match=r"context is a list of passages .*give \[context\] for a single passage"):
        await DebateEngine(model=model).run_debate(query="Q?", context=context)  # type: ignore[arg-type]
    assert model.requests == []
