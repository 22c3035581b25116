"""The ABSA pipeline end to end on the scripted model: stages, both debate variants, span checks,
the override, the moderator, memory injection, configs and the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moot.apps.absa.pipeline import AbsaConfig, AbsaPipeline, MemoryStore, is_deadlock, observe_deadlock
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel

SENTENCE = "The pasta was great but the service was painfully slow."
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "absa"


def _edit(
    op: str, target: str, value: str | None = None, evidence: str | None = None, conf: float = 0.9
) -> dict[str, Any]:
    return {"op": op, "target": target, "value": value, "evidence": evidence, "confidence": conf}


class Script:
    """Replies by what is asked; ``judge_spans`` and the per-round edits are adjustable."""

    def __init__(self) -> None:
        self.judge_spans: list[list[str]] = [["painfully slow"]]
        self.rounds: list[dict[str, list[dict[str, Any]]]] = [
            {
                "EPM": [_edit("set_polarity", "service", "negative", "painfully slow", 0.9)],
                "TAN": [_edit("confirm_tuple", "pasta", None, "great", 0.8)],
                "CJ": [_edit("set_polarity", "service", "negative", "painfully slow", 0.8)],
            }
        ]
        self.turns_seen: dict[str, int] = {}
        self.prompts: list[str] = []

    def __call__(self, request: ChatRequest) -> dict[str, Any]:
        text = request.messages[-1].content
        system = request.messages[0].content
        self.prompts.append(text)
        if text.startswith("Aspect term extraction"):
            return {"aspects": [{"term": "pasta", "confidence": 0.9}, {"term": "service", "confidence": 0.8}],
                    "sentence_label": "mixed", "confidence": 0.8}  # fmt: skip
        if text.startswith("Aspect sentiment"):
            return {"aspect_sentiments": [
                        {"aspect_term": "pasta", "polarity": "positive", "confidence": 0.9},
                        {"aspect_term": "service", "polarity": "positive", "confidence": 0.5}],
                    "sentence_label": "mixed", "confidence": 0.7}  # fmt: skip
        if text.startswith("Validate"):
            return {"issues": [{"type": "contrast", "severity": "high", "description": "but"}],
                    "suggested_label": "mixed", "confidence": 0.7, "correction_proposals": []}  # fmt: skip
        if text.startswith("Review the aspect terms"):
            return {"aspect_review": [], "sentence_label": "mixed", "confidence": 0.8}
        if text.startswith("Review the aspect sentiments"):
            return {"sentiment_review": [{"action": "maintain", "aspect_term": "service", "confidence": 0.5}],
                    "sentence_label": "mixed", "confidence": 0.75}  # fmt: skip
        if "[ALL_TURNS]" in text:
            spans = self.judge_spans.pop(0) if len(self.judge_spans) > 1 else self.judge_spans[0]
            return {"final_patch": [_edit("set_polarity", "service", "negative", "painfully slow")],
                    "final_tuples": [{"aspect_term": "pasta", "polarity": "positive"},
                                     {"aspect_term": "service", "polarity": "negative"}],
                    "unresolved_conflicts": [], "sentence_polarity": "mixed", "sentence_evidence_spans": spans,
                    "rationale": "the pasta is praised, the service is not"}  # fmt: skip
        if "[TOPIC]" in text:
            name = json.loads(text.split("[PERSONA]\n", 1)[1].split("\n\n", 1)[0])["name"]
            n = self.turns_seen.get(name, 0)
            self.turns_seen[name] = n + 1
            edits = self.rounds[min(n, len(self.rounds) - 1)][name]
            return {"agent": name.lower(), "proposed_edits": edits}
        raise AssertionError(f"unexpected prompt: {system[:60]} / {text[:80]}")


@pytest.mark.req("S001-MODERATOR-OUT", "S002-PERSONAS", "S002-ORDER", "S002-HISTORY", "S002-JUDGE")
async def test_patch_debate_corrects_what_stage_2_kept_and_the_moderator_decides() -> None:
    script = Script()
    model = ScriptedModel(fn=script)
    result = await AbsaPipeline(AbsaConfig(), model).run(SENTENCE)
    assert result.calls == 3 + 4 + 2  # stage 1, EPM/TAN/CJ + judge, two reviews
    assert [a.span for a in result.stage1.ate.aspects] == [(4, 9), (28, 35)]  # located by code
    debate = result.debate
    assert debate is not None and debate.judge_valid and debate.judge_problems == []
    # the history reaches TAN in the seed's line form
    tan_prompt = next(p for p in script.prompts if '"name":"TAN"' in p)
    assert "[HISTORY]\n- epm: set_polarity target=service value=negative evidence=painfully slow" in tan_prompt
    # Stage 2 kept service positive; the debate's hints override it (EPM 0.72 + CJ 0.64 + judge 1.0)
    assert result.stage2.applied.sentiments[1].polarity == "positive"
    assert result.stage2.override is not None and result.stage2.override.stats.applied == 1
    final = {a.aspect_term: a.polarity for a in result.moderator.final_aspects}
    assert final == {"pasta": "positive", "service": "negative"}
    assert any(e.kind == "DEBATE_OVERRIDE" for e in result.stage2.override.log)
    assert result.moderator.final_label == "mixed"
    assert result.errors == []


@pytest.mark.req("S001-FLAGS")
async def test_without_the_debate_nothing_overrides_stage_2() -> None:
    model = ScriptedModel(fn=Script())
    result = await AbsaPipeline(AbsaConfig(enable_debate=False), model).run(SENTENCE)
    assert result.calls == 5 and result.debate is None and result.stage2.override is None
    assert {a.aspect_term: a.polarity for a in result.moderator.final_aspects}["service"] == "positive"


@pytest.mark.req("S001-FLAGS")
async def test_debate_without_override_keeps_stage_2_polarities() -> None:
    result = await AbsaPipeline(AbsaConfig(enable_debate_override=False), ScriptedModel(fn=Script())).run(SENTENCE)
    assert result.debate is not None and result.stage2.override is None
    assert {a.aspect_term: a.polarity for a in result.moderator.final_aspects}["service"] == "positive"


@pytest.mark.req("S002-SPANS")
async def test_a_judge_span_that_is_not_in_the_sentence_is_repaired_once_then_reported() -> None:
    script = Script()
    script.judge_spans = [["the service was slow"], ["painfully slow"]]  # invented, then exact
    result = await AbsaPipeline(AbsaConfig(), ScriptedModel(fn=script)).run(SENTENCE)
    assert result.debate is not None and result.debate.judge_valid
    assert result.debate.judge_problems and result.debate.judge_problems[0].startswith("repaired:")
    assert result.calls == 3 + 4 + 1 + 2

    bad = Script()
    bad.judge_spans = [["the service was slow"]]
    result = await AbsaPipeline(AbsaConfig(), ScriptedModel(fn=bad)).run(SENTENCE)
    assert result.debate is not None and not result.debate.judge_valid
    assert any("the service was slow" in p for p in result.debate.judge_problems)
    # an invalid judge is not used: its tuples give no hints, its summary does not reach Rule E
    assert all(h.speaker != "judge" for hs in result.debate.aspect_hints.values() for h in hs)


async def test_case_or_spacing_differences_in_a_span_are_realigned_without_a_call() -> None:
    script = Script()
    script.judge_spans = [["Painfully  slow"]]
    result = await AbsaPipeline(AbsaConfig(), ScriptedModel(fn=script)).run(SENTENCE)
    assert result.debate is not None and result.debate.judge_valid and result.calls == 9
    assert result.debate.summary is not None
    assert result.debate.summary["sentence_evidence_spans"] == ["painfully slow"]


async def test_list_fields_are_bounded_in_the_schema_and_cut_when_a_backend_ignores_it() -> None:
    class Repeating(Script):
        """A reviewer that repeats itself, as qwen2.5-0.5b did until max_tokens cut it off."""

        def __init__(self) -> None:
            super().__init__()
            self.bounds: dict[str, int] = {}
            self.required: set[str] = set()

        def __call__(self, request: ChatRequest) -> dict[str, Any]:
            schema = request.response_schema or {}
            for name, prop in schema.get("properties", {}).items():
                if "maxItems" in prop:
                    self.bounds[name] = prop["maxItems"]
                    self.required |= {name} & set(schema.get("required", []))
            if request.messages[-1].content.startswith("Review the aspect sentiments"):
                item = {"action": "maintain", "aspect_term": "service", "confidence": 0.5}
                return {"sentiment_review": [item] * 9, "sentence_label": "mixed", "confidence": 0.75}
            return super().__call__(request)

    script = Repeating()
    result = await AbsaPipeline(AbsaConfig(enable_debate=False), ScriptedModel(fn=script)).run(SENTENCE)
    # Stage 1 found 2 aspects: each review may name them and add 2 more; ATSA has 2 terms to rate.
    assert script.bounds == {
        "aspects": 6, "aspect_sentiments": 2, "issues": 6, "correction_proposals": 3,
        "aspect_review": 4, "sentiment_review": 4,
    }  # fmt: skip
    assert script.required == set(script.bounds)  # every bounded list is also required (the validator's too)
    assert result.stage2.atsa_review is not None and len(result.stage2.atsa_review.sentiment_review) == 4
    assert result.errors == []


@pytest.mark.req("S002-CONFIG")
async def test_memory_is_injected_once_when_the_debate_deadlocks(tmp_path: Path) -> None:
    script = Script()
    script.rounds = [
        {  # round 1: EPM and CJ push service opposite ways at low confidence: 2 of 4 observations
            "EPM": [_edit("set_polarity", "service", "negative", "painfully slow", 0.5)],
            "TAN": [_edit("confirm_tuple", "pasta", None, "great", 0.5)],
            "CJ": [_edit("set_polarity", "service", "positive", "great", 0.5)],
        },
        {  # round 2, after the injection: agreement
            "EPM": [_edit("set_polarity", "service", "negative", "painfully slow", 0.9)],
            "TAN": [_edit("confirm_tuple", "pasta", None, "great", 0.9)],
            "CJ": [_edit("set_polarity", "service", "negative", "painfully slow", 0.9)],
        },
    ]
    cfg_file = tmp_path / "conditions.yaml"
    cfg_file.write_text(
        "pipeline:\n  debate:\n    enabled: true\n    max_rounds: 3\n    injection:\n"
        '      strategy: "during_debate_one_shot"\n      trigger: "deadlock_obs2of4"\n'
        "      allow_multiple_injections: false\n"
    )
    config = AbsaConfig.load(cfg_file)
    result = await AbsaPipeline(config, ScriptedModel(fn=script)).run(SENTENCE)
    debate = result.debate
    assert debate is not None and len(debate.injections) == 1
    assert debate.injections[0].round == 1
    assert debate.injections[0].observations == {
        "polarity_conflict": True, "keep_drop_conflict": False, "stalled": False, "low_confidence": True,
    }  # fmt: skip
    assert len(debate.transcript.rounds) == 2 and debate.transcript.stop_reason == "no_deadlock"
    round2 = [p for p in script.prompts if '"name":"EPM"' in p][1]
    assert "resolved_past_cases" in round2
    round1 = next(p for p in script.prompts if '"name":"EPM"' in p)
    assert "resolved_past_cases" not in round1


def test_deadlock_observations() -> None:
    assert is_deadlock({"a": True, "b": True, "c": False, "d": False})
    assert not is_deadlock({"a": True, "b": False, "c": False, "d": False})


def test_memory_retrieval_prefers_the_same_aspect() -> None:
    store = MemoryStore(
        [{"text": "the fries were soggy", "aspect": "fries"}, {"text": "great service here", "aspect": "service"}]
    )
    assert store.retrieve(SENTENCE, ["service"], 1)[0]["aspect"] == "service"
    assert store.retrieve("nothing in common", ["zzz"], 3) == []
    assert len(MemoryStore.load().cases) >= 10


@pytest.mark.req("S001-ORDER", "S001-FLAGS")
def test_seed_configs_load(tmp_path: Path) -> None:
    (tmp_path / "abl_no_debate.yaml").write_text("enable_debate: false\nenable_debate_override: false\n")
    cfg = AbsaConfig.load(tmp_path / "abl_no_debate.yaml")
    assert cfg.name == "abl_no_debate" and not cfg.debate_on
    (tmp_path / "panel.yaml").write_text(
        "pipeline:\n  debate:\n    variant: panel\n    rounds: 1\n    order: [critic, analyst]\n"
        "debate_override:\n  min_total: 2.0\n"
    )
    panel = AbsaConfig.load(tmp_path / "panel.yaml")
    assert panel.debate.variant == "panel" and panel.thresholds().min_total == 2.0
    (tmp_path / "bad.yaml").write_text("pipeline:\n  debate:\n    rounds: zero\n")
    with pytest.raises(ValueError, match=r"bad.yaml: pipeline\.debate\.rounds"):  # where the file wrote it
        AbsaConfig.load(tmp_path / "bad.yaml")
    (tmp_path / "flat.yaml").write_text("debate:\n  rounds: zero\n")
    with pytest.raises(ValueError, match=r"flat.yaml: debate\.rounds"):
        AbsaConfig.load(tmp_path / "flat.yaml")
    (tmp_path / "typo.yaml").write_text("enable_debat: true\n")
    with pytest.raises(ValueError, match="enable_debat"):
        AbsaConfig.load(tmp_path / "typo.yaml")


def _panel_script(request: ChatRequest) -> dict[str, Any]:
    text = request.messages[-1].content
    if "[ALL_TURNS]" in text:
        return {"winner": "Critic panel", "consensus": "The sentence is mixed: tasty pasta, slow service.",
                "key_agreements": [], "key_disagreements": [], "rationale": "both sides have a point"}  # fmt: skip
    if "[TOPIC]" in text:
        persona = json.loads(text.split("[PERSONA]\n", 1)[1].split("\n\n", 1)[0])
        stance = persona["stance"]
        refs = {"con": ["service"], "pro": ["pasta"], "neutral": []}[stance]
        return {"speaker": persona["name"], "stance": stance, "planning": "p", "reflection": "r",
                "message": "The service was slow." if stance == "con" else "Good food.", "key_points": [],
                "aspect_refs": refs}  # fmt: skip
    return Script()(request)


@pytest.mark.req("S001-TURN", "S001-JUDGE")
async def test_panel_variant_maps_turns_to_aspects() -> None:
    config = AbsaConfig(debate={"variant": "panel", "rounds": 1})  # type: ignore[arg-type]
    model = ScriptedModel(fn=_panel_script)
    result = await AbsaPipeline(config, model).run(SENTENCE)
    debate = result.debate
    assert debate is not None and debate.review_context is not None
    assert result.calls == 3 + 3 + 1 + 2
    ctx = debate.review_context
    assert ctx.mapping_stats.turns == 3
    assert {h.polarity_hint for h in ctx.aspect_hints["service"]} == {"negative"}
    # one con turn (weight 1.0) is below min_total 1.6: the override skips service for low signal
    assert result.stage2.override is not None and result.stage2.override.stats.skipped_low_signal >= 1


def test_cli_absa_run_shows_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moot.cli.main import app

    # The models' text is printed as it is: a "[/INST]" a model writes raised rich's MarkupError (a
    # traceback, and no --json), and a "[screen]" vanished.
    run = AbsaPipeline.run

    async def marked(self: AbsaPipeline, sentence: str) -> Any:
        result = await run(self, sentence)
        result.moderator.rationale = "because [/INST] of the [screen]"
        return result

    monkeypatch.setattr(AbsaPipeline, "run", marked)

    replies: list[dict[str, Any]] = []
    s = Script()
    for prompt in ("Aspect term extraction", "Aspect sentiment", "Validate"):
        replies.append(s(ChatRequest(messages=[_msg("system"), _msg(prompt)])))
    cfg = tmp_path / "nodebate.yaml"
    cfg.write_text("enable_debate: false\n")
    replies.append(s(ChatRequest(messages=[_msg("system"), _msg("Review the aspect terms")])))
    replies.append(s(ChatRequest(messages=[_msg("system"), _msg("Review the aspect sentiments")])))
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["absa", "run", SENTENCE, "-m", f"scripted:{script}", "--config", str(cfg),
                                   "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "rationale: because [/INST] of the [screen]" in res.output
    for heading in ("Stage 1", "Stage 2", "Moderator"):
        assert heading in res.output
    assert json.loads(out.read_text())["moderator"]["final_label"] == "mixed"


def _msg(text: str) -> Any:
    from moot.models.base import Message

    return Message(role="user", content=text)


def test_observe_deadlock_on_an_empty_debate() -> None:
    from moot.core.types import DebateResult, DebateTask

    empty = DebateResult(protocol="absa-patch", task=DebateTask(question="q"))
    assert not any(observe_deadlock(empty, "patch", []).values())


def _data(tmp_path: Path) -> Path:
    lines = [
        {"id": "t-1", "lang": "en", "domain": "restaurant", "text": SENTENCE, "sentence_label": "mixed",
         "aspects": [{"term": "pasta", "from": 4, "to": 9, "polarity": "positive"},
                     {"term": "service", "from": 28, "to": 35, "polarity": "negative"}]},
        {"id": "t-2", "lang": "en", "domain": "restaurant", "text": "The pasta was great, the service too.",
         "sentence_label": "positive",
         "aspects": [{"term": "pasta", "from": 4, "to": 9, "polarity": "positive"},
                     {"term": "service", "from": 25, "to": 32, "polarity": "positive"}]},
    ]  # fmt: skip
    path = tmp_path / "gold.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


async def test_eval_resumes_and_the_override_ablation_is_derived_without_calls(tmp_path: Path) -> None:
    from moot.apps.absa.evaluate import derive_run, load_items, render_comparison, run_eval

    items = load_items(_data(tmp_path))
    full = AbsaConfig(name="full")
    model = ScriptedModel(fn=Script())
    summary = await run_eval(full, AbsaPipeline(full, model), items, tmp_path / "full")
    # t-2: the scripted judge quotes "painfully slow", not in that sentence: one repair, then unused
    assert summary.sentences == 2 and summary.calls_per_sentence == 9.5
    # t-1: EPM + CJ + the judge push service to negative (applied); t-2 without the judge: service 1.36
    # and pasta 0.64 are both below min_total 1.6
    assert summary.metrics.debate.debate_override_applied == 1
    assert summary.metrics.debate.debate_override_skipped_low_signal == 2
    again = ScriptedModel(fn=Script())
    await run_eval(full, AbsaPipeline(full, again), items, tmp_path / "full")
    assert again.requests == []  # resumed: nothing left to run
    with pytest.raises(ValueError, match=r"holds a run of another config \(enable_debate: True -> False; name: "):
        other = AbsaConfig(name="other", enable_debate=False)
        await run_eval(other, AbsaPipeline(other, again), items, tmp_path / "full")

    no_override = AbsaConfig(name="abl_no_debate_override", enable_debate_override=False)
    derived = derive_run(tmp_path / "full", no_override, items, tmp_path / "no-override")
    assert derived.metrics.debate.debate_override_applied == 0
    assert derived.calls_per_sentence == 9.5  # the calls of the run it shares
    # without the override t-1's service stays positive: one aspect-polarity pair fewer right
    assert derived.metrics.task.aspect_polarity.tp == summary.metrics.task.aspect_polarity.tp - 1
    with pytest.raises(ValueError, match="makes other model calls"):
        derive_run(tmp_path / "full", AbsaConfig(name="x", enable_debate=False), items, tmp_path / "x")
    table = render_comparison([summary, derived])
    assert "| aspect-polarity F1 |" in table and "abl_no_debate_override" in table
    assert set(summary.by_lang) == {"en"} and summary.label_right.keys() == {"t-1", "t-2"}
    assert table.startswith("Model: scripted.")  # the derived run keeps the model of its source
    # sentence labels are the override's business only through aspects: both runs pair on 2 sentences
    assert "| – | 0 / 0, p = 1.00 (2 paired) |" in table
    # ... while the override found one gold pair (t-1's service negative) the ablation misses
    assert summary.pairs_found["t-1"] == ["pasta|positive", "service|negative"]
    assert "found only here / only by first, McNemar p | – | 0 / 1, p = 1.00 |" in table
    with pytest.raises(ValueError, match="holds a run on scripted, not other"):
        await run_eval(full, AbsaPipeline(full, ScriptedModel(fn=Script(), name="other")), items, tmp_path / "full")


def test_cli_absa_report_compares_runs(tmp_path: Path) -> None:
    import asyncio

    from moot.apps.absa.evaluate import load_items, run_eval
    from moot.cli.main import app

    items = load_items(_data(tmp_path))
    for name, cfg in (
        ("full", AbsaConfig(name="full")),
        ("nodebate", AbsaConfig(name="nodebate", enable_debate=False)),
    ):
        asyncio.run(run_eval(cfg, AbsaPipeline(cfg, ScriptedModel(fn=Script())), items, tmp_path / name))
    out = tmp_path / "report.md"
    res = CliRunner().invoke(
        app, ["absa", "report", str(tmp_path / "full"), str(tmp_path / "nodebate"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| metric | full | nodebate | stage 1 only (of full) |" in text
    table = tmp_path / "sentences.csv"
    res = CliRunner().invoke(
        app, ["absa", "report", str(tmp_path / "full"), str(tmp_path / "nodebate"), "--csv", str(table)]
    )
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(table.open()))
    assert [(r["config"], r["id"]) for r in rows] == [
        ("full", "t-1"), ("full", "t-2"), ("nodebate", "t-1"), ("nodebate", "t-2")
    ]  # fmt: skip
    t1 = rows[0]  # the override turns service negative: both gold pairs; Stage 1 had pasta only
    assert (t1["gold_pairs"], t1["pairs_found"], t1["stage1_pairs_found"], t1["override_applied"]) == (
        "2",
        "2",
        "1",
        "1",
    )
    assert rows[2]["override_applied"] == "0" and rows[2]["calls"] == "5"
    assert "text" not in rows[0] and SENTENCE not in table.read_text()
    bare = CliRunner().invoke(app, ["absa", "report", str(tmp_path / "full"), "--no-stage1"])
    assert bare.exit_code == 0 and "stage 1 only" not in bare.output
    assert "only this right / only first right, McNemar p" in text and "(2 paired)" in text
    bad = CliRunner().invoke(app, ["absa", "report", str(tmp_path)])
    assert bad.exit_code == 2 and "not a `moot absa eval` run" in bad.output


async def test_a_resume_after_the_prompts_changed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import moot.apps.absa.pipeline as pipeline_mod
    from moot.apps.absa.evaluate import derive_run, load_items, run_eval

    items = load_items(_data(tmp_path))
    full = AbsaConfig(name="full")
    await run_eval(full, AbsaPipeline(full, ScriptedModel(fn=Script())), items[:1], tmp_path / "full")
    asked = json.loads((tmp_path / "full" / "run.json").read_text())["asked"]
    assert asked == pipeline_mod.asked_fingerprint(full)
    # the derived ablation keeps the fingerprint of the replies it re-decides
    derive_run(tmp_path / "full", AbsaConfig(name="no", enable_debate_override=False), items, tmp_path / "no")
    assert json.loads((tmp_path / "no" / "run.json").read_text())["asked"] == asked
    monkeypatch.setattr(pipeline_mod, "ATE_PROMPT", pipeline_mod.ATE_PROMPT + " Be brief.")
    model = ScriptedModel(fn=Script())
    with pytest.raises(ValueError, match="other prompts or schemas"):
        await run_eval(full, AbsaPipeline(full, model), items, tmp_path / "full")
    assert model.requests == []
    monkeypatch.undo()
    await run_eval(full, AbsaPipeline(full, model), items, tmp_path / "full")  # same prompts: resumes
    assert len(model.requests) == 10  # only the second sentence ran (9 calls and one judge repair)


async def test_stage1_column_reads_stage1_answers_from_a_run(tmp_path: Path) -> None:
    from moot.apps.absa.evaluate import RunLine, load_items, render_comparison, run_eval, summarise

    items = load_items(_data(tmp_path))
    cfg = AbsaConfig(name="full")
    await run_eval(cfg, AbsaPipeline(cfg, ScriptedModel(fn=Script())), items, tmp_path / "full")
    s1 = summarise(tmp_path / "full", "full", stage1=True)
    # Stage 1 ATSA: pasta and service positive in both sentences, sentence label mixed
    task = s1.metrics.task
    assert (task.aspect_polarity.tp, task.aspect_polarity.predicted, task.aspect_polarity.gold) == (3, 4, 4)
    assert task.aspect_term.f1 == 1.0 and task.sentence_accuracy == 0.5
    assert s1.label_right == {"t-1": True, "t-2": False}
    assert s1.calls_per_sentence is None and s1.config == "stage 1 only (of full)"
    table = render_comparison([summarise(tmp_path / "full", "full"), s1])
    assert "| calls / sentence | 9.5 | – |" in table
    # only Stage 1's own errors count in its column
    path = tmp_path / "full" / "results.jsonl"
    lines = [RunLine.model_validate_json(x) for x in path.read_text().splitlines()]
    lines[0].errors, lines[1].errors = ["ATSA review: unparsable reply"], ["Validator: unparsable reply"]
    path.write_text("".join(x.model_dump_json() + "\n" for x in lines))
    assert summarise(tmp_path / "full", "full", stage1=True).sentences_with_errors == 1
    assert summarise(tmp_path / "full", "full").sentences_with_errors == 2


def test_report_pairs_runs_and_splits_by_language(tmp_path: Path) -> None:
    """Per-language rows appear with two languages; the paired row counts discordant sentences."""
    from moot.apps.absa.evaluate import RunSummary, render_comparison
    from moot.apps.absa.metrics import aggregate, task_metrics
    from moot.apps.absa.types import SentenceRecord

    def run(name: str, labels: dict[str, str]) -> RunSummary:
        recs = [SentenceRecord(id=i, gold_label="positive", pred_label=p) for i, p in labels.items()]  # type: ignore[arg-type]
        return RunSummary(
            config=name, model="m", sentences=len(recs), calls_per_sentence=1, tokens_per_sentence=1,
            seconds_per_sentence=1, sentences_with_errors=0, metrics=aggregate(recs),
            by_lang={lang: task_metrics([r for r in recs if r.id[:2] == lang]) for lang in ("en", "ko")},
            label_right={r.id: r.pred_label == r.gold_label for r in recs},
        )  # fmt: skip

    a = run("a", {"en-1": "positive", "en-2": "negative", "ko-1": "positive", "ko-2": "positive"})
    b = run("b", {"en-1": "negative", "en-2": "positive", "ko-1": "negative", "ko-2": "positive"})
    table = render_comparison([a, b])
    assert "| sentence-label accuracy (en / ko) | 50.0% / 100.0% | 50.0% / 50.0% |" in table
    # b alone right on en-2; a alone right on en-1 and ko-1
    assert "| – | 1 / 2, p = 1.00 (4 paired) |" in table


def test_aspect_candidates_are_substrings_english_ngrams_and_korean_prefixes() -> None:
    from moot.apps.absa.pipeline import aspect_candidates

    en = aspect_candidates("The battery life, sadly, is short.")
    assert "battery life" in en and "battery" in en and "sadly" in en
    assert "life sadly" not in en  # not a substring: the comma is between them
    ko = aspect_candidates("배터리는 오래가는데 화면이 어두워요.")
    assert "배터리" in ko and "화면" in ko and "배터리는 오래가는데" not in ko
    assert all(c in "배터리는 오래가는데 화면이 어두워요." for c in ko)


def test_same_calls_compares_the_debates_as_run() -> None:
    """The shipped full config writes the patch defaults out; the no-override ablation leaves them
    to the defaults: the same calls, so the ablation can be derived from the full run."""
    from moot.apps.absa.pipeline import same_calls

    full = AbsaConfig.load(EXAMPLES / "full.yaml")
    assert same_calls(full, AbsaConfig.load(EXAMPLES / "abl_no_debate_override.yaml"))
    assert not same_calls(full, AbsaConfig.load(EXAMPLES / "abl_no_debate.yaml"))
    assert not same_calls(full, AbsaConfig.load(EXAMPLES / "panel.yaml"))
    reordered = full.model_copy(update={"debate": full.debate.model_copy(update={"order": ["tan", "epm", "cj"]})})
    assert not same_calls(full, reordered)
    two_rounds = full.model_copy(update={"debate": full.debate.model_copy(update={"rounds": 2})})
    assert not same_calls(full, two_rounds)
    assert not same_calls(full, full.model_copy(update={"max_tokens": 200}))
    # without a debate, the debate's settings make no call
    off = AbsaConfig(enable_debate=False)
    assert same_calls(off, off.model_copy(update={"debate": two_rounds.debate}))
