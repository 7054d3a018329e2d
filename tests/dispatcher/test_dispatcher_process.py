"""The dispatcher as its production process (``python -m worker webhooks``): its probes on
the metrics port, the ``passkey_webhook_`` families of ``deploy/metrics.txt`` exported live with the
build and the standard process families (the deploy checks scrape the worker and the
front-end only), a clean exit on SIGTERM, and a
missing secrets key that ends the process at once instead of leaving it half started."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SettingsFactory
from tests.deploy.test_metric_names import (
    METRICS_FILE,
    SHARED_FAMILIES,
    STANDARD_FAMILIES,
    STANDARD_LABELS,
    WEBHOOK_LABELS,
)
from tests.harness import REPO
from tests.webhooks.processes import (
    DispatcherPool,
    dispatcher_env,
    dispatcher_settings,
    wait_status,
)
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    new_account,
    publish_events,
    receiving,
    status_event,
    wait_until,
)
from worker import __version__
from worker.engine.runner import shutdown_hard_limit
from worker.runtime import tracing

pytestmark = pytest.mark.integration

PREFIX = "passkey_webhook_"
READY_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 20.0
#: Labels the client library adds itself (histogram buckets).
LIBRARY_LABELS = frozenset({"le"})


def listed() -> set[str]:
    """The dispatcher's families as deploy/metrics.txt names them (its own and the shared)."""
    return {n for n in METRICS_FILE.read_text().split() if n.startswith(PREFIX)} | SHARED_FAMILIES


class Scrape:
    """One ``/metrics`` answer, parsed. A family without samples (a labelled one no label set
    was used for yet) counts as not exported. The standard families are kept apart
    (``standard``: name -> label names)."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.labels: set[str] = set()
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.standard: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            if not family.samples:
                continue
            listed = f"{family.name}_total" if family.type == "counter" else family.name
            if listed in STANDARD_FAMILIES:
                self.standard[listed] = {k for s in family.samples for k in s.labels}
                continue
            self.types[family.name] = family.type
            for s in family.samples:
                self.labels |= set(s.labels) - LIBRARY_LABELS
                self.values[(s.name, frozenset(s.labels.items()))] = s.value

    def names(self) -> set[str]:
        """Counters by their ``_total`` series, histograms by their base, gauges as they are;
        the client's ``*_created`` companions are not part of the contract."""
        return {
            f"{name}_total" if kind == "counter" else name
            for name, kind in self.types.items()
            if not name.endswith("_created")
        }

    def value(self, name: str, **labels: str) -> float:
        return sum(
            v
            for (n, ls), v in self.values.items()
            if n == name and all((k, want) in ls for k, want in labels.items())
        )


async def scrape(url: str) -> Scrape:
    async with httpx.AsyncClient(timeout=5.0) as client:
        resp = await client.get(f"{url}/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain"), resp.headers
    return Scrape(resp.text)


async def test_probes_metrics_and_clean_stop(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(make_settings)
    receiver = Receiver()
    pool = DispatcherPool(settings, 1, tmp_path)
    try:
        async with receiving(receiver), endpoint_store(settings) as store:
            _, secret = await create_endpoint(store, "ws_a", receiver.url)
            receiver.secrets.append(secret)
            proc = pool.start(0)
            url = pool.url(0)
            await wait_status(f"{url}/readyz", 200, time.monotonic() + READY_TIMEOUT_S, proc)
            health = await wait_status(f"{url}/healthz", 200, time.monotonic() + 5, proc)
            assert health.json()["status"] == "ok"

            # One delivery, so the labelled series (lag per partition) exist too.
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(lambda: len(receiver.verified_once()) == 1, timeout=30)
            wanted = listed()
            deadline = time.monotonic() + SCRAPE_TIMEOUT_S
            metrics = await scrape(url)
            while not wanted <= metrics.names() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                metrics = await scrape(url)

        assert metrics.names() - wanted == set(), "exported but not in deploy/metrics.txt"
        assert wanted - metrics.names() == set(), "in deploy/metrics.txt but not exported"
        assert metrics.labels == WEBHOOK_LABELS
        assert set(metrics.standard) == STANDARD_FAMILIES
        assert set().union(*metrics.standard.values()) == STANDARD_LABELS
        build = {"service": tracing.SERVICE_WEBHOOKS, "version": __version__}
        assert metrics.value("passkey_build_info", **build) == 1
        for name in wanted:  # the list spells each family by its type
            if name.endswith("_total"):
                assert metrics.types[name.removesuffix("_total")] == "counter", name
            else:
                assert metrics.types[name] in {"gauge", "histogram"}, name
        assert metrics.value("passkey_webhook_deliveries_taken_in_total") == 1
        assert (
            metrics.value("passkey_webhook_attempts_total", result="delivered", status_class="2xx")
            == 1
        )
        assert metrics.value("passkey_webhook_dispatcher_ready") == 1
        assert (
            metrics.value("passkey_webhook_dispatcher_heartbeat_timestamp_seconds")
            > time.time() - 60
        )

        started = time.monotonic()
        code = pool.signal(0, signal.SIGTERM)
        took = time.monotonic() - started
        assert code == 0, pool.log_tail(0)
        # Idle, alone in its group: the drain has nothing to wait for, so the whole stop fits
        # in the drain's own grace, far inside the watchdog's hard limit.
        assert (
            took
            < settings.worker_shutdown_grace_s
            < shutdown_hard_limit(settings.worker_shutdown_grace_s)
        ), took
    finally:
        pool.close()


def test_missing_secrets_key_exits_non_zero_at_once(make_settings: SettingsFactory) -> None:
    settings = dispatcher_settings(make_settings)
    env = dispatcher_env(settings.model_copy(update={"webhook_secrets_key": None}), 0)
    assert "WEBHOOK_SECRETS_KEY" not in env
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "webhooks"],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=30,
        check=False,
    )
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode != 0, output
    assert "WEBHOOK_SECRETS_KEY is not set" in output, output
    took = time.monotonic() - started
    print(f"exit {done.returncode} after {took:.1f} s: {output.splitlines()[-1]}")
