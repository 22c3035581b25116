"""Protocols from YAML (specs, presets with parameters, the seeds' format) and the CLI around them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core import Engine, ProtocolSpec
from moot.core.types import load_result
from moot.protocols import get_preset, preset_names
from moot.protocols.loader import (
    ProtocolFileError,
    dump_protocol,
    load_protocol,
    load_protocol_file,
    load_run_file,
    resolve_protocol,
)

runner = CliRunner()


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_dumps_to_yaml_that_loads_back(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_protocol(get_preset(name)))
    assert load_protocol(path) == get_preset(name)


def test_a_preset_with_parameters_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("preset: society-of-minds\nwith: {agents: 5, rounds: 3}\nstop: 'max_rounds(3) | consensus(1)'\n")
    spec = load_protocol(path)
    assert len(spec.participants) == 5 and spec.rounds == 3 and spec.stop is not None
    assert spec.stop.expr() == "max_rounds(3) | consensus(1)"
    path.write_text("preset: society-of-minds\nwith: {agentz: 5}\n")
    with pytest.raises(ProtocolFileError, match="agentz"):
        load_protocol(path)


SEED_001 = """\
enable_debate: true
pipeline:
  debate:
    rounds: 1
    order: ["critic", "analyst"]
    personas:
      analyst: {name: "분석가 패널", role: "analyst", goal: "neutral judgement", stance: "neutral", style: "dry"}
      critic: {name: "비평가 패널", role: "critic", goal: "critical reading", stance: "con", style: "sharp"}
"""

SEED_002_CONDITIONS = """\
pipeline:
  debate:
    enabled: true
    max_rounds: 3
    injection:
      strategy: "during_debate_one_shot"
      trigger: "deadlock_obs2of4"
      allow_multiple_injections: false
"""


@pytest.mark.req("S001-PERSONAS", "S001-ORDER", "S002-ORDER", "S002-CONFIG")
def test_the_seeds_experiment_format_loads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(SEED_001, encoding="utf-8")
    spec, experiment = load_protocol_file(path)
    assert experiment is not None and experiment.enable_debate is True
    assert spec.rounds == 1 and [st.speakers for st in spec.round_stages()] == [["critic", "analyst"]]
    assert spec.participant("analyst").persona.name == "분석가 패널"
    assert spec.participant("critic").persona.stance == "con"
    cond = tmp_path / "conditions.yaml"
    cond.write_text(SEED_002_CONDITIONS)
    _, conditions = load_protocol_file(cond)
    assert conditions is not None and conditions.pipeline.debate.injection is not None
    assert conditions.pipeline.debate.injection.trigger == "deadlock_obs2of4"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "pipeline:\n  debate:\n    roundz: 2\n",
            "unknown key 'roundz' in pipeline.debate; it may have enabled, rounds",
        ),
        (
            "pipeline:\n  debate:\n    personas: {a: {name: A, rol: x}}\n",
            "unknown key 'rol' in pipeline.debate.personas.a; it may have name, role,",
        ),
        ("preset: vote\ndecision: {kind: vote, wieghted: true}\n", "unknown key 'wieghted' in decision.vote;"),
        ("enable_debate: true\nmystery: 1\n", "unknown key 'mystery'"),
        ("name: x\nparticipants: [{id: a, persona: {name: A}}]\nroundz: 2\n", "unknown key 'roundz'"),
        ("pipeline:\n  debate:\n    order: [nobody]\n", "names nobody"),
        ("- just\n- a list\n", "holds a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
        ("preset: nonesuch\n", "no protocol preset named 'nonesuch'"),
        ("preset: society-of-minds\nwith: {rounds: true}\n", "preset society-of-minds: rounds takes int, not true"),
        ("name: x\nparticipants: [{id: a, persona: {name: A}}]\nstop: 'forever()'\n", "unknown stop condition"),
        # (a NaN would have gone to the backend as null: its default temperature, silently)
        (
            "name: x\nparticipants: [{id: a, persona: {name: A}}]\ntemperature: .nan\n",
            "temperature: Input should be a finite",
        ),
        ("name: x\nparticipants: [{id: a, persona: {name: A}, temperature: .inf}]\n", "participants.0.temperature"),
    ],
)
def test_bad_files_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProtocolFileError) as info:
        load_protocol(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_json_protocol_file_that_does_not_parse_is_not_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"preset": "vote",\n "with": {"k": 3,}\n')
    with pytest.raises(ProtocolFileError, match=r"bad\.json is not valid JSON: "):
        load_protocol(path)


def test_cli_lists_shows_and_runs_protocols(tmp_path: Path) -> None:
    listed = runner.invoke(app, ["protocols"])
    assert listed.exit_code == 0 and all(n in listed.output for n in ("panel", "society-of-minds", "mad"))
    shown = runner.invoke(app, ["protocols", "show", "vote"])
    assert shown.exit_code == 0
    path = tmp_path / "vote.yaml"
    path.write_text(shown.output)
    assert load_protocol(path) == get_preset("vote")
    script = tmp_path / "replies.json"
    script.write_text(
        json.dumps([{"reasoning": "r", "answer": a, "confidence": 0.5} for a in ["7", "8", "7", "7", "9"]])
    )
    out = tmp_path / "r.json"
    result = runner.invoke(
        app, ["debate", "3+4?", "--protocol", str(path), "-m", f"scripted:{script}", "--json", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "7"
    saved = load_result(out)
    assert saved.protocol == "vote" and saved.llm_calls == 5 and saved.decision is not None


def test_cli_protocol_errors_are_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["debate", "Q", "--protocol", "nonesuch"])
    assert result.exit_code == 2 and "no protocol preset named 'nonesuch'" in result.output
    # a misspelt name gets the suggestion a protocol file's does (moot protocols show gave none)
    for argv in (["debate", "Q", "--protocol", "panal"], ["protocols", "show", "panal"]):
        result = runner.invoke(app, argv, env={"COLUMNS": "300"})
        assert result.exit_code == 2 and "no protocol preset named 'panal' (did you mean 'panel'?)" in result.output
    result = runner.invoke(app, ["debate", "Q", "--protocol", "vote", "--no-synthesis"])
    assert result.exit_code == 2 and "--no-synthesis only applies" in result.output
    result = runner.invoke(app, ["protocols", "show", "nonesuch"])
    assert result.exit_code == 2


def test_cli_overrides_apply_to_a_preset(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "4", "confidence": 0.5}] * 3))
    out = tmp_path / "r.json"
    result = runner.invoke(
        app,
        ["debate", "2+2?", "-p", "society-of-minds", "-r", "1", "--max-tokens", "77", "-m", f"scripted:{script}",
         "--json", str(out), "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = load_result(out)
    assert len(saved.rounds) == 1 and saved.llm_calls == 3 and saved.final_answer == "4"
    assert ProtocolSpec  # the module's public type


def test_a_whole_run_from_yaml(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(
        json.dumps([{"reasoning": "r", "answer": a, "confidence": 0.5} for a in ["408", "407", "408", "408", "408"]])
    )
    run = tmp_path / "run.yaml"
    run.write_text(
        f"protocol: society-of-minds\nwith: {{agents: 5, rounds: 1}}\nmodel: scripted:{script}\n"
        "question: What is 17 * 24?\ncontext: [a passage, {text: another, source: doc.md}]\nreference: '408'\n"
    )
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["run", str(run), "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "408"
    saved = load_result(out)
    assert saved.llm_calls == 5 and saved.task.reference == "408" and saved.task.context[1].source == "doc.md"
    assert saved.dynamics is not None and saved.dynamics.rounds[0].correct == 4


def test_a_run_file_may_point_at_a_protocol_file_or_inline_one(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "yes", "confidence": 0.9}]))
    (tmp_path / "one.yaml").write_text(dump_protocol(get_preset("single")))
    (tmp_path / "run.yaml").write_text(f"protocol: one.yaml\nmodel: scripted:{script}\nquestion: Is it?\n")
    result = runner.invoke(app, ["run", str(tmp_path / "run.yaml"), "-q"])
    assert result.exit_code == 0 and result.output.strip() == "yes", result.output
    inline = dump_protocol(get_preset("single")).replace("\n", "\n  ")
    script2 = tmp_path / "replies2.json"  # a scripted: model is resolved once per process, replies and all
    script2.write_text(script.read_text())
    (tmp_path / "run2.yaml").write_text(f"protocol:\n  {inline}\nmodel: scripted:{script2}\nquestion: Is it?\n")
    result = runner.invoke(app, ["run", str(tmp_path / "run2.yaml"), "-q"])
    assert result.exit_code == 0 and result.output.strip() == "yes", result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("question: Q\nmodle: x\n", "unknown key 'modle'"),
        (
            "question: Q\ncontext: [{text: a passage, src: notes.md}]\n",
            "unknown key 'src' in context.0; it may have text, source",
        ),
        ("protocol: vote\nwith: {kk: 3}\nquestion: Q\n", "preset vote has no parameter kk; its parameters: k,"),
        ("protocol: nothere.yaml\nquestion: Q\n", "does not exist"),
        ("model: x\n", "question"),
        # what the run file got wrong is named with the file: "with: only applies to a preset name" named neither
        # the file nor the fix, and a misspelt preset did not say it came from the run file
        (
            "protocol: mine.yaml\nwith: {rounds: 2}\nquestion: Q\n",
            "run.yaml: with: applies to a preset name, and protocol 'mine.yaml' is not one: give the parameters in",
        ),
        ("protocol: socety-of-minds\nquestion: Q\n", "run.yaml: protocol: no protocol preset named 'socety-of-minds'"),
        # with parameters, a misspelt preset was blamed on the with: (an outside trial)
        (
            "protocol: society-of-mind\nwith: {rounds: 2}\nquestion: Q\n",
            "run.yaml: protocol: no protocol preset named 'society-of-mind' (did you mean 'society-of-minds'?)",
        ),
        # a model for a participant the protocol does not have named neither the file nor the ones it has
        (
            "protocol: society-of-minds\nwith: {agents: 3}\nmodels: {agent9: x}\nquestion: Q\n",
            "run.yaml: models: unknown participant(s) or role(s): agent9; society-of-minds has participant ids agent1, "
            "agent2, agent3 and role solver: key each model by one of them (or by decision",
        ),
        (
            "protocol: moderated\nmodels: {moderater: x, proponent: y}\nquestion: Q\n",
            "run.yaml: models: unknown participant(s) or role(s): moderater; moderated has participant ids proponent, "
            "opponent, moderator: key each model by one of them",
        ),
    ],
)
def test_bad_run_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "run.yaml").write_text(text)
    (tmp_path / "mine.yaml").write_text("preset: society-of-minds\n")
    result = runner.invoke(app, ["run", str(tmp_path / "run.yaml")], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


def test_a_run_files_models_route_by_participant_id_role_or_decision(tmp_path: Path) -> None:
    """What the message offers is what the engine routes: ids, roles and ``decision`` all load."""
    from moot.protocols.loader import routing_problem

    run = tmp_path / "run.yaml"
    run.write_text(
        "protocol: society-of-minds\nmodels: {solver: scripted:a.json, agent2: scripted:b.json, decision: x}\n"
        "question: Q\n"
    )
    run_file = load_run_file(run)
    spec = run_file.spec()
    assert routing_problem(spec, ["solver", "agent2", "decision"]) is None
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text('["a reply"]')
    Engine(spec, models={k: v for k, v in run_file.models.items() if k != "decision"})  # the engine agrees
    with pytest.raises(ProtocolFileError, match=r"^" + re.escape(f"{run}: models: unknown participant(s)")):
        run.write_text("protocol: single\nmodels: {agent2: x}\nquestion: Q\n")
        load_run_file(run).spec()


@pytest.mark.parametrize(
    "text",
    [
        "name: x\nparticipants: [{id: a, persona: {name: A}}]\nbogus: 1\n",
        "preset: society-of-minds\nwith: {agents: 3}\nbogus: 1\n",
    ],
    ids=["spec", "preset"],
)
def test_an_unknown_key_in_a_protocol_file_lists_every_key_the_file_may_have(tmp_path: Path, text: str) -> None:
    """The list left out ``preset`` and ``with`` (the README's own example uses them) and ``tuned``
    (moot tune's evidence): a protocol file may hold all of them beside a spec's keys."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProtocolFileError) as info:
        load_protocol(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown key 'bogus'; it may have name, description, participants,")
    listed = message.split("it may have ", 1)[1].removesuffix("; remove it or check its spelling").split(", ")
    assert {"preset", "with", "tuned", "stop", "budget", "decision"} <= set(listed)
    assert len(listed) == len(set(listed)), listed  # each once
    # every key listed is one a protocol file may hold: the README's example, a tuned file
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("```yaml\npreset: society-of-minds\n", 1)[1].split("```", 1)[0]
    path.write_text("preset: society-of-minds\n" + example)
    assert len(load_protocol(path).participants) == 5
    # below the top level only that object's own keys
    path.write_text("preset: vote\ndecision: {kind: vote, wieghted: true}\n")
    with pytest.raises(ProtocolFileError) as nested:
        load_protocol(path)
    assert "in decision.vote; it may have kind," in str(nested.value) and "preset" not in str(nested.value)


# ------------------------------------------------------- issue 28: one rule for every input object


def _input_models() -> list[type]:
    from moot.apps.absa.pipeline import AbsaConfig
    from moot.apps.absa.types import OverrideThresholds
    from moot.apps.arbitration.types import AgentReport, ArbitrationConfig
    from moot.batch.items import BatchItem
    from moot.models.pricing import PriceTable
    from moot.protocols.loader import InputPassage, RunFile, SeedExperiment
    from moot.quality.agreement import LabelledDebate

    return [
        BatchItem, RunFile, InputPassage, ProtocolSpec, SeedExperiment, AgentReport, ArbitrationConfig,
        AbsaConfig, OverrideThresholds, PriceTable, LabelledDebate,
    ]  # fmt: skip


def test_every_object_of_every_input_file_refuses_unknown_keys_at_every_depth() -> None:
    """Context files, batch lines, run and protocol YAML, arbitration reports and configs, ABSA
    configs, price files, labelled debates: every model they are read into, and every model nested
    in one, forbids extra keys (a passage's ``src`` was kept, and the source lost)."""
    from moot.protocols.loader import _models_in

    seen: set[type] = set()
    lenient: list[str] = []
    todo = _input_models()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if model.model_config.get("extra") != "forbid":
            lenient.append(model.__qualname__)
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    assert lenient == []
    assert len(seen) > 20  # the walk went deep (personas, decisions, findings, citations, thresholds...)


def test_eval_jsonl_and_arbitration_reports_refuse_an_unknown_key_by_name(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from moot.apps.arbitration.types import AgentReport
    from moot.eval.datasets import DatasetError, load_jsonl

    data = tmp_path / "mine.jsonl"
    data.write_text('{"question": "2+2?", "answer": 4}\n{"question": "3+3?", "answer": 6, "contxt": "typo"}\n')
    with pytest.raises(DatasetError, match=r"mine.jsonl:2: unknown key 'contxt'; a line may have answer, choices"):
        load_jsonl(data)
    note = {"contradiction_id": "c1", "action": "flagged", "note": "n", "reviewer": "me"}
    finding = {"metric": "m", "value": 1.0, "confidence": 0.5, "arbitration": note}
    with pytest.raises(ValidationError, match="reviewer"):
        AgentReport.model_validate({"agent": "a", "findings": [finding]})


def test_a_preset_with_parameters_is_named_as_eval_and_tune_name_it(tmp_path: Path) -> None:
    """``-p "weighted-vote(signal=answer_prob,softmax_t=0.2)"`` (the form a tune report prints) and
    ``vote@5`` work wherever a protocol is named, as the preset called with those parameters."""
    assert resolve_protocol("vote@3") == get_preset("vote", k=3)
    assert resolve_protocol("mad(rounds=2)") == get_preset("mad", rounds=2)
    # numbers in decimal only: 08 was read as octal and refused as "more than 4,300 digits"; it is 8
    assert resolve_protocol("mad(rounds=08)") == get_preset("mad", rounds=8)
    assert resolve_protocol("vote(models=[openai:a, openai:b], k=2)") == get_preset(
        "vote", models=["openai:a", "openai:b"], k=2
    )
    assert resolve_protocol(" weighted-vote(signal=answer_prob, softmax_t=0.2)") == get_preset(
        "weighted-vote", signal="answer_prob", softmax_t=0.2
    )
    for bad, message in (
        ("vote@uab(budget=2)", "use it with `moot batch` or `moot eval`"),
        ("vote@auto", "within a `moot eval` run"),
        ("vote@3(k=2)", "gives the sample count twice"),
        ("vote@0", "at least 1 sample"),
        ("mad@3", "@K applies to vote only"),
        ("mad(rouns=2)", "preset mad has no parameter rouns"),
        ("weighted-vote(signal=nope)", "parameter signal = 'nope'"),
        ("nonesuch(a=1)", "no protocol preset named 'nonesuch'"),
        ("mad(rounds)", "is not key=value"),
        ("mad(rounds=[)", "rounds='[' is not a value"),
        # what a request could send: each was a frozen server (aliases expanding to gigabytes) or a 500
        ("vote(x=[&a [0,0], &b [*a,*a]])", "anchors and aliases (& and *) are not allowed"),
        ("vote(x=*a)", "anchors and aliases"),
        ("vote@" + "9" * 5000, "a vote takes at most 1,000 samples"),
        ("mad(rounds=" + "9" * 5000 + ")", "rounds= is a number of more than 4,300 digits"),
        ("vote(x=" + "[" * 3000 + "]" * 3000 + ")", "is refused: lists nest deeper than 8 levels"),
        # block-style nesting too (a RecursionError at 400 levels), and explicit tags
        ("mad(rounds=" + "- " * 400 + "1)", "is refused: lists nest deeper than 8 levels"),
        ("mad(rounds=!!int 5)", "tags (! and !!) are not allowed"),
    ):
        with pytest.raises(ProtocolFileError, match=re.escape(message)):
            resolve_protocol(bad)
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": a, "confidence": 0.5} for a in "787"]))
    out = tmp_path / "r.json"
    done = runner.invoke(app, ["debate", "3+4?", "-p", "vote@3", "-m", f"scripted:{script}", "--json", str(out), "-q"])
    assert done.exit_code == 0 and done.output.strip() == "7", done.output
    assert load_result(out).llm_calls == 3
    shown = runner.invoke(app, ["protocols", "show", "mad(rounds=3)"])
    assert shown.exit_code == 0 and "rounds: 3" in shown.output
    run = tmp_path / "run.yaml"
    run.write_text(f"protocol: vote@3\nmodel: scripted:{script}\nquestion: 3+4?\n")
    assert load_run_file(run).spec() == get_preset("vote", k=3)


def test_a_lone_surrogate_is_named_at_its_own_line_not_at_an_escaped_backslash(tmp_path: Path) -> None:
    """The line search found the first textual \\ud83d, an escaped backslash's text too (a review). The
    lone one is on line 4; the half of a joined pair is not it either (in YAML too, whose reader gave an
    escaped pair as two halves: an emoji written so was refused)."""
    path = tmp_path / "p.yaml"
    path.write_text(
        'name: "x \\ud83d\\ude00"\n'
        'description: "a literal \\\\ud83d"\n'
        "participants:\n"
        '  - {id: a, persona: {name: "A \\ud83d"}}\n'
    )
    with pytest.raises(ProtocolFileError, match=r"p\.yaml', line 4: participants\[0\]\.persona\.name: contains a lone"):
        load_protocol(path)
    path.write_text('name: "x \\ud83d\\ude00"\nparticipants: [{id: a, persona: {name: A}}]\n')
    assert load_protocol(path).name == "x \U0001f600"
    from moot.files import InputFileError, read_json

    data = tmp_path / "d.json"
    data.write_text('{"a": "\\ud83d\\ude00",\n "b": "\\\\ud83d",\n "c": "\\ud83d"}')
    with pytest.raises(InputFileError, match=r"d\.json', line 3: c: contains a lone"):
        read_json(data)


def test_a_long_run_of_backslashes_does_not_stall_the_lone_surrogate_search(tmp_path: Path) -> None:
    """The escape search read a run of backslashes again from each one in it: 60 KB of them before a
    lone surrogate took 13 s to refuse, 600 KB would take minutes (an outside attack, session 38). It
    starts at a run's first backslash only. (The bound is generous: only the old square trips it.)"""
    import time

    from moot.files import InputFileError, read_json

    data = tmp_path / "evil.json"
    data.write_text('{"description": "' + "\\\\" * 100_000 + '",\n "note": "\\udfff"}')
    started = time.monotonic()
    with pytest.raises(InputFileError, match=r"evil\.json', line 2: note: contains a lone"):
        read_json(data)
    assert time.monotonic() - started < 30


def test_a_preset_file_that_changes_the_format_is_named_by_its_file_not_the_preset(tmp_path: Path) -> None:
    """A society-of-minds with a judge's selection was saved as "society-of-minds", "majority vote": its
    transcripts could not be told from the preset's (an outside trial's, session 37). A budget alone
    leaves it the preset, and a name given is kept."""
    from moot.protocols.loader import load_protocol

    variant = tmp_path / "mine.yaml"
    variant.write_text("preset: society-of-minds\ndecision: {kind: select, mode: judge}\n", encoding="utf-8")
    spec = load_protocol(variant)
    assert spec.name == "mine" and spec.description == "society-of-minds with decision changed (mine.yaml)"
    budgeted = tmp_path / "budgeted.yaml"
    budgeted.write_text("preset: society-of-minds\nbudget: {max_calls: 9}\n", encoding="utf-8")
    assert load_protocol(budgeted).name == "society-of-minds"
    named = tmp_path / "named.yaml"
    named.write_text("preset: society-of-minds\nname: som-judged\ndecision: {kind: select}\n", encoding="utf-8")
    assert load_protocol(named).name == "som-judged"
    # An inline protocol (a request's, a run plan's) has no file to be named by: the preset's name stays.
    from moot.protocols.loader import load_protocol_data

    inline, _ = load_protocol_data({"preset": "mad", "rounds": 2}, Path("protocol"))
    assert inline.name == "mad"
