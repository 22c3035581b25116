"""The durable run: one SQLite file per run folder, written as results arrive.

Tables: ``meta`` (the run's config, resolved equal-budget sample counts), ``items`` (the selected
items, in order, so that a report never needs the data package again; a resume reads the data
once more, to check that it has not changed) and
``results`` (one row per protocol and item: score, cost, the whole transcript). Every result is
committed when it finishes, in WAL mode, so a killed run loses at most the items in flight.

A store opened to run (with a config) holds the folder's :class:`~moot.runlock.RunLock`: a second
process on the same folder is refused at once, naming the first one's pid.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

from moot.core.types import DebateQuality, DebateResult
from moot.eval.items import EvalItem
from moot.eval.location import DB_NAME, RunReadError, run_file
from moot.eval.run_config import KIND_NAMES, RunConfig, RunConfigMismatch, describe_mismatch, grows, kind_of
from moot.files import InputFileError, StoreFileError, open_sqlite
from moot.models.cache import SqliteCache
from moot.protocols.loader import names_file
from moot.runlock import LOCK_NAME, RunLock, RunLocked
from moot.secrets import redact_json

__all__ = [
    "DB_NAME",
    "EVAL_RUN",
    "ItemResult",
    "RunConfig",
    "RunConfigMismatch",
    "RunLocked",
    "RunReadError",
    "RunSession",
    "RunStore",
    "open_run",
    "run_file",
]

STORE_VERSION = 1
#: What a command that reads an eval run asks for, in its one-line errors.
EVAL_RUN = f"give a moot eval run folder, its {DB_NAME} or {DB_NAME}.gz"
#: What must not change in a stored item for a run to resume: what was asked and the gold answer.
ITEM_FIELDS = ("question", "choices", "context", "answer")


class RunSession(BaseModel):
    """One process that ran (or resumed) a run: what, besides the config, decides its sampled
    replies. A seed does not repeat a sample across llama.cpp thread and slot configurations (the
    same 60 requests, same seeds, gave 53 different replies on another day): only the request cache
    does. So each session records how the model ran."""

    started_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    moot_version: str = ""
    model: str = ""
    #: ``local``, or ``ray`` (the model ran on Ray workers, whose settings this process cannot see).
    where: str = "local"
    #: An embedded model's llama.cpp server as it loaded: threads (and why), slots, context, cache
    #: reuse, the weights' SHA-256, the engine build (:meth:`moot.models.embedded.EmbeddedModel.runtime`).
    #: None: another backend, not loaded (every call came from the cache), or on Ray.
    runtime: dict[str, Any] | None = None


class ItemResult(BaseModel):
    protocol: str
    item_id: str
    status: str  # "ok" | "failed"
    correct: bool = False
    extracted: str | None = None
    final_answer: str | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Of ``prompt_tokens``, those the model's server read from its prompt cache (0 in runs made
    #: before moot recorded it).
    cached_prompt_tokens: int = 0
    latency_s: float = 0.0
    parse_failures: int = 0
    #: Calls answered by the run's request cache (included in ``calls``: the cost stays what the
    #: protocol would have paid alone; these are the calls the run saved).
    cached_calls: int = 0
    error: str | None = None
    #: Why the debate stopped (``max_rounds``, ``consensus``, ``all_failed``...).
    stop_reason: str | None = None
    #: How many times the item was started: more than 1 only when a worker died under it.
    attempts: int = 1
    #: Where it ran: ``local`` or the Ray worker's name.
    worker: str | None = None
    finished_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(
        cls,
        protocol: str,
        item_id: str,
        result: DebateResult,
        *,
        error: str | None = None,
        correct: bool = False,
        extracted: str | None = None,
    ) -> ItemResult:
        """The row of one finished (or failed) debate: the one conversion every run uses (eval
        scores it, passing ``correct`` and ``extracted``; a batch has no gold answer)."""
        failed = error is not None or result.status == "failed"
        turns = [*result.turns(), *result.decision_turns]
        return cls(
            protocol=protocol, item_id=item_id, status="failed" if failed else "ok", correct=correct and not failed,
            extracted=extracted, final_answer=result.final_answer, calls=result.llm_calls,
            prompt_tokens=result.usage.prompt_tokens, completion_tokens=result.usage.completion_tokens,
            cached_prompt_tokens=result.usage.cached_prompt_tokens, latency_s=round(result.elapsed_s, 3),
            parse_failures=sum(1 for t in turns if t.parse_failure is not None),
            cached_calls=sum(t.cached_calls for t in turns), error=error or (result.error if failed else None),
            stop_reason=result.stop_reason,
        )  # fmt: skip


class NotAnEvalRun(FileNotFoundError):
    """The folder holds another kind of run (``moot batch``'s): a command that reads an eval run
    (report, export, judge) says so in one line, as it does for a folder with no run at all."""


class StoredItem(Protocol):
    """What the ``items`` table holds: an id and a JSON body (an :class:`EvalItem`, a batch input)."""

    @property
    def id(self) -> str: ...

    def model_dump_json(self) -> str: ...


M = TypeVar("M", bound=BaseModel)
Loaded = TypeVar("Loaded")


class RunStore:
    def __init__(self, folder: Path, conn: sqlite3.Connection, lock: RunLock | None = None) -> None:
        self.folder = folder
        self.conn = conn
        #: The larger config a run is being extended to (set by :meth:`open`, stored by :meth:`extend`).
        self.growing: RunConfig | None = None
        self.lock = lock

    # ------------------------------------------------------------------------------ opening

    @classmethod
    def open(cls, folder: Path, config: BaseModel | None = None) -> RunStore:
        """Open (or, with a config, create) the run in ``folder``.

        With a config the store is opened to run: it takes the folder's lock (another process
        running there raises :class:`RunLocked`), and a config that differs from the stored one
        raises :class:`RunConfigMismatch` naming the differences, unless the stored run has no
        result yet (a command refused or stopped before its first item): then the new config
        replaces it. ``config`` is a :class:`RunConfig` for ``moot eval``; another kind of run
        (``moot batch``) brings its own config model, and a folder holding another kind of run is
        refused. Without a config the store is only read (a report) and takes no lock."""
        path = folder / DB_NAME
        if config is None and not path.is_file():
            raise FileNotFoundError(f"{folder} holds no moot eval run ({DB_NAME} is missing)")
        lock = RunLock.acquire(folder) if config is not None else None
        try:
            return cls._open(folder, path, config, lock)
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    @classmethod
    def open_read_only(cls, folder: Path, db: Path | None = None) -> RunStore:
        """Open the run in ``folder`` (its ``run.sqlite``, or the file ``db``) only to read it: no lock,
        no table made, and every write refused (``PRAGMA query_only``); a run being written meanwhile
        is read as it was at each read. (Not ``mode=ro``: a read-only connection leaves the WAL's two
        files behind, which the last connection to close otherwise removes.) A command reads a run
        location through :func:`open_run`, which resolves it to the file. Raises
        :class:`FileNotFoundError` when there is no run, :class:`~moot.files.StoreFileError` when the
        file is not SQLite (truncated, damaged), ``sqlite3.DatabaseError`` when it is another SQLite
        file than a moot run's store."""
        path = folder / DB_NAME if db is None else db
        if not path.is_file():
            raise FileNotFoundError(f"{folder} holds no moot run ({path.name} is missing)")
        conn = open_sqlite(path, "a moot run's store")
        store = cls(folder, conn)
        try:
            conn.execute("PRAGMA query_only = ON")
            store.get_meta("config")  # another SQLite file fails here, not in the middle of a read
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def _open(cls, folder: Path, path: Path, config: BaseModel | None, lock: RunLock | None) -> RunStore:
        folder.mkdir(parents=True, exist_ok=True)
        conn = open_sqlite(path, "a moot run's store")  # a truncated or foreign file: one line, naming it
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS items (idx INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, json TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS results (
                protocol TEXT NOT NULL, item_id TEXT NOT NULL, status TEXT NOT NULL, json TEXT NOT NULL,
                transcript TEXT, PRIMARY KEY (protocol, item_id));
            """
        )
        store = cls(folder, conn, lock)
        if config is not None:
            stored = store.get_meta("config")
            if stored is None:
                store.set_meta("store_version", STORE_VERSION)
                store.set_meta("config", config.model_dump(mode="json"))
            else:
                # (a batch's config says its kind; an eval run's has none: a batch config reading an eval
                # run's would take the kind's default and pass, then be refused for its fields)
                held, wanted = kind_of(stored), kind_of(config.model_dump(mode="json"))
                if held != wanted:
                    conn.close()
                    raise RunConfigMismatch(
                        f"{folder} holds {KIND_NAMES.get(held, 'another kind of moot run')} (made by `moot {held}`), "
                        f"not a `moot {wanted}` run: use another --out folder"
                    )
                try:
                    old = type(config).model_validate(stored)
                except ValidationError:
                    conn.close()
                    raise RunConfigMismatch(
                        f"{folder} holds a `moot {held}` run this version of moot cannot read: use another --out folder"
                    ) from None
                finished = old != config and bool(store.done())  # anything finished under the old config
                items_held = conn.execute("SELECT count(*) FROM items").fetchone()[0]
                if (
                    isinstance(old, RunConfig)
                    and isinstance(config, RunConfig)
                    and grows(old, config, finished, items_held)
                ):
                    # More items of the same permutation: the run is extended, nothing is redone.
                    # The new config is stored once the new items are (``extend``), not before.
                    store.growing = config
                elif old != config and not finished:
                    # Nothing was finished under the old config: the corrected command starts afresh.
                    with conn:
                        conn.execute("DELETE FROM items")
                        conn.execute("DELETE FROM meta")
                    store.set_meta("store_version", STORE_VERSION)
                    store.set_meta("config", config.model_dump(mode="json"))
                elif old != config:
                    conn.close()
                    raise RunConfigMismatch(describe_mismatch(folder, old, config))
        return store

    @property
    def cache(self) -> SqliteCache:
        """The run's request cache (a table of this file): identical requests are made once."""
        return SqliteCache(self.conn)

    def import_cache(self, source: Path) -> int:
        """Copy another run's request cache into this run's (``moot eval --cache-from``): its
        entries whose key this run lacks. A key is the model's identity (weights hash, engine build)
        and the whole request, so an imported reply serves only the very request that made it: a
        protocol whose first round is another run's samples pays only for its later rounds.
        ``source`` is a run folder, its ``run.sqlite``, or a gzipped copy (``run.sqlite.gz``).
        Returns how many entries were added."""
        table = SqliteCache.TABLE
        try:
            with open_run(source, "name a moot eval run folder", any_name=True) as other:
                try:
                    rows = other.conn.execute(f"SELECT key, model, response, created, item_id FROM {table}").fetchall()
                except sqlite3.DatabaseError as exc:
                    raise InputFileError(f"--cache-from {source}: not a moot run's store ({exc})") from None
        except RunReadError as exc:
            raise InputFileError(f"--cache-from {exc}") from None
        before = len(self.cache)
        with self.conn:
            self.conn.executemany(
                f"INSERT OR IGNORE INTO {table} (key, model, response, created, item_id) VALUES (?, ?, ?, ?, ?)", rows
            )
        return len(self.cache) - before

    def check_prompts(self, fingerprints: dict[str, str], legacy: str | None = None) -> None:
        """Refuse to resume a run whose agents were asked otherwise (another moot version changed
        a prompt or an answer schema): its results would mix two questions. One fingerprint per
        protocol, so that a protocol can be added to a run. A run that stored one fingerprint for
        all its protocols (``legacy``, computed for its stored protocols) is converted if it still
        matches; a run from before any fingerprint takes the current ones."""
        stored = self.get_meta("prompts")
        if isinstance(stored, str):
            if stored != legacy:
                self._refuse_prompts(f"fingerprint {stored}, now {legacy}")
            stored = None
        changed = sorted(k for k, v in (stored or {}).items() if k in fingerprints and fingerprints[k] != v)
        files = [k for k in changed if names_file(k)]
        if files:  # the user's own file changed, not moot
            self.close()
            named = ", ".join(files)
            raise RunConfigMismatch(
                f"{self.folder} was started with another version of the protocol file{'s' if len(files) > 1 else ''} "
                f"{named}: its results would mix the two; restore the file as it was, give the changed one to "
                f"another --out folder, or delete {self.folder / DB_NAME} to start over."
            )
        if changed:
            self._refuse_prompts(f"changed for {', '.join(changed)}")
        self.set_meta("prompts", {**(stored or {}), **fingerprints})

    def _refuse_prompts(self, detail: str) -> None:
        self.close()
        raise RunConfigMismatch(
            f"{self.folder} was started with other prompts or answer schemas ({detail}: moot changed since). Its "
            f"results would mix the two: finish it with the moot version that started it, use another --out "
            f"folder, or delete {self.folder / DB_NAME} to start over."
        )

    def check_items(self, fresh: list[EvalItem]) -> None:
        """Refuse to resume a run whose data changed: every stored item must still be in the
        dataset's selection, at its place, with the same question, choices, passage and answer
        (a changed gold answer would otherwise be scored with the old one, with no word)."""
        stored = self.items()
        problem: str | None = None
        if [i.id for i in fresh[: len(stored)]] != [i.id for i in stored]:
            problem = "the dataset now selects other items than the run holds"
        else:
            for old, new in zip(stored, fresh, strict=False):
                changed = [f for f in ITEM_FIELDS if getattr(old, f) != getattr(new, f)]
                if changed:
                    what = "; ".join(f"{f}: {_short(getattr(old, f))} -> {_short(getattr(new, f))}" for f in changed)
                    problem = f"item {old.id} changed in the dataset since the run started ({what})"
                    break
        if problem is not None:
            self.close()
            raise RunConfigMismatch(
                f"{self.folder}: {problem}; its stored results were asked and scored with the old data. Restore "
                f"the data, use another --out folder, or delete {self.folder / DB_NAME} to start over."
            )

    def close(self) -> None:
        self.conn.close()
        if self.lock is not None:
            self.lock.release()

    @property
    def config(self) -> RunConfig:
        stored = self.get_meta("config")
        if stored is None:
            raise FileNotFoundError(f"{self.folder} has no run config")
        self._only_eval(stored)
        return RunConfig.model_validate(stored)

    @property
    def kind(self) -> str:
        """The kind of moot run the folder holds: ``eval``, or the ``kind`` another run's config
        names (``batch``)."""
        stored = self.get_meta("config")
        if stored is None:
            raise FileNotFoundError(f"{self.folder} has no run config")
        kind = stored.get("kind") if isinstance(stored, dict) else None
        return "eval" if kind is None else str(kind)

    def _only_eval(self, stored: Any) -> None:
        """Refuse to read another kind of run (``moot batch``'s config has a ``kind``) as an eval run."""
        if isinstance(stored, dict) and stored.get("kind") is not None:
            raise NotAnEvalRun(
                f"{self.folder} holds a moot {stored['kind']} run, not a moot eval run: it has no gold answers to "
                "score, so no eval report or export; for its rows (decision, calls, tokens, cost) run the same "
                "moot batch command with --export FILE.csv (a finished batch makes no call)"
            )

    # ------------------------------------------------------------------------------- meta

    def get_meta(self, key: str) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def sessions(self) -> list[RunSession]:
        """The processes that ran this run, in order (none in a run from before they were recorded)."""
        return [RunSession.model_validate(x) for x in self.get_meta("sessions") or []]

    def record_session(self, session: RunSession, index: int | None = None) -> int:
        """Append a session (``index`` None) or replace session ``index``; returns its index."""
        sessions = self.get_meta("sessions") or []
        if index is None:
            sessions.append(session.model_dump(mode="json"))
            index = len(sessions) - 1
        else:
            sessions[index] = session.model_dump(mode="json")
        self.set_meta("sessions", sessions)
        return index

    # ------------------------------------------------------------------------------ items

    def items(self) -> list[EvalItem]:
        self._only_eval(self.get_meta("config"))
        return self.load_items(EvalItem)

    def extend(self, items: list[EvalItem]) -> None:
        """Add the items a grown ``--n`` selects (after the ones held) and store the grown config."""
        self.save_items(items, start=len(self.items()))
        if self.growing is not None:
            self.set_meta("config", self.growing.model_dump(mode="json"))
            self.growing = None

    def load_items(self, cls: type[M]) -> list[M]:
        rows = self.conn.execute("SELECT json FROM items ORDER BY idx").fetchall()
        return [cls.model_validate_json(r[0]) for r in rows]

    def save_items(self, items: Sequence[StoredItem], *, start: int = 0, redacted: bool = False) -> None:
        """Store the run's inputs; ``redacted`` (a batch's: a user's own questions), as
        :func:`stored_form` writes them, a key typed into one ``***``. An evaluation's items are
        kept as they are: its debates and its scoring read them back from here."""
        with self.conn:
            self.conn.executemany(
                "INSERT INTO items (idx, id, json) VALUES (?, ?, ?)",
                [
                    (start + i, item.id, redact_json(text) if redacted else text)
                    for i, item in enumerate(items)
                    for text in [item.model_dump_json()]
                ],
            )

    # ----------------------------------------------------------------------------- results

    def save_result(self, result: ItemResult, transcript: DebateResult | None) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO results (protocol, item_id, status, json, transcript) VALUES (?, ?, ?, ?, ?)",
                (
                    result.protocol,
                    result.item_id,
                    result.status,
                    redact_json(result.model_dump_json()),  # (a reply that echoed a key: its decision)
                    transcript.to_json(indent=None) if transcript is not None else None,
                ),
            )

    def done(self) -> set[tuple[str, str]]:
        return {(p, i) for p, i in self.conn.execute("SELECT protocol, item_id FROM results")}

    def transcript(self, protocol: str, item_id: str) -> DebateResult | None:
        row = self.conn.execute(
            "SELECT transcript FROM results WHERE protocol = ? AND item_id = ?", (protocol, item_id)
        ).fetchone()
        return None if row is None or row[0] is None else DebateResult.model_validate_json(row[0])

    def results(self, protocol: str | None = None) -> list[ItemResult]:
        if protocol is None:
            rows = self.conn.execute("SELECT json FROM results").fetchall()
        else:
            rows = self.conn.execute("SELECT json FROM results WHERE protocol = ?", (protocol,)).fetchall()
        return [ItemResult.model_validate_json(r[0]) for r in rows]

    def transcripts(self, protocol: str) -> dict[str, DebateResult]:
        rows = self.conn.execute(
            "SELECT item_id, transcript FROM results WHERE protocol = ? AND transcript IS NOT NULL", (protocol,)
        ).fetchall()
        return {item_id: DebateResult.model_validate_json(text) for item_id, text in rows}

    # ------------------------------------------------------------------ quality judgements

    #: ``moot eval judge``'s outputs: one row per (protocol, item, judge, rubric), the judged dimensions
    #: as a :class:`DebateQuality` (levels, the judge's rationale, its calls and tokens). The table is
    #: made by the first judgement, so a run never judged is not written to by a report.
    JUDGEMENTS = "quality_judgements"

    def _has_table(self, name: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def save_judgement(self, protocol: str, item_id: str, rubric: str, quality: DebateQuality) -> None:
        """Store one debate's judged quality (``quality.judge`` names the judge), replacing this judge's
        earlier judgement of it under the same rubric."""
        if quality.judge is None:
            raise ValueError("a stored judgement names its judge (quality.judge)")
        with self.conn:
            self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.JUDGEMENTS} (protocol TEXT NOT NULL, item_id TEXT NOT NULL, "
                "judge TEXT NOT NULL, rubric TEXT NOT NULL, json TEXT NOT NULL, "
                "PRIMARY KEY (protocol, item_id, judge, rubric))"
            )
            self.conn.execute(
                f"INSERT OR REPLACE INTO {self.JUDGEMENTS} (protocol, item_id, judge, rubric, json) "
                "VALUES (?, ?, ?, ?, ?)",
                (protocol, item_id, quality.judge, rubric, quality.model_dump_json()),
            )

    def judgements(self, rubric: str, judge: str | None = None) -> dict[tuple[str, str], DebateQuality]:
        """The stored judgements under ``rubric`` per (protocol, item): ``judge``'s, or, when several
        judges judged a debate, the latest one's."""
        if not self._has_table(self.JUDGEMENTS):
            return {}
        query = f"SELECT protocol, item_id, json FROM {self.JUDGEMENTS} WHERE rubric = ?"
        args: tuple[str, ...] = (rubric,)
        if judge is not None:
            query, args = query + " AND judge = ?", (rubric, judge)
        rows = self.conn.execute(query + " ORDER BY rowid", args).fetchall()
        return {(p, i): DebateQuality.model_validate_json(text) for p, i, text in rows}


def stored_form(item: M) -> M:
    """An input as a run's store holds it (:meth:`RunStore.save_items`): every secret in it ``***``,
    so that a resumed run compares like with like."""
    text = item.model_dump_json()
    redacted = redact_json(text)
    return item if redacted == text else type(item).model_validate_json(redacted)


@contextmanager
def open_run(
    path: Path, what: str = EVAL_RUN, kind: str = "moot eval run", *, any_name: bool = False
) -> Iterator[RunStore]:
    """The run at any run location, opened only to read (:meth:`RunStore.open_read_only`): the one
    function every reader opens a run with (a report, an export, ``moot view``, ``--cache-from``).
    The location is a run folder (holding ``run.sqlite``, or only ``run.sqlite.gz`` as docs/results
    keeps them), its ``run.sqlite`` (any file name with ``any_name``), or a gzipped copy,
    decompressed into a temporary folder removed on leaving (:func:`~moot.eval.location.run_file`).
    A location that holds no run raises :class:`RunReadError` in one line, naming it and ending with
    ``what`` (the fix). A reader takes what it needs and leaves: :func:`moot.eval.loaded.load_run`
    reads the whole run into a plain value."""
    with run_file(path, what, kind, any_name=any_name) as db:
        try:
            store = RunStore.open_read_only(db.parent, db)
        except FileNotFoundError as exc:
            raise RunReadError(f"{exc}; {what}") from None
        except StoreFileError as exc:  # not SQLite (moot.files.open_sqlite): the file, or the copy as given
            where = db if db == path or db.parent == path else path
            raise RunReadError(
                f"{where} is not a moot run's store ({exc.reason}): it is truncated, damaged or another kind of "
                f"file; {what}"
            ) from None
        except sqlite3.DatabaseError as exc:  # SQLite, but not a run's
            raise RunReadError(f"{path} is not a moot run's store ({exc}); {what}") from None
        try:
            yield store
        finally:
            store.close()


def read_run(path: Path, read: Callable[[RunStore, str], Loaded], what: str, kind: str) -> Loaded:
    """The run at any run location (:func:`open_run`) read once by ``read`` (an eval run's reader, a
    batch run's), the file closed (and a decompressed copy removed) before this returns; a store
    ``read`` cannot read raises :class:`RunReadError` in one line naming ``path`` as no ``kind``,
    ending with ``what`` (the fix)."""
    with open_run(path, what, kind) as store:
        try:
            return read(store, str(path))
        except (sqlite3.DatabaseError, ValidationError, FileNotFoundError) as exc:
            first = str(exc).splitlines()[0]
            raise RunReadError(f"{path} is not a {kind} ({first}); {what}") from None


def discard_unstarted(store: RunStore, made_folder: bool) -> None:
    """A run a command made and never ran (its workers could not start): its store and lock removed,
    and its folder too if the command made it, so that a refusal leaves nothing behind. The store's
    files go while its lock is held, the lock's file last: a process that takes the folder then finds
    nothing of this run, and never loses files of its own."""
    folder = store.folder
    store.conn.close()
    for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", LOCK_NAME):
        (folder / name).unlink(missing_ok=True)
    if store.lock is not None:
        store.lock.release()
    if made_folder:
        with contextlib.suppress(OSError):  # (not empty: something else is in it)
            folder.rmdir()


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
