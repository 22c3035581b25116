"""Seed 000 phase 4: the debate step of a RAG pipeline (flag, budget, fallback, record), and the
example pipeline ``examples/rag_pipeline.py`` run as a real LangGraph graph on the scripted model."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from moot import ScriptedModel
from moot.apps.rag import (
    DEBATE_MODE_ENV,
    DebateEngine,
    DebateStepSettings,
    context_chunk,
    debate_mode_from_env,
    debate_step,
    make_debate_step,
)
from moot.core.types import ContextChunk
from moot.models.base import ChatRequest, ModelError

STATE = {
    "query": "What is RAG?",
    "context": [{"text": "RAG retrieves passages, then a model answers from them.", "source": "notes.md"}],
    "answer": "The initial answer.",
}
ON = {"debate_mode": True}


def roles(request: ChatRequest) -> str:
    system = request.messages[0].content
    return next(f"{r} says RAG grounds answers." for r in ("Synthesizer", "Affirmative", "Critical") if r in system)


@pytest.fixture(autouse=True)
def _no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBATE_MODE_ENV, raising=False)


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a model was resolved")


# ------------------------------------------------------------------------------- the flag


@pytest.mark.req("S000-FLAG")
async def test_off_by_default_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("moot.core.engine.resolve_model", _refuse)
    monkeypatch.setattr("moot.apps.rag.Engine", _refuse)
    model = ScriptedModel([])
    update = await debate_step(STATE, model=model)
    assert set(update) == {"debate"}  # the answer is not touched
    record = update["debate"]
    assert record["status"] == "disabled" and record["llm_calls"] == 0 and record["reason"] is None
    assert record["elapsed_ms"] >= 0  # "costs nothing": no model resolved (_refuse), none called (below)
    assert model.requests == []
    # Not even a state without a query is looked at.
    assert (await debate_step({}))["debate"]["status"] == "disabled"


@pytest.mark.req("S000-FLAG")
@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("YES", True), (" on ", True),
                                          ("0", False), ("false", False), ("", False), ("no", False),
                                          ("maybe", False)])  # fmt: skip
async def test_the_environment_flag(value: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBATE_MODE_ENV, value)
    assert debate_mode_from_env() is on
    assert DebateStepSettings().enabled() is on
    model = ScriptedModel(fn=roles)
    update = await debate_step(STATE, model=model)
    assert update["debate"]["status"] == ("applied" if on else "disabled")
    assert len(model.requests) == (5 if on else 0)


@pytest.mark.req("S000-FLAG")
async def test_a_setting_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBATE_MODE_ENV, "1")
    model = ScriptedModel([])
    assert (await debate_step(STATE, model=model, settings={"debate_mode": False}))["debate"]["status"] == "disabled"
    assert debate_mode_from_env({DEBATE_MODE_ENV: "on"}) and not debate_mode_from_env({})


def test_settings_from_a_pipeline_config() -> None:
    flags = {"debate_mode": True, "rerank": False, "timeout_s": 3, "answer_key": "response"}
    cfg = DebateStepSettings.of(flags)
    assert cfg.debate_mode is True and cfg.timeout_s == 3 and cfg.answer_key == "response" and cfg.rounds == 2
    assert DebateStepSettings.of(None) == DebateStepSettings()
    assert DebateStepSettings.of(cfg) is cfg
    with pytest.raises(ValueError):
        DebateStepSettings(rounds=0)


# ------------------------------------------------------------------------- the debate runs


@pytest.mark.req("S000-FLAG")
async def test_on_the_synthesis_replaces_the_answer() -> None:
    model = ScriptedModel(fn=roles)
    update = await debate_step(STATE, model=model, settings=ON)
    assert update["answer"] == "Synthesizer says RAG grounds answers."
    record = update["debate"]
    assert record["status"] == "applied" and record["reason"] is None
    assert record["rounds"] == 2 and record["llm_calls"] == 5 == len(model.requests)
    assert record["timeout_s"] == 10.0 and record["elapsed_ms"] > 0
    assert "RAG retrieves passages" in model.requests[0].messages[1].content
    assert [r.max_tokens for r in model.requests] == [500, 500, 500, 500, 800]


async def test_chunks_of_every_shape_and_the_question_key() -> None:
    class Document:  # a LangChain document's shape
        def __init__(self) -> None:
            self.page_content = "from a document"
            self.metadata = {"source": "doc.md"}

    state = {"question": "Q?", "documents": ["a string", {"page_content": "a dict"}, Document()], "answer": "x"}
    model = ScriptedModel(fn=roles)
    update = await debate_step(state, model=model, settings={"debate_mode": True, "rounds": 1})
    prompt = model.requests[0].messages[1].content
    assert "Question: Q?" in prompt
    assert "[1] a string\n[2] a dict\n[3] from a document (source: doc.md)" in prompt
    assert update["debate"]["llm_calls"] == 3
    assert context_chunk(ContextChunk(text="t")) == ContextChunk(text="t")
    with pytest.raises(ValueError, match="needs a 'text'"):
        context_chunk({"body": "x"})
    with pytest.raises(TypeError, match="cannot use a int"):
        context_chunk(3)


async def test_custom_keys_and_budget() -> None:
    model = ScriptedModel(fn=roles)
    settings = DebateStepSettings(debate_mode=True, rounds=1, max_tokens=50, synthesis_max_tokens=60,
                                  answer_key="response", record_key="step4")  # fmt: skip
    update = await debate_step({"query": "Q", "response": "first"}, model=model, settings=settings)
    assert update == {"response": "Synthesizer says RAG grounds answers.", "step4": update["step4"]}
    assert [r.max_tokens for r in model.requests] == [50, 50, 60]


async def test_make_debate_step_binds_model_and_settings() -> None:
    model = ScriptedModel(fn=roles)
    step = make_debate_step(model, {"debate_mode": True})
    update = await step(STATE)
    assert update["answer"] == "Synthesizer says RAG grounds answers." and step.__name__ == "debate_step"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- fallbacks


@pytest.mark.req("S000-FALLBACK")
async def test_a_timeout_keeps_the_initial_answer(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(fn=roles, latency=30.0)
    with caplog.at_level(logging.WARNING, logger="moot.apps.rag"):
        update = await debate_step(STATE, model=model, settings={"debate_mode": True, "timeout_s": 0.05})
    assert "answer" not in update
    record = update["debate"]
    assert record["status"] == "timeout" and record["timeout_s"] == 0.05
    assert record["reason"] == "the debate did not finish within its timeout of 0.05 s"
    assert record["rounds"] == 1 and record["llm_calls"] == 2  # the cancelled round-1 calls
    assert 50 <= record["elapsed_ms"] < 10_000  # the 30 s calls were cancelled, not waited for
    assert "debate step timed out, keeping the initial answer" in caplog.text


@pytest.mark.req("S000-FALLBACK")
async def test_an_error_keeps_the_initial_answer_and_logs_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-" + "A1b2C3d4E5f6G7h8J9k0"
    model = ScriptedModel([ModelError(f"backend rejected key {secret}"), ModelError("backend down")])
    with caplog.at_level(logging.WARNING, logger="moot.apps.rag"):
        update = await debate_step(STATE, model=model, settings=ON)
    assert "answer" not in update
    record = update["debate"]
    assert record["status"] == "error" and record["llm_calls"] == 2 and record["rounds"] == 1
    assert record["reason"].startswith("DebateFailed: backend rejected key ***")
    assert secret not in caplog.text and "debate step failed, keeping the initial answer" in caplog.text


@pytest.mark.req("S000-FALLBACK")
@pytest.mark.parametrize(
    ("state", "model", "reason"),
    [
        ({"answer": "x"}, ScriptedModel([]), "ValueError: the pipeline state has no query"),
        (STATE, ScriptedModel(fn=lambda r: RuntimeError("a bug")), "RuntimeError: a bug"),  # from parallel turns
        (STATE, ScriptedModel(fn=lambda r: "  " if "Synthesizer" in r.messages[0].content else "ok"),
         "the debate gave an empty synthesis"),
        (STATE, "nonsense:model", "ModelSpecError"),
    ],
)  # fmt: skip
async def test_any_error_is_an_error_record(state: dict[str, Any], model: Any, reason: str) -> None:
    update = await debate_step(state, model=model, settings=ON)
    assert "answer" not in update
    assert update["debate"]["status"] == "error" and update["debate"]["reason"].startswith(reason)


@pytest.mark.req("S000-RESULT")
async def test_the_facade_takes_documents_too() -> None:
    result = await DebateEngine(ScriptedModel(fn=roles)).run_debate("Q", [{"page_content": "doc text"}], max_rounds=1)
    assert result.transcript.task.context[0].text == "doc text" and result.llm_calls == 3


# --------------------------------------------------------------------- the example pipeline

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rag_pipeline.py"
QUESTION = "What does the debate step do when the budget expires?"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    pytest.importorskip("langgraph")
    spec = importlib.util.spec_from_file_location("rag_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_retrieves_by_keyword_overlap(example: ModuleType) -> None:
    sources = [d["source"] for d in example.retrieve(QUESTION)]
    assert sources[0] == "fallback.md" and len(sources) == 3
    assert example.retrieve("zebra xylophone") == []


async def test_example_flag_off_keeps_the_answer_and_calls_nothing(example: ModuleType) -> None:
    generator, debater = ScriptedModel(["Initial: it keeps the answer [1]."]), ScriptedModel([])
    state = await example.run_pipeline(QUESTION, generator, debate_model=debater)
    assert state["answer"] == "Initial: it keeps the answer [1]."
    assert state["debate"]["status"] == "disabled" and debater.requests == []
    assert len(generator.requests) == 1
    assert "fallback.md" in generator.requests[0].messages[1].content
    assert state["documents"][0]["source"] == "fallback.md"


async def test_example_flag_on_replaces_the_answer_with_the_synthesis(example: ModuleType) -> None:
    generator, debater = ScriptedModel(["Initial."]), ScriptedModel(fn=roles)
    state = await example.run_pipeline(QUESTION, generator, debate_model=debater, settings=ON)
    assert state["answer"] == "Synthesizer says RAG grounds answers."
    assert state["debate"]["status"] == "applied" and len(debater.requests) == 5
    assert "The debate step has a budget of 10 seconds" in debater.requests[0].messages[1].content


async def test_example_flag_from_the_environment(example: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBATE_MODE_ENV, "true")
    state = await example.run_pipeline(QUESTION, ScriptedModel(["Initial."]), debate_model=ScriptedModel(fn=roles))
    assert state["debate"]["status"] == "applied"


async def test_example_timeout_keeps_the_initial_answer(example: ModuleType) -> None:
    generator, debater = ScriptedModel(["Initial."]), ScriptedModel(fn=roles, latency=30.0)
    settings = {"debate_mode": True, "timeout_s": 0.05}
    state = await example.run_pipeline(QUESTION, generator, debate_model=debater, settings=settings)
    assert state["answer"] == "Initial." and state["debate"]["status"] == "timeout"
    assert state["debate"]["elapsed_ms"] < 10_000


async def test_example_error_keeps_the_initial_answer(example: ModuleType) -> None:
    generator, debater = ScriptedModel(["Initial."]), ScriptedModel([ModelError("down"), ModelError("down")])
    state = await example.run_pipeline(QUESTION, generator, debate_model=debater, settings=ON)
    assert state["answer"] == "Initial." and state["debate"]["status"] == "error"
    assert "down" in state["debate"]["reason"]


def test_example_command_line(example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "replies.json"
    script.write_text('["Initial.", "a1", "c1", "a2", "c2", "The synthesis."]', encoding="utf-8")
    assert example.main([QUESTION, "--model", f"scripted:{script}", "--debate"]) == 0
    out = capsys.readouterr().out
    assert "sources: fallback.md" in out and "debate: applied in" in out and out.rstrip().endswith("The synthesis.")
    other = tmp_path / "other.json"
    other.write_text('["Initial."]', encoding="utf-8")
    assert example.main([QUESTION, "--model", f"scripted:{other}", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["answer"] == "Initial." and state["debate"]["status"] == "disabled"
    assert example.main([QUESTION, "--model", f"scripted:{other}"]) == 1  # its one reply is spent: a model error
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("blank", ["", "  \n"], ids=["empty", "blank"])
def test_example_refuses_a_blank_question_in_one_line(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], blank: str
) -> None:
    """``rag_pipeline.py ""`` asked the model for an answer to nothing, then the debate step failed
    with "no query"; it is refused up front, exit 2, before any model is loaded."""
    script = tmp_path / "replies.json"
    script.write_text('["Initial.", "a1", "c1", "a2", "c2", "The synthesis."]', encoding="utf-8")
    assert example.main([blank, "--model", f"scripted:{script}", "--debate"]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.splitlines() == ["error: the question is blank: give a question to debate"]


async def test_example_pipeline_refuses_a_blank_question_before_any_call(example: ModuleType) -> None:
    generator, debater = ScriptedModel(["Initial."]), ScriptedModel(fn=roles)
    with pytest.raises(ValueError, match="the question is blank"):
        await example.run_pipeline(" ", generator, debate_model=debater, settings=ON)
    assert generator.requests == [] and debater.requests == []
