"""Settings of the development tools: the product's ``Settings`` plus the embedded broker's port
and the provider simulator's knobs, which production processes have no use for.

Each field maps to the upper-case environment variable of its name, like every other setting
(docs/configuration.md).
"""

from __future__ import annotations

from typing import Final

from pydantic import Field, SecretStr

from worker.settings import Settings

__all__ = [
    "EMBEDDED_API_FETCH_MAX_WAIT_MS",
    "EMBEDDED_DISPATCHER_FETCH_MAX_WAIT_MS",
    "EMBEDDED_FETCH_MAX_WAIT_MS",
    "EMBEDDED_OFFSET_GAP_HOLD_S",
    "EMBEDDED_PARTITIONS",
    "DevSettings",
]

#: ``KAFKA_FETCH_MAX_WAIT_MS`` for processes on the embedded broker, where a fetch whose pass
#: finds nothing sleeps half its remaining wait before it looks again: there the wait is
#: per-hop latency.
EMBEDDED_FETCH_MAX_WAIT_MS: Final = 20
#: The front-end's on the embedded broker: each POST waits for its reply's fetch.
EMBEDDED_API_FETCH_MAX_WAIT_MS: Final = 10
#: The dispatcher's on the embedded broker: webhooks are off the confirm's path, and each
#: fetch that finds data costs that broker what the fetched topic holds, so the reader of the
#: busiest topic (auth.status) fetching less often is what lets ``make run`` hold 50 confirms a
#: second for 30 minutes (bench/README.md, "Soak"). A webhook leaves up to half of it later.
EMBEDDED_DISPATCHER_FETCH_MAX_WAIT_MS: Final = 5000
#: ``KAFKA_OFFSET_GAP_HOLD_S`` on the embedded broker: it advances a partition's end before it
#: stores the batch, so a reader must wait for an offset it skipped (docs/architecture.md,
#: "The embedded broker"). The product's default is 0: Kafka has no such gap.
EMBEDDED_OFFSET_GAP_HOLD_S: Final = 1.0
#: ``COMMANDS_PARTITIONS`` and ``OTHER_PARTITIONS`` of the dev stack: the embedded broker's cost
#: per data-bearing fetch grows with what the fetched partition holds, so at 12 a topic
#: ``make run`` saturated it within minutes at 50 confirms a second; at 48 it held 30 minutes
#: (bench/README.md, "Soak").
EMBEDDED_PARTITIONS: Final = 48


class DevSettings(Settings):
    """``Settings`` for ``python -m devstack`` processes and the tests that start them."""

    embedded_broker_port: int = 9092
    # The development tools talk to the embedded broker: a wait there is per-hop latency.
    kafka_fetch_max_wait_ms: int = Field(default=EMBEDDED_FETCH_MAX_WAIT_MS, ge=1)
    kafka_offset_gap_hold_s: float = Field(default=EMBEDDED_OFFSET_GAP_HOLD_S, ge=0)
    commands_partitions: int = Field(default=EMBEDDED_PARTITIONS, ge=1)
    other_partitions: int = Field(default=EMBEDDED_PARTITIONS, ge=1)
    dispatcher_fetch_max_wait_ms: int = Field(
        default=EMBEDDED_DISPATCHER_FETCH_MAX_WAIT_MS,
        ge=1,
        description="The dev stack's dispatcher's KAFKA_FETCH_MAX_WAIT_MS on the embedded "
        "broker: webhooks are off the confirm's path, so it can fetch less often than the "
        "worker.",
    )
    # One broker, topics made on demand: the stack and the tests create what they use.
    kafka_auto_create_topics: bool = True
    kafka_replication_factor: int = Field(default=1, ge=1)
    kafka_min_insync_replicas: int = Field(default=1, ge=1)

    simulator_host: str = "127.0.0.1"
    simulator_port: int = 8090
    simulator_latency_ms: float = Field(default=20.0, ge=0)
    simulator_jitter_ms: float = Field(default=5.0, ge=0)
    simulator_error_rate: float = Field(default=0.0, ge=0, le=1)
    simulator_authorize_delay_s: float = Field(default=2.0, ge=0)
    simulator_slow_ms: float = Field(default=300.0, ge=0)
    simulator_token: SecretStr | None = Field(
        default=None, description="Required credential of every provider call (unset: none)."
    )
    simulator_auth_header: str = Field(
        default="Authorization",
        description="Where the credential is expected: Authorization (as Bearer) or an "
        "API-key header (the bare value).",
    )

    receiver_host: str = "127.0.0.1"
    receiver_port: int = 8070
    receiver_schema_check: bool = Field(
        default=True,
        description="The demo receiver checks each body against its published schema where "
        "jsonschema is installed (the dev lock); the load benchmarks turn it off, as make run's "
        "runtime lock has it off, so they measure the stack and not the check.",
    )

    @property
    def bootstrap(self) -> str:
        """The configured cluster, or the embedded broker on ``EMBEDDED_BROKER_PORT``."""
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.embedded_broker_port}"
