"""``moot eval export``: every item's result under every protocol, one row each, as CSV or JSON lines.

The rows are what a reader needs to recompute the report without moot: the item, its gold answer,
each protocol's final answer and the answer read from it, whether it is right (and its expected
correctness over tie-breaks, when the decision was a tie), the calls and the tokens it cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel

from moot.eval.analysis import tie_outcomes
from moot.eval.loaded import LoadedRun, as_loaded
from moot.eval.store import RunStore
from moot.files import csv_text


class ExportRow(BaseModel):
    item_id: str
    gold: str
    protocol: str
    status: str
    final_answer: str | None
    extracted: str | None
    correct: bool
    #: Correctness in expectation over tie-breaks (equal to ``correct`` unless the decision tied).
    expected_correct: float
    tie: bool
    calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str | None
    #: Why it failed (None: it did not).
    error: str | None = None


def export_rows(run: RunStore | LoadedRun) -> Iterator[ExportRow]:
    """The run's rows, item by item in the run's order, protocols in the run's order."""
    store = as_loaded(run)
    items = {i.id: i for i in store.items()}
    per_protocol = {}
    for label in store.config.protocols:
        results = {r.item_id: r for r in store.results(label)}
        per_protocol[label] = (results, tie_outcomes(store, label, items, results))
    for item_id, item in items.items():
        for label, (results, ties) in per_protocol.items():
            r = results.get(item_id)
            if r is None:
                continue
            expected, tie = ties[item_id]
            # A result recorded before its row kept why the debate stopped (20 of the committed ARC
            # store's): its transcript says it.
            stop = r.stop_reason
            if stop is None and (transcript := store.transcript(label, item_id)) is not None:
                stop = transcript.stop_reason
            yield ExportRow(
                item_id=item_id, gold=item.answer, protocol=label, status=r.status, final_answer=r.final_answer,
                extracted=r.extracted, correct=r.correct, expected_correct=expected,
                tie=tie, calls=r.calls, cached_calls=r.cached_calls,
                prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens, stop_reason=stop,
                error=r.error if r.status == "failed" else None,
            )  # fmt: skip


def render_export(store: RunStore | LoadedRun, fmt: Literal["csv", "jsonl"]) -> str:
    rows = list(export_rows(store))
    if fmt == "jsonl":
        return "".join(row.model_dump_json() + "\n" for row in rows)
    # Formula cells neutralised as every CSV moot writes (OWASP's CSV injection: moot.files.csv_text).
    return csv_text(list(ExportRow.model_fields), (row.model_dump() for row in rows))
