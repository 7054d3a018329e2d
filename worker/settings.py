"""The one settings object: every knob of every process, read from the environment once.

Each field maps to an upper-case environment variable of the same name (``kafka_bootstrap_servers``
→ ``KAFKA_BOOTSTRAP_SERVERS``). The README's "Settings" table is the documentation of record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class Topics(BaseSettings):
    """Topic names; configuration, never constants in code."""

    model_config = SettingsConfigDict(env_prefix="TOPIC_", extra="ignore")

    commands: str = "auth.commands"
    state: str = "auth.state"
    status: str = "auth.status"
    errors: str = "auth.errors"
    replies: str = "auth.replies"
    dlq: str = "auth.dlq"
    webhook_endpoints: str = "webhook.endpoints"
    webhook_deliveries: str = "webhook.deliveries"
    webhook_state: str = "webhook.delivery-state"
    webhook_replays: str = "webhook.replays"
    webhook_dlq: str = "webhook.dlq"

    def all(self) -> list[str]:
        return [
            self.commands,
            self.state,
            self.status,
            self.errors,
            self.replies,
            self.dlq,
            self.webhook_endpoints,
            self.webhook_deliveries,
            self.webhook_state,
            self.webhook_replays,
            self.webhook_dlq,
        ]


#: ``KAFKA_FETCH_MAX_WAIT_MS`` for processes on the embedded broker, which holds every fetch for
#: the full wait: there the wait is per-hop latency.
EMBEDDED_FETCH_MAX_WAIT_MS: Final = 20
#: The front-end's on the embedded broker: each POST waits for its reply's fetch.
EMBEDDED_API_FETCH_MAX_WAIT_MS: Final = 10


class Settings(BaseSettings):
    """Process configuration. Build once in ``main`` and pass it down."""

    model_config = SettingsConfigDict(extra="ignore")

    topics: Topics = Field(default_factory=Topics, description="Topic names (TOPIC_*).")

    # --- Kafka ---------------------------------------------------------------------------
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers. Unset: 127.0.0.1:9092 (the dev stack starts its "
        "embedded broker there).",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    kafka_idempotent_producer: bool = Field(
        default=False, description="Enable on real Kafka; the embedded broker does not support it."
    )
    kafka_consumer_group: str = "passkey-auth-worker"
    kafka_session_timeout_ms: int = 10_000
    kafka_heartbeat_interval_ms: int = 1_000
    kafka_max_poll_records: int = 500
    kafka_fetch_max_wait_ms: int = Field(
        default=500,
        ge=1,
        description="Longest a fetch waits for data. Kafka answers a fetch as soon as data "
        "arrives, so a long wait costs no latency there and keeps idle consumers quiet; the "
        "embedded broker always waits the full time, so whatever runs against it (devstack, "
        "the bench, the tests) sets a short one (EMBEDDED_FETCH_MAX_WAIT_MS).",
    )
    kafka_request_timeout_ms: int = Field(
        default=40_000,
        ge=100,
        description="Request timeout of every Kafka client (aiokafka's default); a produce not "
        "acknowledged in time is sent again while the outage lasts (worker/outage.py).",
    )
    kafka_outage_tolerance_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a process rides out an unreachable or hung Kafka cluster (not "
        "ready, writes retried) before it exits non-zero; Kafka Streams' task.timeout.ms.",
    )
    commands_partitions: int = Field(default=12, ge=1)
    other_partitions: int = Field(default=12, ge=1)

    # --- worker --------------------------------------------------------------------------
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = 9100
    worker_max_in_flight: int = Field(default=1000, ge=1)
    worker_commit_interval_ms: int = Field(default=200, ge=10)
    worker_shutdown_grace_s: float = Field(default=20.0, gt=0)
    worker_dedup_window: int = Field(default=8, ge=1, le=256)
    worker_follow_up_poll_s: float = Field(default=2.0, gt=0)
    worker_follow_up_poll_max_s: float = Field(
        default=30.0,
        gt=0,
        description="Polls back off from WORKER_FOLLOW_UP_POLL_S, doubling up to this.",
    )
    worker_follow_up_deadline_s: float = Field(default=300.0, gt=0)
    worker_command_deadline_s: float = Field(default=30.0, gt=0)
    worker_gc_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Generation-0 threshold of Python's cyclic GC in worker and front-end "
        "processes (0: interpreter default). Thousands of in-flight commands made the default "
        "700 run the collector hundreds of times a second.",
    )

    # --- provider ------------------------------------------------------------------------
    provider_urls: dict[str, str] = Field(
        default_factory=lambda: {"simulator": "http://127.0.0.1:8090"}
    )
    provider_timeout_s: float = Field(default=5.0, gt=0)
    provider_http_client: Literal["aiohttp", "httpx"] = Field(
        default="aiohttp",
        description="HTTP client of the provider adapters: aiohttp costs about a fifth of "
        "httpx's CPU per request (worker/provider/transport.py).",
    )
    provider_max_attempts: int = Field(default=4, ge=1)
    provider_backoff_base_s: float = Field(default=0.05, gt=0)
    provider_backoff_max_s: float = Field(default=2.0, gt=0)
    provider_max_connections: int = Field(
        default=64,
        ge=1,
        description="Connection pool size, and the bound on concurrent calls per provider "
        "(64 connections carry ~3,000 calls/s at 20 ms).",
    )
    provider_breaker_threshold: int = Field(default=20, ge=1)
    provider_breaker_reset_s: float = Field(default=5.0, gt=0)

    # --- API front-end -------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_keys_file: Path | None = None
    api_reply_timeout_s: float = Field(default=10.0, gt=0)
    api_reply_partition: int | None = Field(
        default=None,
        ge=0,
        description="The auth.replies partition this front-end replica reads its replies on "
        "(every command it sends names it). Unset: one picked at random at start-up.",
    )
    api_cors_origins: list[str] = Field(default_factory=list)

    # --- webhooks ------------------------------------------------------------------------
    webhook_secrets_key: SecretStr | None = Field(
        default=None,
        description="Base64 of 32 bytes: the AES-GCM key that encrypts endpoint secrets at rest "
        "in the endpoints topic. Required by the front-end and the dispatcher.",
    )
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
        description="Seconds to wait after each failed attempt (Svix's schedule); one attempt "
        "more than there are waits.",
    )
    webhook_disable_after_s: float = Field(default=5 * 86_400.0, gt=0)
    webhook_max_in_flight: int = Field(default=1000, ge=1)

    # --- webhook tenant isolation (dispatcher): bounded state, each endpoint's share -------
    webhook_pair_max_pending: int = Field(
        default=100,
        ge=1,
        description="Deliveries one (endpoint, account) pair may have waiting; a new one past "
        "this fails into the webhook DLQ (queue_full) instead of growing the record.",
    )
    webhook_pair_max_bytes: int = Field(
        default=256 * 1024,
        ge=16 * 1024,
        le=900 * 1024,
        description="Upper bound of one delivery-state record (the pair's JSON); a delivery "
        "that would pass it (less a small headroom) fails into the webhook DLQ (queue_full).",
    )
    webhook_endpoint_max_in_flight: int = Field(
        default=32,
        ge=1,
        description="Attempts one endpoint may have under way at once in one dispatcher "
        "process; further due deliveries wait without holding a lane.",
    )
    webhook_endpoint_backoff_after: int = Field(
        default=5,
        ge=1,
        description="Failed attempts in a row after which an endpoint backs off as a whole "
        "(one probe at a time, pauses doubling from WEBHOOK_ENDPOINT_BACKOFF_BASE_S).",
    )
    webhook_timer_interval_s: float = Field(
        default=0.005,
        gt=0,
        le=1.0,
        description="How often the dispatcher looks for due deliveries; also the most a pair "
        "woken for a free slot at its endpoint waits to run.",
    )
    webhook_endpoint_backoff_base_s: float = Field(default=1.0, gt=0)
    webhook_endpoint_backoff_max_s: float = Field(default=60.0, gt=0)
    webhook_max_connections: int = Field(
        default=256, ge=1, description="The dispatcher's HTTP connection pool, all hosts."
    )
    webhook_max_connections_per_host: int = Field(
        default=32,
        ge=1,
        description="Connections to one host (host, port, TLS) at most, so a hanging host "
        "cannot take the pool.",
    )

    # --- process -------------------------------------------------------------------------
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="Event loop of every `python -m worker` process (worker/eventloop.py): "
        "uvloop does the loop's socket and callback work in C; asyncio is the standard one.",
    )

    # --- logging -------------------------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"

    @field_validator("provider_urls")
    @classmethod
    def _urls_are_http(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"provider {name!r}: base URL must be http(s), got {url!r}")
        return value

    @property
    def bootstrap(self) -> str:
        """The bootstrap address in force: the configured cluster, or a broker on this host."""
        return self.kafka_bootstrap_servers or DEFAULT_BOOTSTRAP
