"""A stop condition of one's own (``examples/custom_stop.py``): registered by name, it is read from
expressions and saved specs like the built-in ones, and the engine stops on it."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from moot import DebateResult, DebateState, DebateTask, ProtocolSpec, RoundPlan, StopCondition, register_stop
from moot.core import MaxRounds, Round, Turn
from moot.core.stop import CONDITIONS, StopParseError, parse_stop
from moot.models.weights import CATALOG, is_installed
from moot.protocols import get_preset

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_stop.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("custom_stop_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def state_with(*probs: float | None) -> DebateState:
    turns = [
        Turn(
            speaker=f"agent{i}", name=f"agent{i}", round=1, model="m", messages=[], text='{"answer": "B"}',
            parsed={"answer": "B"}, signals={} if p is None else {"answer_prob": p},
        )
        for i, p in enumerate(probs, 1)
    ]  # fmt: skip
    return DebateState(
        result=DebateResult(protocol="p", task=DebateTask(question="Q?"), rounds=[Round(index=1, turns=turns)])
    )


def test_a_registered_condition_reads_back_by_name(example: ModuleType) -> None:
    cond = parse_stop("confident_answers(0.8) | max_rounds(2)")
    assert cond == example.ConfidentAnswers(0.8) | MaxRounds(2)
    fields = {**get_preset("society-of-minds").model_dump(), "stop": "confident_answers(0.75)"}
    spec = ProtocolSpec.model_validate(fields)
    assert isinstance(spec.stop, example.ConfidentAnswers) and spec.stop.min_prob == 0.75
    again = ProtocolSpec.model_validate_json(spec.model_dump_json())  # a saved spec reads back
    assert again.stop == spec.stop


def test_the_condition_fires_only_when_every_answer_is_confident(example: ModuleType) -> None:
    cond, plan = example.ConfidentAnswers(0.9), get_preset("society-of-minds")
    assert cond.check(state_with(0.95, 0.91, 0.99), plan) == "confident_answers"
    assert cond.check(state_with(0.95, 0.5, 0.99), plan) is None
    assert cond.check(state_with(0.95, None), plan) is None  # no log-probabilities: never fires
    empty = DebateState(result=DebateResult(protocol="p", task=DebateTask(question="Q?")))
    assert cond.check(empty, plan) is None


def test_register_stop_refuses_a_bad_or_taken_name() -> None:
    with pytest.raises(ValueError, match="lowercase letters and underscores"):
        register_stop("Confident-2")
    with pytest.raises(ValueError, match=re.escape("'consensus' is already moot.core.stop.Consensus")):

        @register_stop("consensus")
        @dataclass(eq=False)
        class Mine(StopCondition):
            def check(self, state: DebateState, spec: RoundPlan) -> str | None:
                return None

            def expr(self) -> str:
                return "consensus()"

    with pytest.raises(StopParseError, match="unknown stop condition 'nobody_home'"):
        parse_stop("nobody_home()")
    assert "nobody_home" not in CONDITIONS


@pytest.mark.embedded
@pytest.mark.skipif(not is_installed(CATALOG["smollm2-135m"]), reason="embedded:smollm2-135m is not installed")
async def test_the_engine_stops_on_it_with_real_log_probabilities(example: ModuleType) -> None:
    """On the real tiny model every typed turn carries ``answer_prob``; at a threshold of 0 the
    condition fires after the first round, and the result names it."""
    from moot import Engine, resolve_model
    from moot.core import answer_of
    from moot.core.spec import Probe

    fields = {**get_preset("society-of-minds", agents=2).model_dump(), "stop": "confident_answers(0.0)"}
    spec = ProtocolSpec.model_validate({**fields, "probe": Probe().model_dump()})
    spec.budget.max_tokens_per_turn = 160
    # The tiny model sometimes answers "" (an empty answer has no tokens, so no answer_prob, and the
    # condition weighs only turns that answered): up to three debates, until one's first round answers.
    for _ in range(3):
        result = await Engine(spec, resolve_model("embedded:smollm2-135m")).run("Is 7 a prime number? (A) yes (B) no")
        answered = [t for t in result.rounds[0].turns if answer_of(t)]
        if answered:
            break
    assert answered and all("answer_prob" in t.signals for t in answered)
    assert result.stop_reason == "confident_answers" and len(result.rounds) == 1 < spec.rounds


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"preset": "moderated", "stop": "moderator('moderatr', 'confidence', 0.8)"},
            "names unknown participant 'moderatr'; known: proponent, opponent, moderator",
        ),
        (
            {"preset": "moderated", "stop": "max_rounds(3) | moderator('moderator', 'confidnce', 0.8)"},
            "reads 'confidnce', which moderator's turn schema 'moderator-evaluation' has not; it has: ",
        ),
        (
            {"preset": "society-of-minds", "decision": {"kind": "vote", "speakers": ["agnt1", "agent2"]}},
            "decision.speakers: unknown participant(s) agnt1; known: agent1, agent2, agent3",
        ),
    ],
)
def test_a_stop_or_a_decision_naming_no_participant_or_field_is_refused(
    data: dict[str, object], said: str, tmp_path: Path
) -> None:
    """Misspelt, a moderator's stop never fired and a voter was dropped, without a word (an outside
    trial's, session 37)."""
    from moot.protocols.loader import ProtocolFileError, load_protocol_data

    with pytest.raises(ProtocolFileError, match=re.escape(said)):
        load_protocol_data(data, tmp_path / "p.yaml")


def test_a_decision_kind_misspelt_gets_a_did_you_mean_and_a_judge_without_its_schema_the_one_to_give(
    tmp_path: Path,
) -> None:
    """pydantic's "Input tag 'votee' found using 'kind' does not match any of the expected tags", and
    "decision.judge.schema: Field required", and a stop's "bad argument 'high'" (an outside trial's)."""
    from moot.protocols.loader import ProtocolFileError, load_protocol_data

    for data, said in (
        ({"preset": "panel", "decision": {"kind": "votee"}}, "decision.kind: 'votee' is not one of "),
        ({"preset": "panel", "decision": {"kind": "votee"}}, "(did you mean 'vote'?)"),
        ({"preset": "panel", "decision": {"kind": "judge"}}, "required: the judge's typed verdict (schema: verdict"),
        ({"preset": "society-of-minds", "stop": "consensus(high)"}, "bad argument 'high'; give a number"),
    ):
        with pytest.raises(ProtocolFileError, match=re.escape(said)):
            load_protocol_data(data, tmp_path / "p.yaml")
