"""A run's config, and whether a folder's run is this command's: made by the same command (its
kind), with the same config (resumed), or one it may grow (more items, more protocols); else refused
naming the difference. :mod:`moot.eval.store` applies these when it opens a run."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from moot.eval.location import DB_NAME


class RunConfig(BaseModel):
    """What decides a run's results. Re-running with the same config resumes; a different one is
    refused. (How many items run at once is not part of it: it changes speed, not results.)"""

    dataset: str
    subject: str | None = None
    n: int | None = None
    seed: int = 0
    protocols: list[str]
    model: str
    max_tokens: int | None = None
    timeout_s: float | None = None
    #: The label set of a JSONL file's answers, when given with ``--labels``.
    labels: list[str] | None = None
    #: ``--seed-stride K``: the item at position j of the run's item order has every participant's
    #: seed shifted by K x j (seeds 1-3 on the first item, 4-6 on the second with K = 3), so that no
    #: protocol rides on one draw of round 1. Every protocol of an item is shifted alike, so the
    #: samples they share are still one request each. 0: the seeds the protocols name.
    seed_stride: int = Field(default=0, ge=0)
    #: ``--skip N``: the run's items start after the first N of the seeded order (items earlier runs
    #: of the same ``--seed`` used), so that a new run is on items no run has seen.
    skip: int = Field(default=0, ge=0)


class RunConfigMismatch(Exception):
    pass


#: What each command's run is called in a message.
KIND_NAMES = {"eval": "an evaluation run", "batch": "a batch run"}


def kind_of(config: object) -> str:
    """Which command made a stored config: ``moot batch``'s says so (``kind``), ``moot eval``'s has no kind."""
    kind = config.get("kind") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) else "eval"


def grows(old: RunConfig, new: RunConfig, done: bool, held: int = 0) -> bool:
    """Only more items (a larger ``--n``; None is every item: an ``--n`` of at least the ``held``
    items of a run made without one asks no fewer), more protocols and/or the data read
    from another path: the run can be extended, and nothing it holds is redone. A moved data file
    (a copied run, or a tune folder whose parts name their own files) is the same data only if its
    items are: :meth:`moot.eval.store.RunStore.check_items` refuses it otherwise, before the new config is stored.
    Another path for a run that finished nothing (``done`` false) is a corrected command, which
    starts afresh instead."""
    if old == new or old.model_copy(update={"n": new.n, "protocols": new.protocols, "dataset": new.dataset}) != new:
        return False
    if old.dataset != new.dataset and not done:
        return False
    more_items = new.n is None or (new.n >= old.n if old.n is not None else held > 0 and new.n >= held)
    return more_items and set(old.protocols) <= set(new.protocols)


def describe_mismatch(folder: Path, old: BaseModel, new: BaseModel) -> str:
    a, b = old.model_dump(), new.model_dump()
    changes = "; ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k])
    return (
        f"{folder} already holds a run with a different config ({changes}). Re-run with the same options to "
        f"resume it, use another --out folder, or delete {folder / DB_NAME} to start over."
    )
