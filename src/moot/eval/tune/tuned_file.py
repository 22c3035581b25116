"""``tuned.yaml``: the chosen protocol as a protocol file with its evidence, written through the one
typed model it is read through (:class:`moot.protocols.tuned.TunedFile`)."""

from __future__ import annotations

from typing import Any

from moot.eval.tune.analyse import TuneReport
from moot.eval.tune.choice import CandidateScore
from moot.protocols.loader import load_protocol, names_file, protocol_data
from moot.protocols.tuned import TunedEvidence, TunedFile


def tuned_file(report: TuneReport, tuning: CandidateScore) -> TunedFile:
    """The chosen protocol as a protocol file (a preset and its parameters) with its evidence."""
    evidence = TunedEvidence(
        chosen=report.chosen, model=report.config.model, objective=report.config.objective,
        budget=str(report.config.budget) if report.config.budget is not None else None, reason=report.reason,
        tuning_accuracy=tuning.accuracy, tuning_items=tuning.items, held_out=report.held_out,
        data=report.split.data, data_fingerprint=report.split.data_fingerprint, date=report.generated_at,
        protocol=file_protocol(report.chosen),
    )  # fmt: skip
    return TunedFile.of(evidence, report.config.max_tokens)


def file_protocol(chosen: str) -> dict[str, Any] | None:
    """A choice that names a protocol file: its whole spec, its budget included, so that the tuned
    file runs where the file is not, as it was tuned; None for a preset's label."""
    return protocol_data(load_protocol(chosen)) if names_file(chosen) else None


def tuned_protocol(report: TuneReport, tuning: CandidateScore) -> dict[str, Any]:
    """``tuned.yaml``'s content as YAML data (:func:`tuned_file`)."""
    return tuned_file(report, tuning).document()
