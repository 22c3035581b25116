"""What a ``moot serve`` process is allowed to do: its models, its limits, its address and key."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from moot.models.pricing import PriceTable
from moot.server.tuned import TunedModel

#: Model spec prefixes a request may never name, even when the server offers them: they read a
#: file (``scripted:FILE``) or import code (``langchain:MODULE:ATTR``).
FORBIDDEN_IN_REQUESTS = ("scripted:", "langchain:")


class Limits(BaseModel):
    """The server's own caps. A request may ask for less, never for more."""

    model_config = ConfigDict(extra="forbid")

    max_rounds: int = Field(default=10, ge=1)
    max_participants: int = Field(default=12, ge=1)
    max_calls: int = Field(default=100, ge=1)
    max_tokens_per_turn: int = Field(default=2000, ge=1)
    max_total_tokens: int = Field(default=200_000, ge=1)
    timeout_s: float = Field(default=600.0, gt=0)
    max_question_chars: int = Field(default=20_000, ge=1)
    max_context_passages: int = Field(default=50, ge=0)
    #: The most messages (``messages``, ``input`` items) one OpenAI-shaped request may carry; within
    #: it the oldest are left out when they do not fit the prompt budget (``moot serve --max-messages``).
    max_messages: int = Field(default=1000, ge=1)


class ServerSettings(BaseModel):
    """Everything :func:`moot.server.create_app` needs. ``moot serve`` builds one from its options."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    db: Path = Path("moot.sqlite")
    #: A ``postgresql://`` URL: the debates in PostgreSQL instead of the SQLite file ``db``
    #: (``moot serve --db URL`` or ``MOOT_DB_URL``; the ``postgres`` extra).
    db_url: SecretStr | None = None
    #: Seconds a replica's claim of a running debate lasts unless renewed (every third of it); a
    #: replica that stops renewing loses its debates' writes after this (docs/scale-out.md).
    lease_s: float = Field(default=30.0, gt=0)
    #: A ``redis://`` URL: the live bus between replicas (``moot serve --redis URL`` or
    #: ``MOOT_REDIS_URL``; the ``redis`` extra): a stream on any replica gets a debate's events, token
    #: deltas included, from the replica running it, and a cancel reaches that replica at once.
    #: None: streams of a debate running elsewhere poll the store (docs/scale-out.md).
    redis_url: SecretStr | None = None
    #: Events of each debate the bus keeps (Redis: ``XADD MAXLEN ~``); a stream resuming from an
    #: older id gets them from the store (without their token deltas).
    bus_retention: int = Field(default=10_000, ge=100)
    #: Seconds a debate's Redis stream is kept after its last event.
    bus_ttl_s: float = Field(default=3600.0, gt=0)
    #: Seconds between two reads of the store by a stream whose debate runs elsewhere, without a bus.
    stream_poll_s: float = Field(default=0.5, gt=0)
    #: Seconds between two checks of the store for cancels sent to other replicas (with Redis they
    #: arrive at once; this is the way without it, and when Redis is down).
    cancel_poll_s: float = Field(default=1.0, gt=0)
    #: Seconds a cancel of a debate running on another replica waits for it to stop before it
    #: answers 202 with the debate as it is.
    cancel_wait_s: float = Field(default=10.0, ge=0)
    #: Seconds between a replica's looks at the queue of a shared store (PostgreSQL) while it has a
    #: free slot: it then runs a debate another replica queued, or one whose lease expired.
    poll_s: float = Field(default=1.0, gt=0)
    #: The model specs requests may use; the first is the default.
    models: list[str] = Field(default_factory=lambda: ["embedded"], min_length=1)
    #: Base URL of the ``openai:`` models (else ``OPENAI_BASE_URL``): the operator's choice, never a request's.
    base_url: str | None = None
    #: Calls at once to each ``openai:`` model, shared by every debate (None: the backend's default, 8).
    model_concurrency: int | None = Field(default=None, ge=1)
    #: Debates that run at once; the others wait in the queue.
    max_running: int = Field(default=4, ge=1)
    #: Debates that may wait; beyond that a submission gets 429 with Retry-After.
    max_queued: int = Field(default=100, ge=0)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    #: Whether an image may be given by its address (``https://``), which the model's server then
    #: fetches, from its own network: an internal one may reach what a caller should not. Off, only
    #: images sent inline (``data:image/...;base64``) are taken.
    image_urls: bool = False
    #: The most bytes (as JSON) of one Responses conversation a ``previous_response_id`` chain builds:
    #: each stored response keeps its whole conversation. Past it the chain's oldest items are left
    #: out (``truncation: auto``) or the request is refused (``disabled``).
    max_conversation_bytes: int = Field(default=4_000_000, ge=1024)
    #: Seconds a request's headers may take to arrive (from the connection or its first byte), and
    #: then its body: a client that sends slower is answered 408 and dropped (slowloris).
    request_timeout_s: float = Field(default=20.0, gt=0)
    #: Stateful MCP sessions (``/mcp``, the 2025-11-25 revision) one API key of the store may hold
    #: open at once (a session idle 30 minutes ends); one more is answered 429. Sessions are also
    #: bound to the key that opened them. (The server's own key, and no key, share the MCP SDK's
    #: cap of 10,000 sessions.)
    mcp_sessions_per_key: int = Field(default=100, ge=1)
    #: Connections open at once; one more is answered 503 with Retry-After and closed.
    max_connections: int = Field(default=1000, ge=1)
    #: Seconds the viewer's session token lasts (it then asks for the key again).
    session_max_age_s: int = Field(default=12 * 3600, ge=60)
    #: Seconds a stream (SSE, streamed chat) has at a graceful stop to send its last event; keep it
    #: under uvicorn's graceful shutdown timeout (``moot serve``: 5 s).
    shutdown_grace_s: float = Field(default=3.0, ge=0)
    #: Bearer token every /v1 request must carry (None: no key, loopback only).
    api_key: SecretStr | None = None
    #: Seconds a lookup of the store's API keys (``moot serve keys``) is remembered: a key added or
    #: revoked on any replica holds on this one within this time.
    key_cache_s: float = Field(default=5.0, ge=0, le=300)
    #: Host names (a request's ``Host`` header, any port) this server answers to besides the loopback
    #: ones (:data:`LOOPBACK_NAMES`), which a server bound to loopback alone answers to: a web page
    #: cannot reach it through a name its attacker controls (DNS rebinding). ``*.example.com`` allows
    #: the subdomains; a server bound elsewhere answers to any name unless these are given.
    allowed_hosts: list[str] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)
    #: Seconds between ``: keepalive`` comment lines on streams that have nothing to send.
    keepalive_s: float = Field(default=10.0, gt=0)
    #: Seconds over which a turn's streamed token deltas are gathered into one ``token`` event (and
    #: one chunk of a streamed chat completion), after its first, which is sent at once; 0: an event
    #: per delta (``moot serve --token-window-ms``).
    token_window_s: float = Field(default=0.05, ge=0, le=1)
    #: OpenTelemetry spans of every debate (``moot serve --trace``), exported as the standard OTEL_*
    #: variables say, each debate's tree under its caller's ``traceparent``; ``trace_content`` adds
    #: prompts and replies (docs/tracing.md).
    trace: bool = False
    trace_content: bool = False
    #: Event logs of finished debates kept in memory (token events included); older ones are
    #: rebuilt from the store without their token events.
    finished_logs_in_memory: int = Field(default=64, ge=0)
    #: Prices of the models (USD per million tokens): every finished debate carries its ``cost``.
    prices: PriceTable = Field(default_factory=PriceTable)
    #: A protocol ``moot tune`` chose (``--tuned tuned.yaml``), served as ``moot/auto`` and under its label.
    tuned: TunedModel | None = None

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: list[str]) -> list[str]:
        names = []
        for given in v:
            name = given.strip().lower().rstrip(".")
            if not name:
                continue
            if name.count(":") > 1 and not name.startswith("["):
                name = f"[{name}]"  # an IPv6 address, written as a Host header writes it
            if "/" in name or "@" in name or (":" in name and not name.endswith("]")) or " " in name:
                raise ValueError(
                    f"{given!r} is not a host name: give names only, without a scheme, port or path (e.g. "
                    "moot.example.com, *.example.com, 10.0.0.5)"
                )
            names.append(name)
        return list(dict.fromkeys(names))

    def trusted_hosts(self) -> list[str] | None:
        """The ``Host`` names this server answers to (any port), or None: any. On loopback, the
        loopback names and :attr:`allowed_hosts`; elsewhere, those only when some are given."""
        if is_loopback(self.host) or self.allowed_hosts:
            return [*LOOPBACK_NAMES, *self.allowed_hosts]
        return None

    @field_validator("models")
    @classmethod
    def _strip(cls, v: list[str]) -> list[str]:
        models = [m.strip() for m in v if m.strip()]
        if not models:
            raise ValueError("give at least one model spec")
        return list(dict.fromkeys(models))

    def model_options(self) -> dict[str, Any]:
        """Options of the ``openai:`` models (the engine gives them to no other backend)."""
        return {"base_url": self.base_url, "max_concurrency": self.model_concurrency}

    def store_target(self) -> str | Path:
        """What the store opens: the PostgreSQL URL, else the SQLite file."""
        return self.db_url.get_secret_value() if self.db_url is not None else self.db

    @property
    def default_model(self) -> str:
        return self.models[0]

    def check_bind(self, store_keys: bool = False) -> None:
        """Refuse a non-loopback address without an API key (a one-line reason): the server's own
        (``api_key``), or keys in its store (``store_keys``: ``moot serve keys add``)."""
        if not is_loopback(self.host) and self.api_key is None and not store_keys:
            raise ValueError(
                f"refusing to listen on {self.host} without an API key: add one to the store (moot serve keys add "
                "--name NAME --db ...), or set one in an environment variable and pass --api-key-env VAR, or bind "
                "127.0.0.1"
            )


#: The names of this machine's loopback addresses, as a request's ``Host`` header writes them.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
