"""``moot absa eval``: a configuration of the pipeline over an annotated set, resumable, with the
seed 001 §9 metrics; and the comparison of several runs (the ablations) in one table."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from moot.apps.absa.metrics import AbsaMetrics, TaskMetrics, aggregate, found_pairs, task_metrics
from moot.apps.absa.pipeline import AbsaConfig, AbsaPipeline, AbsaResult, asked_fingerprint, rederive, same_calls
from moot.apps.absa.types import DATA_DIR, AspectTuple, SentenceLabel, SentenceRecord
from moot.files import first_error, read_text, text_lines
from moot.models.base import BaseChatModel
from moot.runlock import RunLock
from moot.scale.jobs import Executor, Job
from moot.stats import discordant, mcnemar_exact

DEFAULT_DATA = DATA_DIR / "absa-v1.jsonl"


class GoldAspect(BaseModel):
    term: str
    start: int = Field(alias="from")
    end: int = Field(alias="to")
    polarity: str


class AbsaItem(BaseModel):
    id: str
    lang: str = ""
    domain: str = ""
    text: str
    aspects: list[GoldAspect] = Field(default_factory=list)
    sentence_label: SentenceLabel
    phenomena: list[str] = Field(default_factory=list)

    def gold(self) -> list[AspectTuple]:
        return [
            AspectTuple(aspect_term=a.term, polarity=a.polarity, span=(a.start, a.end))  # type: ignore[arg-type]
            for a in self.aspects
        ]


def load_items(path: Path = DEFAULT_DATA) -> list[AbsaItem]:
    items = []
    lines = text_lines(read_text(path, "ABSA data file"))
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(AbsaItem.model_validate_json(line))
        except ValidationError as exc:
            err = first_error(exc)
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"{path}:{n}: {where + ': ' if where else ''}{err['msg']}") from None
    if not items:
        raise ValueError(f"{path} has no sentences")
    return items


def select(items: list[AbsaItem], n: int | None, seed: int = 0) -> list[AbsaItem]:
    """The first ``n`` of one seeded permutation (both languages and all domains mixed in)."""
    if n is not None and n > len(items):
        raise ValueError(f"--n {n} asks for more sentences than the data has ({len(items)})")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in order[: n if n is not None else len(items)]]


def record_of(item: AbsaItem, result: AbsaResult) -> SentenceRecord:
    debate = result.debate
    mapping = debate.mapping if debate is not None else None
    return SentenceRecord(
        id=item.id,
        gold_aspects=item.gold(),
        pred_aspects=[AspectTuple.from_sentiment(s) for s in result.moderator.final_aspects],
        gold_label=item.sentence_label,
        pred_label=result.moderator.final_label,
        mapping_stats=mapping[0] if mapping else None,
        mapping_fail_reasons=mapping[1] if mapping else None,
        override_stats=result.stage2.override.stats if result.stage2.override is not None else None,
    )


class RunLine(BaseModel):
    """One line of ``results.jsonl``: the record the metrics read and the whole pipeline result."""

    record: SentenceRecord
    lang: str = ""
    calls: int
    tokens: int
    elapsed_s: float
    errors: list[str]
    result: AbsaResult


class RunSummary(BaseModel):
    config: str
    model: str = ""
    sentences: int
    #: None for the Stage 1 column, which is read from a run whose cost covers every stage
    calls_per_sentence: float | None
    tokens_per_sentence: float | None
    seconds_per_sentence: float | None
    sentences_with_errors: int
    metrics: AbsaMetrics
    by_lang: dict[str, TaskMetrics] = Field(default_factory=dict)
    #: sentence id -> whether the final sentence label is the gold one (pairs runs in the report)
    label_right: dict[str, bool] = Field(default_factory=dict)
    #: sentence id -> the gold (aspect, polarity) pairs found, as ``term|polarity`` keys
    pairs_found: dict[str, list[str]] = Field(default_factory=dict)


class AbsaJob(Job[AbsaResult]):
    """The pipeline on one sentence, as data: what a Ray worker runs for ``--ray``."""

    config: AbsaConfig
    text: str

    async def execute(self, model: BaseChatModel) -> AbsaResult:
        return await AbsaPipeline(self.config, model).run(self.text)


async def run_eval(
    config: AbsaConfig,
    pipeline: AbsaPipeline,
    items: list[AbsaItem],
    out: Path,
    *,
    concurrency: int = 2,
    on_done: Callable[[int, int], None] | None = None,
    executor: Executor | None = None,
) -> RunSummary:
    """Run the pipeline on every item not already in ``out/results.jsonl`` (each line appended and
    flushed as it finishes: a killed run resumes), then write ``out/metrics.json``.
    ``on_done(saved, total)``: how many of ``items`` are saved, once before the first call when a
    resumed run already holds some, then as each finishes. With
    ``executor`` (Ray workers) the sentences run there, ``executor.capacity`` at once; this
    process still writes every line. The folder is locked while it runs
    (:class:`~moot.runlock.RunLock`): a second process on it is refused."""
    with RunLock.acquire(out):
        return await _run_eval(config, pipeline, items, out, concurrency, on_done, executor)


async def _run_eval(
    config: AbsaConfig,
    pipeline: AbsaPipeline,
    items: list[AbsaItem],
    out: Path,
    concurrency: int,
    on_done: Callable[[int, int], None] | None,
    executor: Executor | None,
) -> RunSummary:
    path, todo = _prepare(config, items, out, pipeline.model.name, asked_fingerprint(config))
    gate = asyncio.Semaphore(max(1, executor.capacity if executor is not None else concurrency))
    finished = len(items) - len(todo)
    if finished and on_done is not None:
        on_done(finished, len(items))  # a resumed run's saved sentences count from the start

    async def one(item: AbsaItem) -> None:
        nonlocal finished
        async with gate:
            if executor is None:
                result = await pipeline.run(item.text)
            else:
                result = (await executor.run(AbsaJob(config=config, text=item.text))).value
        line = RunLine(record=record_of(item, result), lang=item.lang, calls=result.calls,
                       tokens=result.prompt_tokens + result.completion_tokens, elapsed_s=result.elapsed_s,
                       errors=result.errors, result=result)  # fmt: skip
        _append(path, line.model_dump_json())
        finished += 1
        if on_done is not None:
            on_done(finished, len(items))

    await asyncio.gather(*(one(i) for i in todo))
    return finish(out, config.name, items)


def _prepare(
    config: AbsaConfig, items: list[AbsaItem], out: Path, model: str, asked: str
) -> tuple[Path, list[AbsaItem]]:
    """The run folder: ``config.json`` and ``run.json`` (the model, the fingerprint of what the
    agents are asked: :func:`asked_fingerprint`) name what its rows come from; a resume with
    another config, model or prompts is refused (its rows would mix), unless the folder holds no
    result yet (a command refused or stopped before its first sentence): then it is started
    afresh. A run from before the fingerprint was stored takes the current one."""
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "config.json"
    path = out / "results.jsonl"
    if not _lines(path):
        for name in ("config.json", "run.json", "metrics.json"):
            (out / name).unlink(missing_ok=True)
    held, wanted = (json.loads(meta.read_text()) if meta.exists() else None), config.model_dump(mode="json")
    if held is not None and held != wanted:
        changed = "; ".join(
            f"{k}: {held.get(k)!r} -> {wanted.get(k)!r}"
            for k in sorted({*held, *wanted})
            if held.get(k) != wanted.get(k)
        )
        raise ValueError(
            f"{out} holds a run of another config ({changed[:300]}): use another --out, or delete {out} to start over"
        )
    run = _run_meta(out)
    before = str(run.get("model", ""))
    if before and model and before != model:
        raise ValueError(f"{out} holds a run on {before}, not {model}: use another --out, or the same --model")
    if run.get("asked") and asked and run["asked"] != asked:
        raise ValueError(
            f"{out} was started with other prompts or schemas (moot changed since): finish it with the moot version "
            f"that started it, use another --out, or delete {out} to start over"
        )
    meta.write_text(json.dumps(config.model_dump(mode="json"), indent=2))
    (out / "run.json").write_text(json.dumps({"model": model, "asked": asked or run.get("asked", "")}))
    stored = [RunLine.model_validate_json(line) for line in _lines(path)]
    _check_data(out, stored, items)
    done = {run.record.id for run in stored}
    return path, [i for i in items if i.id not in done]


def _check_data(out: Path, stored: list[RunLine], items: list[AbsaItem]) -> None:
    """Refuse to resume over changed data: a stored sentence whose text or gold annotation is not
    the data's any more would keep its old result and be scored against the old gold."""
    wanted = {i.id: i for i in items}
    for run in stored:
        item = wanted.get(run.record.id)
        if item is None:
            continue
        changed = [
            what
            for what, same in (
                ("text", run.result.sentence == item.text),
                ("sentence label", run.record.gold_label == item.sentence_label),
                ("gold aspects", run.record.gold_aspects == item.gold()),
            )
            if not same
        ]
        if changed:
            raise ValueError(
                f"{out}: sentence {item.id} changed in the data since the run started ({', '.join(changed)}); its "
                f"stored result was asked and scored with the old one: restore the data, use another --out, or "
                f"delete {out} to start over"
            )


def run_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a ``moot absa eval`` run folder to read (it does not exist, it is a
    file, it holds no ``config.json``), in words that end with the fix; None when it is one."""
    fix = "give the folder a `moot absa eval --out` wrote"
    if not folder.exists():
        return f"{folder} does not exist; {fix}"
    if not folder.is_dir():
        return f"{folder} is a file, not a run folder; {fix}"
    if not (folder / "config.json").is_file():
        return f"{folder} is not a `moot absa eval` run (no config.json); {fix}"
    return None


def _run_meta(out: Path) -> dict[str, str]:
    meta = out / "run.json"
    return dict(json.loads(meta.read_text())) if meta.exists() else {}


def _run_model(out: Path) -> str:
    return str(_run_meta(out).get("model", ""))


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()


def finish(out: Path, name: str, items: list[AbsaItem]) -> RunSummary:
    summary = summarise(out, name, {i.id for i in items})
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    return summary


def derive_run(source: Path, config: AbsaConfig, items: list[AbsaItem], out: Path) -> RunSummary:
    """An ablation that differs from a finished run only after its last model call (the override
    off, other thresholds), computed from that run's stored results: the same calls, exactly
    paired, no new call. Refused when the configs would make different calls."""
    if (problem := run_folder_problem(source)) is not None:
        raise ValueError(f"--from {problem}")
    meta = source / "config.json"
    base = AbsaConfig.model_validate(json.loads(meta.read_text()))
    if not same_calls(base, config):
        raise ValueError(
            f"{config.name} makes other model calls than {base.name} (only the override and its thresholds may "
            "differ): run it with `moot absa eval` instead of --from"
        )
    with RunLock.acquire(out):
        return _derive(source, base, config, items, out)


def _derive(source: Path, base: AbsaConfig, config: AbsaConfig, items: list[AbsaItem], out: Path) -> RunSummary:
    path, _ = _prepare(config, items, out, _run_model(source), str(_run_meta(source).get("asked", "")))
    path.write_text("")
    thresholds = config.thresholds()
    wanted = {i.id: i for i in items}
    for line in _lines(source / "results.jsonl"):
        run = RunLine.model_validate_json(line)
        item = wanted.get(run.record.id)
        if item is None:
            continue
        result = rederive(run.result, config, thresholds)
        derived = run.model_copy(update={"record": record_of(item, result), "lang": item.lang, "result": result})
        _append(path, derived.model_dump_json())
    (out / "derived_from.json").write_text(json.dumps({"run": str(source), "config": base.name}))
    return finish(out, config.name, items)


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def stage1_record(run: RunLine) -> SentenceRecord:
    """What Stage 1 alone would have answered: ATSA's aspect sentiments and sentence label, before
    the validator, the debate, the reviews, the override and the moderator."""
    atsa = run.result.stage1.atsa
    return SentenceRecord(
        id=run.record.id,
        gold_aspects=run.record.gold_aspects,
        pred_aspects=[AspectTuple.from_sentiment(s) for s in atsa.aspect_sentiments],
        gold_label=run.record.gold_label,
        pred_label=atsa.sentence_label,
    )


#: How the Stage 1 agents' errors start (``AbsaPipeline._ask`` prefixes each with the agent).
STAGE1_AGENTS = ("ATE:", "ATSA:", "Validator:")


def summarise(out: Path, name: str, ids: set[str] | None = None, stage1: bool = False) -> RunSummary:
    """A run's metrics and cost; with ``stage1``, the metrics of its Stage 1 answers alone (no
    call: read from the stored results; no cost of its own: the run's covers every stage)."""
    runs = [RunLine.model_validate_json(line) for line in _lines(out / "results.jsonl")]
    if ids is not None:
        runs = [r for r in runs if r.record.id in ids]
    records = [stage1_record(r) if stage1 else r.record for r in runs]
    n = max(len(runs), 1)
    langs = sorted({r.lang for r in runs if r.lang})
    return RunSummary(
        config=f"stage 1 only (of {name})" if stage1 else name,
        model=_run_model(out),
        sentences=len(runs),
        calls_per_sentence=None if stage1 else sum(r.calls for r in runs) / n,
        tokens_per_sentence=None if stage1 else sum(r.tokens for r in runs) / n,
        seconds_per_sentence=None if stage1 else sum(r.elapsed_s for r in runs) / n,
        sentences_with_errors=sum(1 for r in runs if any(not stage1 or e.startswith(STAGE1_AGENTS) for e in r.errors)),
        metrics=aggregate(records),
        by_lang={lang: task_metrics([rec for r, rec in zip(runs, records, strict=True) if r.lang == lang])
                 for lang in langs},
        label_right={rec.id: rec.pred_label == rec.gold_label for rec in records},
        pairs_found={rec.id: found_pairs(rec.gold_aspects, rec.pred_aspects) for rec in records},
    )  # fmt: skip


SENTENCE_COLUMNS = (
    "config", "id", "lang", "gold_label", "pred_label", "stage1_label", "gold_pairs", "pairs_found",
    "stage1_pairs_found", "override_applied", "calls", "tokens", "errors",
)  # fmt: skip


def sentence_rows(out: Path, name: str) -> list[dict[str, str | int]]:
    """One row per sentence of a run (for ``moot absa report --csv``): labels, how many gold
    (aspect, polarity) pairs the run and its Stage 1 found, overrides, cost. No sentence text."""
    rows: list[dict[str, str | int]] = []
    for line in _lines(out / "results.jsonl"):
        run = RunLine.model_validate_json(line)
        rec, s1 = run.record, stage1_record(run)
        rows.append({
            "config": name, "id": rec.id, "lang": run.lang, "gold_label": rec.gold_label,
            "pred_label": rec.pred_label, "stage1_label": s1.pred_label, "gold_pairs": len(rec.gold_aspects),
            "pairs_found": len(found_pairs(rec.gold_aspects, rec.pred_aspects)),
            "stage1_pairs_found": len(found_pairs(s1.gold_aspects, s1.pred_aspects)),
            "override_applied": rec.override_stats.applied if rec.override_stats is not None else 0,
            "calls": run.calls, "tokens": run.tokens, "errors": len(run.errors),
        })  # fmt: skip
    return rows


def _paired(run: RunSummary, first: RunSummary) -> str:
    """Sentence-label correctness on the sentences both runs have, with McNemar's exact test."""
    only_run, only_first, n = discordant(run.label_right, first.label_right)
    if not n:
        return "no shared sentence"
    return f"{only_run} / {only_first}, p = {mcnemar_exact(only_run, only_first):.2f} ({n} paired)"


def _paired_pairs(run: RunSummary, first: RunSummary) -> str:
    """Gold (aspect, polarity) pairs found by one run and not the other, on the sentences both
    have, with McNemar's exact test over gold pairs (pairs of one sentence are not independent:
    read p as a guide)."""
    shared = run.pairs_found.keys() & first.pairs_found.keys()
    if not shared:
        return "no shared sentence"

    def found(s: RunSummary) -> dict[str, bool]:  # every gold pair either run found, keyed by sentence
        return {f"{i}|{p}": p in s.pairs_found[i] for i in shared
                for p in {*run.pairs_found[i], *first.pairs_found[i]}}  # fmt: skip

    only_run, only_first, _ = discordant(found(run), found(first))
    return f"{only_run} / {only_first}, p = {mcnemar_exact(only_run, only_first):.2f}"


def _f(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if pct else f"{x:.1f}"


def _n(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render_comparison(summaries: list[RunSummary]) -> str:
    """The ablation table: task metrics (per language too, and paired with the first run), cost,
    then the debate's mapping and override metrics."""
    head = "| metric | " + " | ".join(s.config for s in summaries) + " |"
    rule = "|---|" + "---|" * len(summaries)
    langs = sorted({lang for s in summaries for lang in s.by_lang})
    getters: list[tuple[str, Callable[[TaskMetrics], float | None]]] = [
        ("sentence-label accuracy", lambda t: t.sentence_accuracy),
        ("aspect-polarity F1", lambda t: t.aspect_polarity.f1),
    ]
    by_lang = [
        (f"{metric} ({' / '.join(langs)})",
         [" / ".join(_f(get(s.by_lang[lang])) if lang in s.by_lang else "–" for lang in langs) for s in summaries])
        for metric, get in getters
    ] if len(langs) > 1 else []  # fmt: skip
    paired = [
        ("sentence label vs first column: only this right / only first right, McNemar p",
         ["–", *(_paired(s, summaries[0]) for s in summaries[1:])]),
        ("gold aspect-polarity pairs vs first column: found only here / only by first, McNemar p",
         ["–", *(_paired_pairs(s, summaries[0]) for s in summaries[1:])]),
    ] if len(summaries) > 1 else []  # fmt: skip
    rows: list[tuple[str, list[str]]] = [
        ("sentences", [str(s.sentences) for s in summaries]),
        ("aspect-term F1", [_f(s.metrics.task.aspect_term.f1) for s in summaries]),
        ("aspect-term F1 (span overlap)", [_f(s.metrics.task.aspect_term_overlap.f1) for s in summaries]),
        ("aspect-polarity F1", [_f(s.metrics.task.aspect_polarity.f1) for s in summaries]),
        ("sentence-label accuracy", [_f(s.metrics.task.sentence_accuracy) for s in summaries]),
        *paired,
        *by_lang,
        ("calls / sentence", [_n(s.calls_per_sentence, 1) for s in summaries]),
        ("tokens / sentence", [_n(s.tokens_per_sentence, 0) for s in summaries]),
        ("seconds / sentence", [_n(s.seconds_per_sentence, 1) for s in summaries]),
        ("sentences with a stage error", [str(s.sentences_with_errors) for s in summaries]),
        ("debate mapping coverage", [_f(s.metrics.debate.debate_mapping_coverage) for s in summaries]),
        ("direct / fallback / none", [
            " / ".join(_f(x) for x in (s.metrics.debate.debate_mapping_direct_rate,
                                       s.metrics.debate.debate_mapping_fallback_rate,
                                       s.metrics.debate.debate_mapping_none_rate))
            for s in summaries]),
        ("override applied", [str(s.metrics.debate.debate_override_applied) for s in summaries]),
        ("override skipped: low signal / conflict / already confident", [
            f"{d.debate_override_skipped_low_signal} / {d.debate_override_skipped_conflict}"
            f" / {d.debate_override_skipped_already_confident}" for d in (s.metrics.debate for s in summaries)]),
    ]  # fmt: skip
    lines = [head, rule, *(f"| {name} | " + " | ".join(vals) + " |" for name, vals in rows)]
    models = sorted({s.model for s in summaries if s.model})
    if models:
        lines = [f"Model: {', '.join(models)}.", "", *lines]
    warnings = [f"- {s.config}: {w.message} ({w.tip})" for s in summaries for w in s.metrics.warnings]
    if warnings:
        lines += ["", "Warnings (thresholds in src/moot/data/absa/debate_thresholds.json):", *warnings]
    return "\n".join(lines)
