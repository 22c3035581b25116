"""A protocol ``moot tune`` chose, served as a model (``moot serve --tuned tuned.yaml``): as
``moot/auto`` and under its own label (``moot/weighted-vote(signal=answer_prob,softmax_t=0.2)``),
listed in ``GET /v1/models`` with the evidence ``moot tune`` wrote beside it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from moot.core.spec import ProtocolSpec
from moot.files import first_error, load_yaml, read_text
from moot.protocols.loader import ProtocolFileError, load_protocol_data
from moot.protocols.tuned import TunedEvidence, TunedFile, edited_protocol

#: The model name of the tuned protocol, whatever it is.
AUTO = "auto"


class TunedModel(BaseModel):
    """A ``tuned.yaml``: the protocol (an inline spec, as the file writes it) and its evidence."""

    model_config = ConfigDict(extra="forbid")

    #: The label ``moot tune`` chose, without spaces: the model's own name after ``moot/``.
    label: str
    #: The protocol file's content without its ``tuned:`` block (a preset and its parameters).
    protocol: dict[str, Any]
    evidence: TunedEvidence
    path: str

    def spec_data(self) -> dict[str, Any]:
        """A copy of the protocol for one request (the loader may change what it is given)."""
        return copy.deepcopy(self.protocol)

    def spec(self) -> ProtocolSpec:
        """The protocol it runs, as the loader reads the file (for the catalogues: a request's own
        spec is made from :meth:`spec_data` by the server's policy)."""
        spec, _ = load_protocol_data(self.spec_data(), Path(self.path))
        return spec

    def evidence_json(self) -> dict[str, Any]:
        """The evidence as JSON data (as the catalogues show it: a float JSON cannot hold is null)."""
        data: dict[str, Any] = json.loads(self.evidence.model_dump_json())
        return data

    def summary(self) -> str:
        """The evidence in one line, for ``GET /v1/models``."""
        e = self.evidence
        budget = f", budget {e.budget}" if e.budget else ""
        line = (
            f"{e.chosen}, chosen by moot tune for {e.model} (objective {e.objective}{budget}) on {e.data}: "
            f"{100 * e.tuning_accuracy:.1f}% on {e.tuning_items} tuning items"
        )
        h = e.held_out
        if h is None:
            return line + "; not confirmed on held-out items"
        if h.seen_before:
            line += "; not a fresh confirmation (its held-out items had been used by an earlier tune)"
        if (
            h.baseline is None
            or h.baseline_accuracy is None
            or h.diff is None
            or h.diff_ci_low is None
            or h.diff_ci_high is None
        ):
            return (
                line + f"; held out: {100 * h.accuracy:.1f}% [{100 * h.ci_low:.1f}, {100 * h.ci_high:.1f}] "
                f"on {h.items} items"
            )
        return line + (
            f"; held out: {100 * h.accuracy:.1f}% [{100 * h.ci_low:.1f}, {100 * h.ci_high:.1f}] on {h.items} items, "
            f"{100 * h.diff:+.1f} points [{100 * h.diff_ci_low:+.1f}, {100 * h.diff_ci_high:+.1f}] against "
            f"{h.baseline} ({100 * h.baseline_accuracy:.1f}%)"
        )


def _runs(protocol: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The spec a protocol (as a file at ``path`` writes it) runs, its budget aside (a tuned file's own,
    which the evidence does not fix); None if it does not load."""
    try:
        spec, _ = load_protocol_data(copy.deepcopy(protocol), path)
    except ProtocolFileError:
        return None
    return spec.model_dump(mode="json", exclude={"budget"})


def _same_spec(a: dict[str, Any], b: dict[str, Any], path: Path) -> bool:
    runs = _runs(a, path)
    return runs is not None and runs == _runs(b, path)


def load_tuned(path: Path) -> TunedModel:
    """Read a ``tuned.yaml`` (a ``ValueError`` in one line naming the file and the fix otherwise): a
    protocol file with the ``tuned:`` block ``moot tune`` writes."""
    try:
        data = load_yaml(read_text(path, "--tuned"))
    except yaml.YAMLError as exc:
        raise ValueError(f"--tuned {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tuned"), dict):
        raise ValueError(
            f"--tuned {path}: no tuned: block; give the tuned.yaml moot tune wrote (a plain protocol file is served "
            "with POST /v1/debates and an inline protocol)"
        )
    try:
        tuned = TunedFile.from_data(data)
        # The protocol it runs, checked as any protocol file is (a preset's parameters included).
        load_protocol_data(copy.deepcopy(tuned.protocol()), path)
    except ValidationError as exc:
        try:  # the loader names what is wrong, with the file's path, as for any protocol file
            load_protocol_data(data, path)
        except ProtocolFileError as named:
            raise ValueError(f"--tuned {named}") from None
        first = first_error(exc)
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ValueError(f"--tuned {path}: {where}: {first['msg']}") from None
    except ProtocolFileError as exc:
        raise ValueError(f"--tuned {exc}") from None
    evidence, protocol = tuned.tuned, tuned.protocol()
    label = "".join(evidence.chosen.split())
    if evidence.protocol is not None:  # a protocol file's path: served by the file's name
        label = Path(label).name
    if not label or label == AUTO or "/" in label:
        raise ValueError(
            f"--tuned {path}: tuned.chosen {evidence.chosen!r} cannot name a model; give moot tune's label"
        )
    edited = edited_protocol(protocol, evidence, lambda a, b: _same_spec(a, b, path))
    if edited is not None:
        # Served under tuned.chosen's name with its evidence, it would claim numbers another protocol earned.
        raise ValueError(
            f"--tuned {path}: {edited}; run moot tune again for evidence on it, or restore the file moot tune "
            "wrote (an edited protocol is served through POST /v1/debates, without its tuned: block)"
        )
    return TunedModel(label=label, protocol=protocol, evidence=evidence, path=str(path))
