"""What ``make run`` sets for the embedded broker (devstack/settings.py): the partition counts
a 30-minute soak at 50 confirms a second held with (bench/README.md, "Soak"), the fetch waits
and the gap watch, so that ``python -m bench.soak`` at its defaults runs ``make run``'s
stack as it is."""

from __future__ import annotations

from bench.soak import build_parser, stack_env
from devstack.settings import (
    EMBEDDED_DISPATCHER_FETCH_MAX_WAIT_MS,
    EMBEDDED_OFFSET_GAP_HOLD_S,
    EMBEDDED_PARTITIONS,
    DevSettings,
)
from worker.contract.topics import topic_specs
from worker.settings import Settings


def test_the_dev_stack_sets_what_the_embedded_broker_needs() -> None:
    dev, product = DevSettings(), Settings()
    assert dev.commands_partitions == dev.other_partitions == EMBEDDED_PARTITIONS == 48
    assert product.commands_partitions == product.other_partitions == 12
    assert {s.partitions for s in topic_specs(dev.topics, dev.topic_sizing())} >= {48}
    assert dev.dispatcher_fetch_max_wait_ms == EMBEDDED_DISPATCHER_FETCH_MAX_WAIT_MS == 5000
    assert dev.kafka_offset_gap_hold_s == EMBEDDED_OFFSET_GAP_HOLD_S > 0


def test_the_soak_runs_the_dev_stack_at_its_defaults() -> None:
    """No partition count or fetch wait of the soak's own: the stack's are make run's."""
    assert stack_env(build_parser().parse_args([])) == {}
