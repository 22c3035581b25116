"""``moot tune``'s run loop: the tuning run (growing by the votes the choice needs), the held-out run,
and the files it writes (``tune.json``, ``tune.md``, ``tuned.yaml``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moot.eval.loaded import as_loaded, load_run
from moot.eval.location import holds_run
from moot.eval.runner import ProgressFn, run_eval
from moot.eval.store import RunConfig, open_run
from moot.eval.tune.analyse import TuneReport, analyse_tune, candidate_scores
from moot.eval.tune.choice import CandidateScore, NeedVote, choose, held_out_labels
from moot.eval.tune.config import TuneConfig, check, make_split, write_part
from moot.eval.tune.markdown import render_markdown
from moot.eval.tune.tuned_file import tuned_file
from moot.models.base import BaseChatModel
from moot.models.pricing import PriceTable


async def run_tune(
    config: TuneConfig,
    out: Path,
    *,
    model: BaseChatModel | None = None,
    prices: PriceTable | None = None,
    concurrency: int = 4,
    on_progress: ProgressFn | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TuneReport:
    """Tune, confirm and write ``tune.json``, ``tune.md`` and ``tuned.yaml`` in ``out`` (resumable:
    the same command goes on where it stopped). ``on_phase`` hears "tuning" and "held out" as each
    part's run begins (``on_progress`` then counts that run's results)."""
    items = check(config, prices)
    split = make_split(config, items, out)
    write_part(items, split.tuning, out / "tuning.jsonl")
    write_part(items, split.held_out, out / "holdout.jsonl")

    def part(name: str, protocols: list[str]) -> RunConfig:
        if name == "tuning" and config.tuning_n is not None:
            # The dataset's own first N items, asked exactly as a `moot eval -n N --seed S` run asked
            # them: that run's request cache (--cache-from) serves every request it made.
            return RunConfig(dataset=config.data, n=config.tuning_n, seed=config.seed, protocols=protocols,
                             model=config.model, max_tokens=config.max_tokens, labels=config.labels)  # fmt: skip
        return RunConfig(dataset=str(out / f"{name}.jsonl"), protocols=protocols, model=config.model,
                         max_tokens=config.max_tokens, labels=config.labels)  # fmt: skip

    caches = [Path(c) for c in config.cache_from]
    tuning_labels = list(config.candidates)
    added: list[str] = _votes_added(out / "tuning", tuning_labels)
    if on_phase is not None:
        on_phase("tuning")
    while True:
        store = await run_eval(part("tuning", tuning_labels + added), out / "tuning", concurrency=concurrency,
                               model=model, on_progress=on_progress, cache_from=caches)  # fmt: skip
        try:
            choice = choose(candidate_scores(as_loaded(store), tuning_labels + added, prices), config)
        finally:
            store.close()
        if not isinstance(choice, NeedVote):
            break
        # The vote at a candidate's budget, on the same tuning items (it shares their samples).
        added.append(choice.label)
    if on_phase is not None:
        on_phase("held out")
    # A folder tuned before keeps what its held-out run holds (and the report says it was seen).
    held = list(dict.fromkeys(_stored_protocols(out / "holdout") + held_out_labels(choice.label, choice.comparison)))
    store = await run_eval(part("holdout", held), out / "holdout", concurrency=concurrency, model=model,
                           on_progress=on_progress)  # fmt: skip
    store.close()
    report, chosen_score = analyse_tune(config, split, load_run(out / "tuning"), load_run(out / "holdout"), prices)
    report = _dated_as_before(report, out / "tune.json")
    write_outputs(report, chosen_score, out)
    return report


def _dated_as_before(report: TuneReport, previous: Path) -> TuneReport:
    """The report, keeping the date of the one already written when nothing else in it changed (a
    finished tune run again): the evidence's date is when it was made, not when it was last read."""
    try:
        before = TuneReport.model_validate_json(previous.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return report
    same = report.model_copy(update={"generated_at": before.generated_at})
    return same if same.model_dump_json() == before.model_dump_json() else report


def _votes_added(folder: Path, candidates: list[str]) -> list[str]:
    """The budget-matched votes an earlier run of this tune added to its tuning run (a resume asks
    for them again, so the run's config is the one it stored)."""
    return [p for p in _stored_protocols(folder) if p not in candidates]


def _stored_protocols(folder: Path) -> list[str]:
    """The protocols a part's run already holds (none before it first runs)."""
    if not holds_run(folder):
        return []
    with open_run(folder) as store:
        return list(store.config.protocols)


def write_outputs(report: TuneReport, tuning: CandidateScore, out: Path) -> None:
    (out / "tune.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
    (out / "tuned.yaml").write_text(tuned_file(report, tuning).to_yaml(), encoding="utf-8")
    (out / "tune.md").write_text(render_markdown(report), encoding="utf-8")
