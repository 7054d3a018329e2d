"""The one settings object: every knob of every process, read from the environment once (field
``x`` is ``X``; docs/configuration.md). Only composition roots read it; its methods at the end
narrow it into the engine's and the runtime's config objects.

Over 500 lines: one flat list of fields, each a variable with its default and bounds (its
description, where the name does not say it all, in the docstring below it) under a ``# ---``
heading per concept: one class keeps one environment namespace (a field is its variable) and
one place docs/configuration.md is checked against."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.contract.endpoint_ceilings import (
    DESCRIPTION_MAX_CHARS_CEILING,
    EVENT_TYPES_MAX_ITEMS_CEILING,
    URL_MAX_CHARS_CEILING,
)
from worker.contract.messages import validation_problems
from worker.contract.topics import Topics, TopicSizing, topic_plan
from worker.engine.topics import TopicPlan

if TYPE_CHECKING:  # imported where used: every command reads settings, few build clients
    from worker.engine.consume_loop import LoopConfig
    from worker.engine.kafka import KafkaConfig
    from worker.runtime.logs import LogConfig

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
_C = TypeVar("_C")


# --- provider connections (credentials, mTLS, timeouts): PROVIDER_<NAME>_* ---------------------

#: An HTTP header name or auth scheme: RFC 9110 ``token`` characters only.
_HTTP_TOKEN: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
#: Headers the adapter or the HTTP client write themselves: a credential may not replace them.
_RESERVED_HEADERS: Final = frozenset(
    {"accept", "content-length", "host", "idempotency-key", "traceparent", "tracestate",
     "transfer-encoding", "user-agent"}
)  # fmt: skip


def provider_env_prefix(name: str) -> str:
    """``PROVIDER_<NAME>_``: the provider name upper-cased, every other character ``_``."""
    return "PROVIDER_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_"


class ProviderConnection(BaseModel):
    """How to reach one provider beyond its base URL: credentials, client certificate, timeouts.

    Read from ``PROVIDER_<NAME>_*`` for every name in ``PROVIDER_URLS`` (docs/operations.md,
    "Provider configuration"). Secrets are ``SecretStr`` (masked in any repr) or file paths;
    a token file is read by ``worker.auth.provider.credentials`` when the client is built.
    """

    # No input in validation errors: it would echo the credential.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    token: SecretStr | None = None
    """Credential value (prefer _FILE)."""
    token_file: Path | None = None
    """File holding the credential; re-read when it changes."""
    auth_header: str = "Authorization"
    """Header that carries the credential."""
    auth_scheme: str | None = None
    """Scheme before the credential: default `Bearer` on Authorization, none on any other header (an
    API-key header carries the bare value); empty: none."""
    client_cert_file: Path | None = None
    """mTLS certificate (PEM)."""
    client_key_file: Path | None = None
    """Its unencrypted private key (PEM); unset: in the cert file."""
    ca_file: Path | None = None
    """CA bundle that verifies the provider (unset: system CAs)."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Per-phase timeout; unset: PROVIDER_TIMEOUT_S."""
    connect_timeout_s: float | None = Field(default=None, gt=0)
    """Connect timeout; unset: the timeout above."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set TOKEN or TOKEN_FILE, not both")
        if not _HTTP_TOKEN.fullmatch(self.auth_header):
            raise ValueError("AUTH_HEADER must be an HTTP header name")
        if self.auth_header.lower() in _RESERVED_HEADERS:
            raise ValueError(f"AUTH_HEADER cannot be {self.auth_header}: the adapter sets it")
        if self.auth_scheme and not _HTTP_TOKEN.fullmatch(self.auth_scheme):
            raise ValueError("AUTH_SCHEME must be one HTTP token (e.g. Bearer)")
        if self.client_key_file is not None and self.client_cert_file is None:
            raise ValueError("CLIENT_KEY_FILE needs CLIENT_CERT_FILE")
        return self

    @classmethod
    def from_env(cls, name: str) -> ProviderConnection:
        """The ``PROVIDER_<NAME>_*`` variables of provider ``name``."""
        read = _ProviderEnv(_env_prefix=provider_env_prefix(name))
        return cls.model_validate(read.model_dump())

    @property
    def has_credential(self) -> bool:
        return self.token is not None or self.token_file is not None

    @property
    def scheme(self) -> str:
        """The scheme in force ("" for none)."""
        if self.auth_scheme is not None:
            return self.auth_scheme
        return "Bearer" if self.auth_header.lower() == "authorization" else ""

    @property
    def needs_own_client(self) -> bool:
        """TLS material or timeouts of its own: a connection pool of its own."""
        return any(
            v is not None
            for v in (self.client_cert_file, self.ca_file, self.timeout_s, self.connect_timeout_s)
        )


class _ProviderEnv(BaseSettings, ProviderConnection):
    """``ProviderConnection`` read from the environment under a per-provider prefix (a plain
    ``ProviderConnection(...)`` in code reads nothing)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, hide_input_in_errors=True)


class Settings(BaseSettings):
    """Process configuration. Build once in ``main`` and pass it down."""

    # Validation errors name the setting, never echo its value (it may be a credential).
    model_config = SettingsConfigDict(extra="ignore", hide_input_in_errors=True)

    topics: Topics = Field(default_factory=Topics)
    """Topic names (TOPIC_*)."""

    # --- Kafka ---------------------------------------------------------------------------
    kafka_bootstrap_servers: str | None = None
    """Kafka bootstrap servers. Unset: 127.0.0.1:9092 (where the dev stack starts its broker)."""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    kafka_idempotent_producer: bool = False
    """Enable on real Kafka; off for a broker without InitProducerId (the dev stack's)."""
    kafka_offset_gap_hold_s: float = Field(default=0.0, ge=0)
    """How long the consume loop and the reply reader hold back a record past an offset they never
    saw, waiting for it, before they pass the gap (logged, counted); 0: off, as Kafka needs (a fetch
    ends at the high-water mark, so there is no such gap). A broker that advances a partition's end
    before it stores the batch needs it (devstack and the tests set it)."""
    kafka_consumer_group: str = "passkey-auth-worker"
    kafka_session_timeout_ms: int = 10_000
    kafka_heartbeat_interval_ms: int = 1_000
    kafka_max_poll_records: int = 500
    kafka_fetch_max_wait_ms: int = Field(default=500, ge=1)
    """Longest a fetch waits for data. Kafka answers a fetch as soon as data arrives, so a long wait
    costs no latency there and keeps idle consumers quiet; a broker that waits the full time needs a
    short one (the dev stack, the bench and the tests set theirs: devstack/settings.py)."""
    kafka_request_timeout_ms: int = Field(default=40_000, ge=100)
    """Request timeout of every Kafka client (aiokafka's default); a produce not acknowledged in
    time is sent again while the outage lasts (worker/engine/writes.py)."""
    kafka_outage_tolerance_s: float = Field(default=300.0, gt=0)
    """How long a process rides out an unreachable or hung Kafka cluster (not ready, writes retried)
    before it exits non-zero; Kafka Streams' task.timeout.ms."""
    # --- fault containment (docs/architecture.md, "Failure handling") ---------------------
    record_max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts at a record (or a due key's follow-up) whose handling raises, before it is
    dead-lettered (or postponed); the key's lane waits meanwhile."""
    record_retry_backoff_s: float = Field(default=0.2, gt=0, le=10)
    """Pause after a record's first failed attempt, doubling up to 10x."""
    commands_partitions: int = Field(default=12, ge=1)
    other_partitions: int = Field(default=12, ge=1)

    # --- topics: the deploy step and the start-up check (worker/contract/topics.py) ---------------
    kafka_auto_create_topics: bool = False
    """Create missing topics, with their full configuration, when a process starts. Off in
    production: there `python -m worker topics create` is a deploy step and a process refuses to
    start on a missing topic; the dev stack and the tests set it."""
    kafka_replication_factor: int = Field(default=3, ge=1)
    """Replication factor of the topics `topics create` makes; the check requires at least this many
    replicas."""
    kafka_min_insync_replicas: int = Field(default=2, ge=1)
    """`min.insync.replicas` of every topic (at least this, at most the replication factor): how
    many replicas acknowledge an acks=all write."""
    kafka_retention_ms: int = Field(default=7 * 86_400_000, ge=-1)
    """`retention.ms` of the streams (commands, events, DLQs; -1 forever); the compacted topics keep
    every key's latest record instead."""
    kafka_replies_retention_ms: int = Field(default=3_600_000, ge=-1)
    """`retention.ms` of the replies topic: a reply is awaited for seconds."""

    # --- worker --------------------------------------------------------------------------
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = 9100
    worker_max_in_flight: int = Field(default=1000, ge=1)
    worker_max_in_flight_per_key: int | None = Field(default=None, ge=1)
    """The share of WORKER_MAX_IN_FLIGHT one account (lane key) may hold; a record past it pauses
    its partition alone. Unset: max(16, WORKER_MAX_IN_FLIGHT // 20)."""
    worker_commit_interval_ms: int = Field(default=200, ge=10)
    worker_shutdown_grace_s: float = Field(default=20.0, gt=0)
    worker_dedup_window: int = Field(default=8, ge=1, le=256)
    worker_accounts_per_workspace: int = Field(default=1_000_000, ge=1)
    """Live accounts one workspace may hold; a register_account for a new account past it answers
    409 workspace_account_quota_exceeded. Enforced per partition, each holding a share with headroom
    (docs/architecture.md)."""
    worker_parked_waits_max: int = Field(default=10_000, ge=1)
    """Long-polls (GET .../auth with wait_s) one worker parks at once; past it a long-poll is
    answered at once with the current state."""
    worker_parked_waits_per_workspace: int = Field(default=1_000, ge=1)
    """Long-polls of one workspace a worker parks at once (its share of WORKER_PARKED_WAITS_MAX);
    past it answered at once."""
    worker_parked_waits_per_account: int = Field(default=64, ge=1)
    """Long-polls of one account a worker parks at once; past it answered at once."""
    worker_follow_up_poll_s: float = Field(default=2.0, gt=0)
    worker_follow_up_poll_max_s: float = Field(default=30.0, gt=0)
    """Polls back off from WORKER_FOLLOW_UP_POLL_S, doubling up to this."""
    worker_follow_up_deadline_s: float = Field(default=300.0, gt=0)
    worker_command_deadline_s: float = Field(default=30.0, gt=0)
    worker_gc_threshold: int = Field(default=50_000, ge=0)
    """Generation-0 threshold of Python's cyclic GC in worker and front-end processes (0:
    interpreter default). Thousands of in-flight commands made the default 700 run the collector
    hundreds of times a second."""

    # --- worker: the write-ahead intent, for a group that mixes in workers that rely on it --
    worker_write_ahead_intent: bool = False
    """Write the confirm's intent to auth.state before every provider call, as versions before the
    hand-over end did: only while such versions still run in the group (a rolling upgrade or a
    rollback), since they re-drive a crashed confirm only by its intent (docs/operations.md,
    "Upgrading")."""

    # --- provider ------------------------------------------------------------------------
    provider_urls: dict[str, str] = Field(
        default_factory=lambda: {"simulator": "http://127.0.0.1:8090"}
    )
    provider_timeout_s: float = Field(default=5.0, gt=0)
    provider_max_attempts: int = Field(default=4, ge=1)
    provider_backoff_base_s: float = Field(default=0.05, gt=0)
    provider_backoff_max_s: float = Field(default=2.0, gt=0)
    provider_max_connections: int = Field(default=64, ge=1)
    """Connection pool size, and the bound on concurrent calls per provider (what one pool carries:
    bench/README.md)."""
    provider_breaker_threshold: int = Field(default=20, ge=1)
    provider_breaker_reset_s: float = Field(default=5.0, gt=0)
    # bounded remote answers (docs/architecture.md, "Bounded remote answers")
    provider_body_cap_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """Bytes of a provider answer read off the wire, and the most it may inflate to (gzip/deflate);
    a longer body is unusable and only its status counts."""
    # Provider connections and the production guard (docs/operations.md, "Provider
    # configuration"; worker/preflight.py).
    providers: dict[str, ProviderConnection] = Field(default_factory=dict)
    """Per-provider credentials, client certificate and timeouts: read from PROVIDER_<NAME>_* for
    each name of PROVIDER_URLS (code may pass them directly)."""
    environment: Literal["production", "development"] = "production"
    """production (the default) refuses to start a process whose Kafka or provider addresses are
    unset or loopback; the dev stack and the tests say development."""

    # --- API front-end -------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_keys_file: Path | None = None
    # API key lifecycle (worker/api/keys.py): how soon an edit of the keys file is in force.
    api_keys_reload_s: float = Field(default=2.0, ge=0)
    """The front-end checks the keys file's modification time at most this often; a disabled,
    rotated or deleted key answers 401 within it."""
    api_reply_timeout_s: float = Field(default=10.0, gt=0)
    api_long_poll_max_s: float = Field(default=30.0, ge=0, le=30)
    """The longest a GET .../auth long-poll waits on this front-end: a larger wait_s (the contract
    allows 30) is waited this long. 0: every GET answers at once."""
    api_reply_partition: int | None = Field(default=None, ge=0)
    """The auth.replies partition this front-end replica reads its replies on (every command it
    sends names it). Unset: one picked at random at start-up."""
    api_reply_partitions: int = Field(default=1, ge=1)
    """How many auth.replies partitions this replica reads, consecutive from API_REPLY_PARTITION
    (wrapping); its commands name them in turn. More than one spreads its replies, for a broker
    whose fetch cost grows with a partition's size (docs/architecture.md); more readers of a
    partition read each other's replies."""
    api_cors_origins: list[str] = Field(default_factory=list)

    # --- API front door: connection limits, rate limit, metrics listener -----------------
    # docs/operations.md, "Front-door limits".
    api_metrics_host: str = "127.0.0.1"
    """Listen address of the front-end's side door: /metrics, /healthz, /readyz (never on the public
    API port)."""
    api_metrics_port: int = Field(default=9102, ge=0)
    """Side-door port (0: any free)."""
    api_max_header_bytes: int = Field(default=16_384, ge=1024)
    """Largest request head (request line and headers) read; larger: 431 and the connection
    closed."""
    api_max_headers: int = Field(default=100, ge=8)
    """Most header fields in one request; more: 431."""
    api_head_timeout_s: float = Field(default=10.0, gt=0)
    """Longest a connection may take from opening (or from the first byte of a later request) to the
    end of the request head; slower: 408 and the connection closed."""
    api_body_timeout_s: float = Field(default=30.0, gt=0)
    """Longest a request body may take after its head; slower: 408 request_timeout, and the
    connection closed."""
    api_max_connections: int = Field(default=1000, ge=1)
    """Open connections one front-end process serves at once; more: 503 and closed at once."""
    api_max_connections_per_client: int = Field(default=100, ge=0)
    """Open connections one client address (an IPv6 client's /64) holds at once, per front-end
    process (0: no bound); more: 503 and closed at once. The address is the TCP peer's: behind a
    proxy that does not keep client addresses every client shares the proxy's, so raise it there or
    set 0."""
    api_rate_limit_per_s: float = Field(default=100.0, ge=0)
    """Per-workspace token-bucket refill rate, in requests per second, per front-end process (0: no
    rate limit). Over it: 429 rate_limited with Retry-After."""
    api_rate_limit_burst: int = Field(default=200, ge=1)
    """Per-workspace bucket size: requests allowed at once."""
    api_portal_secret: SecretStr | None = None
    """Secret the portal session tokens' signing key is derived from (the same on every front-end
    replica). Unset: derived from WEBHOOK_SECRETS_KEY; neither: no portal."""
    api_portal_session_ttl_s: float = Field(default=3600.0, ge=60, le=86_400)
    """How long a portal session lasts unless the request asks for less (at most 24 h)."""
    api_public_base_url: str | None = None
    """The front-end's public origin, e.g. https://api.example.com (http or https, host and optional
    port, no path, query or user): portal session URLs are built on it. Unset: they are relative
    (/portal#token=...). Never taken from a request's Host or forwarded headers."""
    api_idempotency_keys_per_workspace: int = Field(default=10_000, ge=1, le=1_000_000)
    """Idempotency-Keys of the last 24 h a workspace may hold, across the front-end replicas; past
    it a confirm with a new key answers 429."""
    api_idempotency_keys_max: int = Field(default=100_000, ge=1, le=10_000_000)
    """Idempotency-Keys of the last 24 h every front-end replica holds, all workspaces together
    (each replica keeps them all); past it, or past a workspace's share of it, a confirm with a new
    key answers 429."""

    # --- webhooks ------------------------------------------------------------------------
    webhook_secrets_key: SecretStr | None = None
    """Base64 of 32 bytes: the AES-GCM key that encrypts endpoint secrets at rest in the endpoints
    topic. Required by the front-end and the dispatcher."""
    webhook_secret_overlap_s: float = Field(default=86_400.0, ge=0)
    webhook_store_timeout_s: float = Field(default=5.0, gt=0)
    webhook_allow_http: bool = False
    webhook_allow_private_targets: bool = False
    webhook_consumer_group: str = "passkey-webhook-dispatcher"
    webhook_metrics_host: str = "127.0.0.1"
    webhook_metrics_port: int = 9101
    webhook_timeout_s: float = Field(default=15.0, gt=0)
    webhook_retry_schedule_s: str = Field(
        default="5,300,1800,7200,18000,36000,36000",
        pattern=r"^\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*$",
    )
    """Seconds to wait after each failed attempt (Svix's schedule); one attempt more than there are
    waits."""
    webhook_disable_after_s: float = Field(default=5 * 86_400.0, gt=0)
    # probing the endpoints the dispatcher disabled (docs/configuration.md says what each is)
    webhook_probe_first_s: float = Field(default=300.0, gt=0)
    webhook_probe_max_s: float = Field(default=6 * 3600.0, gt=0)
    webhook_probe_for_s: float = Field(default=7 * 86_400.0, gt=0)
    webhook_probe_max_in_flight: int = Field(default=16, ge=1)
    webhook_max_in_flight: int = Field(default=1000, ge=1)
    webhook_max_in_flight_per_key: int | None = Field(default=None, ge=1)
    """The share of WEBHOOK_MAX_IN_FLIGHT one lane key (an account's events, a pair's follow-ups)
    may hold; past it its partition pauses alone. Unset: max(16, WEBHOOK_MAX_IN_FLIGHT // 20)."""

    # --- quotas per workspace (webhook endpoints, replays, field sizes) ------------------
    webhook_endpoints_per_workspace: int = Field(default=16, ge=1)
    """Webhook endpoints a workspace may have (deleted ones do not count); Stripe's limit. A create
    beyond it answers create_webhook_endpoint_failed (40001)."""
    webhook_replays_per_workspace: int = Field(default=2, ge=1)
    """Replays a workspace may have in flight (running or waiting) per front-end process; its
    replays run one at a time."""
    webhook_replay_max_running: int = Field(default=2, ge=1)
    """Replays running at once per front-end process."""
    webhook_sends_per_minute: int = Field(default=30, ge=0, le=100_000)
    """Resends and test sends a workspace may queue per minute, shared out over the live front-end
    replicas (a burst of a third of it, at least 1); past it 429 rate_limited. 0: no limit."""
    webhook_replay_max_queued: int = Field(default=8, ge=0)
    """Replays waiting for a slot per front-end process."""
    webhook_url_max_chars: int = Field(default=2048, ge=16, le=URL_MAX_CHARS_CEILING)
    webhook_description_max_chars: int = Field(default=512, ge=0, le=DESCRIPTION_MAX_CHARS_CEILING)
    webhook_event_types_max_items: int = Field(default=16, ge=1, le=EVENT_TYPES_MAX_ITEMS_CEILING)
    """Entries an endpoint's event_types list may have (repeats included)."""
    # --- webhook tenant isolation (dispatcher): bounded state, each endpoint's share -------
    webhook_pair_max_pending: int = Field(default=100, ge=1)
    """Deliveries one (endpoint, account) pair may have waiting; a new one past this fails into the
    webhook DLQ (queue_full) instead of growing the record."""
    webhook_pair_max_bytes: int = Field(default=256 * 1024, ge=16 * 1024, le=900 * 1024)
    """Upper bound of one delivery-state record (the pair's JSON); a delivery that would pass it
    (less a small headroom) fails into the webhook DLQ (queue_full)."""
    webhook_max_pairs_per_endpoint: int = Field(default=1000, ge=1)
    """(endpoint, account) pairs with something pending one endpoint may have per partition of the
    delivery state; a delivery that would open one more fails into the webhook DLQ
    (endpoint_queue_full)."""
    webhook_workspace_max_pending: int = Field(default=10_000, ge=1)
    """Deliveries one workspace may have waiting in one dispatcher process, all its endpoints and
    the owned partitions together; a delivery that would pass it fails into the webhook DLQ
    (workspace_queue_full), so one workspace's failing endpoints hold a bounded part of the
    dispatcher's memory."""
    webhook_endpoint_max_in_flight: int = Field(default=32, ge=1)
    """Attempts one endpoint may have under way at once in one dispatcher process; further due
    deliveries wait without holding a lane."""
    webhook_workspace_max_in_flight: int = Field(default=64, ge=1)
    """Attempts all the endpoints of one workspace may have under way at once in one dispatcher
    process: many hanging endpoints hold no more than a few. Each holds a connection of
    WEBHOOK_MAX_CONNECTIONS, of which a workspace gets at most this and at most three sixteenths (a
    quarter kept for workspaces holding none)."""
    webhook_endpoint_backoff_after: int = Field(default=5, ge=1)
    """Failed attempts in a row after which an endpoint backs off as a whole (one probe at a time,
    pauses doubling from WEBHOOK_ENDPOINT_BACKOFF_BASE_S)."""
    webhook_timer_interval_s: float = Field(default=0.005, gt=0, le=1.0)
    """How often the dispatcher looks for due deliveries (retries, pauses that end, rate-limit
    tokens); a pair woken for a free slot at its endpoint is looked for at once
    (``ConsumeLoop.sweep_soon``)."""
    webhook_endpoint_backoff_base_s: float = Field(default=1.0, gt=0)
    webhook_endpoint_backoff_max_s: float = Field(default=60.0, gt=0)
    webhook_max_connections: int = Field(default=256, ge=1)
    """The dispatcher's HTTP connection pool, all hosts."""
    webhook_max_connections_per_host: int = Field(default=32, ge=1)
    """Connections to one host (host, port, TLS) at most, so a hanging host cannot take the pool."""
    # --- webhook delivery state (dispatcher): what a take-in writes, the log's batches ----
    webhook_take_in_hold_s: float = Field(default=2.0, ge=0, le=60.0)
    """New deliveries are kept in memory while the event's offset stays uncommitted; a pair is
    written only when a delivery of it is not attempted at once, or when an event was held this long
    (a hanging endpoint). 0: write every pair at take-in and hold nothing in memory."""
    webhook_log_flush_s: float = Field(default=0.01, ge=0, le=1.0)
    """Delivery-log entries of one endpoint written within this window go out as one record
    (webhook.deliveries); each waits for it at most this long. 0: one record per entry, sent at
    once."""

    # --- front-end reads on demand: the deliveries route's bounded scan --------------------
    webhook_deliveries_scan_records: int = Field(default=5000, ge=100, le=1_000_000)
    """How far back GET .../deliveries reads the endpoint's partition of webhook.deliveries: the
    last this many records of it (its recent deliveries among them, at most 100 shown); an endpoint
    whose deliveries are older than that in a busy partition shows fewer."""
    webhook_deliveries_scan_timeout_s: float = Field(default=3.0, gt=0, le=60.0)
    """Upper bound of one GET .../deliveries scan, waiting for a concurrent one included; past it
    the route answers get_webhook_endpoint_failed (retry)."""

    # --- process -------------------------------------------------------------------------
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """Event loop of every `python -m worker` process (worker/runtime/eventloop.py): uvloop does the
    loop's socket and callback work in C; asyncio is the standard one."""

    # --- logging -------------------------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"
    log_library_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """Level of the libraries' records (aiokafka, uvicorn, asyncio), rendered like the service's own
    lines."""
    api_access_log: bool = False
    """One log line per HTTP request of the front-end (uvicorn's)."""

    @field_validator("kafka_retention_ms", "kafka_replies_retention_ms")
    @classmethod
    def _retention_is_positive_or_forever(cls, value: int) -> int:
        if value == 0:
            raise ValueError("retention must be positive, or -1 (forever)")
        return value

    @model_validator(mode="after")
    def _key_share_within_bound(self) -> Settings:
        for bound in ("worker_max_in_flight", "webhook_max_in_flight"):
            share = getattr(self, f"{bound}_per_key")
            if share is not None and share > getattr(self, bound):
                name = bound.upper()
                raise ValueError(f"{name}_PER_KEY must not exceed {name} (it is a share of it)")
        return self

    @model_validator(mode="after")
    def _isr_within_replicas(self) -> Settings:
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError(
                "KAFKA_MIN_INSYNC_REPLICAS must not exceed KAFKA_REPLICATION_FACTOR: every "
                "acks=all write would fail"
            )
        return self

    @field_validator("api_public_base_url")
    @classmethod
    def _public_base_is_an_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        origin = value.removesuffix("/")
        parts = urlsplit(origin)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or parts.path
            or parts.query
            or parts.fragment
            or urlunsplit(parts) != origin
            or not origin.isascii()
            or any(c.isspace() or c == "\\" for c in origin)
        ):
            raise ValueError(
                "API_PUBLIC_BASE_URL must be an http(s) origin like https://api.example.com"
                " (no path, query, fragment or user)"
            )
        parts.port  # noqa: B018 - raises ValueError on a port out of range
        return origin

    @field_validator("provider_urls")
    @classmethod
    def _urls_are_http(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"provider {name!r}: base URL must be http(s), got {url!r}")
        return value

    @model_validator(mode="after")
    def _provider_connections(self) -> Self:
        """Every provider of ``PROVIDER_URLS`` gets its ``PROVIDER_<NAME>_*`` connection."""
        unknown = sorted(set(self.providers) - set(self.provider_urls))
        if unknown:
            raise ValueError(f"providers {unknown} have no base URL in PROVIDER_URLS")
        prefixes: dict[str, str] = {}
        for name in self.provider_urls:
            other = prefixes.setdefault(provider_env_prefix(name), name)
            if other != name:
                raise ValueError(
                    f"providers {other!r} and {name!r} share the variables "
                    f"{provider_env_prefix(name)}*; rename one"
                )
            if name not in self.providers:
                try:
                    self.providers[name] = ProviderConnection.from_env(name)
                except ValidationError as exc:
                    problems = "; ".join(validation_problems(exc))
                    raise ValueError(f"{provider_env_prefix(name)}*: {problems}") from None
        return self

    def provider_connection(self, name: str) -> ProviderConnection:
        """The connection settings of provider ``name`` (defaults if none were read)."""
        return self.providers.get(name) or ProviderConnection()

    @property
    def bootstrap(self) -> str:
        """The bootstrap address in force: the configured cluster, or a broker on this host."""
        return self.kafka_bootstrap_servers or DEFAULT_BOOTSTRAP

    # --- the narrow configs of the engine and the runtime, built once per process -----------

    def _narrowed(self, config: type[_C], prefix: str, **values: object) -> _C:
        """``config`` (a dataclass) with each field not in ``values`` read from the setting of
        its name after ``prefix``."""
        names = [f.name for f in dataclasses.fields(cast(Any, config)) if f.name not in values]
        return config(**values, **{n: getattr(self, prefix + n) for n in names})

    def kafka_config(self) -> KafkaConfig:
        """How this process's Kafka clients reach the cluster."""
        from worker.engine.kafka import KafkaConfig

        return self._narrowed(KafkaConfig, "kafka_", bootstrap=self.bootstrap)

    def topic_sizing(self) -> TopicSizing:
        return self._narrowed(
            TopicSizing,
            "kafka_",
            commands_partitions=self.commands_partitions,
            other_partitions=self.other_partitions,
        )

    def topic_plan(self) -> TopicPlan:
        """Every topic as ``topics create`` makes it and the start-up check expects it."""
        return topic_plan(self.topics, self.topic_sizing())

    def loop_config(self, process: Literal["worker", "dispatcher"]) -> LoopConfig:
        """The consume loop of ``process``: its inputs, changelog and bounds, and the budgets
        both loops share (a rebalance drains for the grace, at most 30 s; a failing record's
        pauses double from ``RECORD_RETRY_BACKOFF_S`` up to ten times it)."""
        from worker.engine.consume_loop import LoopConfig

        grace, backoff = self.worker_shutdown_grace_s, self.record_retry_backoff_s
        topics = self.topics
        shared = LoopConfig(
            topics=(topics.commands,),
            state_topic=topics.state,
            max_in_flight=self.worker_max_in_flight,
            max_in_flight_per_key=self.worker_max_in_flight_per_key,
            commit_interval_s=self.worker_commit_interval_ms / 1000,
            rebalance_budget_s=min(grace, 30.0),
            shutdown_grace_s=grace,
            max_poll_records=self.kafka_max_poll_records,
            record_attempts=self.record_max_attempts,
            retry_backoff_s=(backoff, backoff * 10),
        )
        if process == "worker":
            return shared
        return dataclasses.replace(
            shared,
            topics=(topics.status, topics.errors, topics.webhook_replays),
            state_topic=topics.webhook_state,
            max_in_flight=self.webhook_max_in_flight,
            max_in_flight_per_key=self.webhook_max_in_flight_per_key,
            # A pair waiting for room at its endpoint is woken through a timer: the sweep's
            # interval is the most such a wake waits.
            timer_interval_s=self.webhook_timer_interval_s,
            # 0 holds nothing in memory: the loop's default age then.
            hold_overdue_s=self.webhook_take_in_hold_s or shared.hold_overdue_s,
        )

    def log_config(self) -> LogConfig:
        from worker.runtime.logs import LogConfig

        return self._narrowed(LogConfig, "log_", access_log=self.api_access_log)
