"""Jobs on a pool of Ray actors (``pip install 'moot[ray]'``).

``--ray local`` starts a Ray instance on this machine for the run (listening on 127.0.0.1 only);
``--ray auto`` joins the running cluster Ray finds (``RAY_ADDRESS`` honoured); any other value is
a cluster address (``HOST:PORT`` of the head's GCS, or ``ray://HOST:10001`` for Ray Client).

Each actor holds one model for its whole life: an embedded model is loaded once, with as many
llama.cpp threads as the actor has CPUs (``MOOT_EMBEDDED_THREADS``, set in the actor's runtime
environment); an API model serves many debates at once under its own concurrency limit. The
driver keeps at most ``per_worker`` jobs on each actor and is the only process that writes the
run's store.

Secrets: the API key and the base URL the driver uses (``--api-key``/``--base-url`` or
``OPENAI_API_KEY``/``OPENAI_BASE_URL``) go to each actor as a constructor argument of
:class:`pydantic.SecretStr` values and are put into that actor's environment in memory. They are
not put into ``runtime_env["env_vars"]``: Ray's runtime-environment agent writes those, in clear,
to its log file on every node (``runtime_env_agent.log``).

Faults: an actor that dies (killed, its node lost) has its in-flight jobs sent to another actor,
and a replacement actor is started; a job is tried at most ``max_attempts`` times. A job whose
outcome came back is never sent again, so a finished item is recorded and paid for once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

from moot.models.base import BaseChatModel, ModelConfigError
from moot.scale.jobs import Job, JobFailed, Ran, WatchedModel

R = TypeVar("R", bound=BaseModel)

NAMESPACE = "moot"
INSTALL_HINT = "pip install 'moot[ray]'"
#: The driver's model settings that reach the workers (in memory, see the module docstring).
FORWARDED_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL")


class RayUnavailable(Exception):
    """Ray is not installed (bad input: the fix is an install)."""


class RayCannotStart(RayUnavailable):
    """Ray cannot start on this machine as it is set up (its temp folder cannot be created): bad
    input, whose fix (a writable ``RAY_TMPDIR``) the message names."""


class RayConnectError(Exception):
    """The cluster cannot be reached, or the workers cannot start there."""


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


# ------------------------------------------------------------------------------------ the actor


class WorkerSettings(BaseModel):
    """What an actor is made with. ``secrets`` never appear in a repr, a log or an error."""

    model: str
    secrets: dict[str, SecretStr] = {}


class WorkerInfo(BaseModel):
    """What an actor reports once its model is ready (or why it is not)."""

    name: str
    node: str = ""
    pid: int = 0
    threads: int = 0
    model: str = ""
    moot_version: str = ""
    error: str | None = None


class JobReply(BaseModel):
    """An actor's answer to one job: the outcome, or the model's configuration error."""

    value: Any = None
    config_error: str | None = None


class Worker:
    """The Ray actor (made remote at run time, so this module imports without Ray)."""

    def __init__(self, settings: WorkerSettings, name: str) -> None:
        # The worker's model reads these when it is built; they stay in this process's memory.
        os.environ.update({k: v.get_secret_value() for k, v in settings.secrets.items()})
        self.settings = settings
        self.name = name
        self.model: WatchedModel | None = None

    async def ready(self) -> WorkerInfo:
        """Build the model (and load an embedded one's weights: once, for the actor's life)."""
        from moot._version import __version__
        from moot.models.embedded import EmbeddedModel
        from moot.models.registry import resolve_model

        info = WorkerInfo(name=self.name, node=_node_name(), pid=os.getpid(), moot_version=__version__)
        try:
            model = resolve_model(self.settings.model)
            if isinstance(model, EmbeddedModel):
                await asyncio.to_thread(model.load)
        except ModelConfigError as exc:
            return info.model_copy(update={"error": str(exc)})
        self.model = WatchedModel(model)
        threads = os.environ.get("MOOT_EMBEDDED_THREADS", "")
        return info.model_copy(update={"model": model.name, "threads": int(threads) if threads.isdigit() else 0})

    async def run(self, job: Job[Any]) -> JobReply:
        assert self.model is not None, "ready() runs first"
        try:
            value = await job.execute(self.model)
        except ModelConfigError as exc:
            return JobReply(config_error=str(exc))
        if self.model.config_error is not None:
            return JobReply(config_error=str(self.model.config_error))
        return JobReply(value=value)


def _node_name() -> str:
    return socket.gethostname()


# ------------------------------------------------------------------------------- the connection


def cluster_address(address: str) -> tuple[str, int] | None:
    """The host and port ``--ray`` names (None: ``local`` or ``auto``), or a RayConnectError saying
    what an address looks like: checked before a run touches its folder, with no import of Ray."""
    if address in ("local", "auto"):
        return None
    target = address if "://" in address else f"tcp://{address}"
    parts = urlsplit(target)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise RayConnectError(
            f"--ray {address!r} is not a cluster address: use local, auto, HOST:PORT (the head's GCS port, "
            "6379 by default) or ray://HOST:10001"
        )
    return host, port


def _preflight(address: str) -> None:
    """A one-line error now, rather than Ray's minutes of reconnect attempts, for an address
    nothing listens on."""
    named = cluster_address(address)
    if named is None:
        return
    host, port = named
    try:
        with socket.create_connection((host, port), timeout=5):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayConnectError(
            f"no Ray cluster answers at {host}:{port} ({reason}): start one with `ray start --head` there, "
            "or use --ray local"
        ) from None


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """Connect this process to Ray; returns whether this call started the connection (and so must
    end it). A process that already called ``ray.init()`` keeps its connection."""
    if address == "local" and "ray" not in sys.modules:
        # A run's own instance listens on loopback only (Ray otherwise binds the machine's address),
        # and reports no usage statistics.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Token authentication, which Ray turns on for a new local instance anyway: set explicitly, so
        # Ray does not print a warning about it on every run.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    ray = import_ray()
    if ray.is_initialized():
        return False
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING, "namespace": NAMESPACE}
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    if target and target not in ("auto", "local"):
        _preflight(target)
    with _keep_sigterm_handler():
        try:
            if address == "local":
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **common)
            else:
                ray.init(address=address, **common)
        except ConnectionError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayConnectError(f"cannot join a Ray cluster ({address}): {first}") from None
        except OSError as exc:  # its session folder (under RAY_TMPDIR) cannot be made: a 74-line traceback
            with contextlib.suppress(Exception):
                ray.shutdown()
            where = f" {exc.filename}" if exc.filename else ""
            raise RayCannotStart(
                f"Ray cannot start here: {exc.strerror or exc}:{where}. Ray keeps its sessions in $RAY_TMPDIR "
                f"(else {os.path.join(tempfile.gettempdir(), 'ray')}): set RAY_TMPDIR to a writable folder with a "
                "short path (Ray puts sockets there)"
            ) from None
    return True


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` replaces the SIGTERM handler with ``sys.exit``. A handler of the caller's own
    (the moot CLI's: SIGTERM stops a run as Ctrl-C does, saved and reported as interrupted), or
    SIGTERM ignored, is put back; the default disposition is left to Ray's, which at least runs
    ``ray.shutdown`` at exit."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before not in (None, signal.SIG_DFL) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before)


# ------------------------------------------------------------------------------------- the pool


@dataclass
class _Slot:
    name: str
    actor: Any
    busy: int = 0
    alive: bool = True


class RayExecutor:
    """A pool of :class:`Worker` actors. Use as ``async with RayExecutor(...) as ex:``."""

    def __init__(
        self,
        model: str | BaseChatModel | None,
        *,
        address: str = "local",
        workers: int | None = None,
        worker_cpus: float = 1.0,
        per_worker: int = 4,
        model_options: dict[str, Any] | None = None,
        max_attempts: int = 3,
        start_timeout_s: float = 600.0,
    ) -> None:
        if model is not None and not isinstance(model, str):
            raise ModelConfigError("--ray needs the model as a spec string (embedded:NAME, openai:MODEL, ...)")
        if worker_cpus <= 0:
            raise ValueError("worker CPUs must be above 0")
        from moot.models.registry import default_spec

        self.model = model or default_spec()
        self.address = address
        self.workers = workers
        self.worker_cpus = worker_cpus
        self.per_worker = max(1, per_worker)
        self.max_attempts = max(1, max_attempts)
        self.start_timeout_s = start_timeout_s
        self.run_id = uuid.uuid4().hex[:8]
        self.infos: list[WorkerInfo] = []
        self.replaced = 0
        self._options = {k: v for k, v in (model_options or {}).items() if v is not None}
        self._slots: list[_Slot] = []
        self._pending = 0
        self._cond: asyncio.Condition | None = None
        self._owns_connection = False
        self._ray: ModuleType | None = None
        self._actor_cls: Any = None
        self._settings_obj: WorkerSettings | None = None
        self._count = 0

    # -------------------------------------------------------------------------- life cycle

    @property
    def capacity(self) -> int:
        return max(1, (self.workers or 1) * self.per_worker)

    def _settings(self) -> WorkerSettings:
        secrets = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
        if self._options.get("api_key"):
            secrets["OPENAI_API_KEY"] = str(self._options["api_key"])
        if self._options.get("base_url"):
            secrets["OPENAI_BASE_URL"] = str(self._options["base_url"])
        unknown = sorted(set(self._options) - {"api_key", "base_url"})
        if unknown:
            raise ModelConfigError(f"{', '.join(unknown)} cannot be sent to Ray workers; set them in the model spec")
        return WorkerSettings(model=self.model, secrets={k: SecretStr(v) for k, v in secrets.items()})

    def _threads(self) -> int:
        return max(1, int(self.worker_cpus))

    async def __aenter__(self) -> RayExecutor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def start(self) -> None:
        """Connect, start the actors and wait until each has its model. Errors name the fix."""
        self._settings_obj = self._settings()
        self._owns_connection = connect(self.address)
        ray = self._ray = import_ray()
        try:
            total = float(ray.cluster_resources().get("CPU", 0.0))
            if self.workers is None:
                self.workers = max(1, int(total // self.worker_cpus))
            if self.workers * self.worker_cpus > total + 1e-9:
                raise RayConnectError(
                    f"{self.workers} workers x {self.worker_cpus:g} CPU do not fit the cluster's {total:g} CPUs: "
                    f"use --workers {max(1, int(total // self.worker_cpus))} or a smaller --worker-cpus"
                )
            self._actor_cls = ray.remote(Worker)
            self._cond = asyncio.Condition()
            names = [self._next_name() for _ in range(self.workers)]
            actors = [self._new_actor(n) for n in names]
            try:
                infos = await asyncio.wait_for(
                    asyncio.gather(*(a.ready.remote() for a in actors)), self.start_timeout_s
                )
            except TimeoutError:
                raise RayConnectError(
                    f"the {self.workers} Ray workers did not start within {self.start_timeout_s:g} s: the cluster "
                    "has no room for them (see `ray status`)"
                ) from None
            for info in infos:
                if info.error is not None:
                    raise RayConnectError(f"Ray worker on {info.node}: {info.error}")
            from moot._version import __version__

            for info in infos:
                if info.moot_version != __version__:
                    raise RayConnectError(
                        f"the Ray worker on {info.node} runs moot {info.moot_version}, this driver {__version__}: "
                        "install the same moot on every node"
                    )
            self.infos = list(infos)
            self._slots = [_Slot(name=n, actor=a) for n, a in zip(names, actors, strict=True)]
        except BaseException:
            self.close()
            raise

    def _new_actor(self, name: str) -> Any:
        # No restarts or task retries by Ray: the driver re-sends a dead actor's jobs itself, and
        # only those whose outcome never came back.
        return self._actor_cls.options(
            name=name,
            namespace=NAMESPACE,
            num_cpus=self.worker_cpus,
            max_restarts=0,
            max_task_retries=0,
            runtime_env={"env_vars": {"MOOT_EMBEDDED_THREADS": str(self._threads())}},
        ).remote(self._settings_obj, name)

    def _next_name(self) -> str:
        self._count += 1
        return f"moot-{self.run_id}-w{self._count}"

    def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        for slot in self._slots:
            if slot.alive:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(slot.actor)
        self._slots = []
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._ray = None

    # ------------------------------------------------------------------------------- running

    async def _acquire(self) -> _Slot:
        assert self._cond is not None
        async with self._cond:
            while True:
                free = [s for s in self._slots if s.alive and s.busy < self.per_worker]
                if free:
                    slot = min(free, key=lambda s: s.busy)
                    slot.busy += 1
                    return slot
                if not any(s.alive for s in self._slots) and self._pending == 0:
                    raise RayConnectError("every Ray worker of this run died and none could be replaced")
                await self._cond.wait()

    async def _release(self, slot: _Slot) -> None:
        assert self._cond is not None
        async with self._cond:
            slot.busy -= 1
            self._cond.notify_all()

    async def _lost(self, slot: _Slot) -> None:
        """``slot``'s actor died: stop using it and start one replacement (at most one per worker)."""
        assert self._cond is not None
        async with self._cond:
            if not slot.alive:
                return
            slot.alive = False
            if self.replaced < (self.workers or 1):
                self.replaced += 1
                self._pending += 1
                asyncio.get_running_loop().create_task(self._replace())
            self._cond.notify_all()

    async def _replace(self) -> None:
        assert self._cond is not None
        name = self._next_name()
        slot: _Slot | None = None
        try:
            actor = self._new_actor(name)
            info = await asyncio.wait_for(actor.ready.remote(), self.start_timeout_s)
            if info.error is None:
                self.infos.append(info)
                slot = _Slot(name=name, actor=actor)
        except Exception:  # the replacement could not start: the other workers carry on
            slot = None
        async with self._cond:
            self._pending -= 1
            if slot is not None:
                self._slots.append(slot)
            self._cond.notify_all()

    async def run(self, job: Job[R]) -> Ran[R]:
        ray = self._ray
        assert ray is not None, "start() first"
        from ray.exceptions import RayActorError, RayTaskError

        lost_on: list[str] = []
        while True:
            slot = await self._acquire()
            ref = slot.actor.run.remote(job)
            try:
                reply: JobReply = await ref
            except RayActorError:
                await self._release(slot)
                await self._lost(slot)
                lost_on.append(slot.name)
                if len(lost_on) >= self.max_attempts:
                    raise JobFailed(f"its Ray worker died {len(lost_on)} times ({', '.join(lost_on)})") from None
                continue
            except RayTaskError as exc:
                await self._release(slot)
                raise JobFailed(f"the job raised on Ray worker {slot.name}: {exc.cause!r}") from None
            except asyncio.CancelledError:
                ray.cancel(ref)
                await self._release(slot)
                raise
            await self._release(slot)
            if reply.config_error is not None:
                raise ModelConfigError(reply.config_error)
            return Ran(reply.value, attempts=len(lost_on) + 1, worker=slot.name)

    def describe(self) -> str:
        """One line for the user: how many workers, where, on what."""
        nodes = sorted({i.node for i in self.infos})
        first = self.infos[0] if self.infos else None
        threads = f", {first.threads} llama.cpp thread(s) each" if first and first.model.startswith("embedded") else ""
        return (
            f"ray: {self.workers} worker(s) x {self.worker_cpus:g} CPU on {len(nodes)} node(s), "
            f"{self.per_worker} debate(s) at once each, model {first.model if first else self.model}{threads}"
        )
