"""Every metric the dashboard, the Prometheus rules and ``deploy/metrics.txt`` name is really
exported by a running process: ``passkey_auth_*`` by the worker, ``passkey_api_*`` by the
front-end, and by each of them ``passkey_build_info`` and prometheus_client's standard
``process_*``/``python_*`` families (``STANDARD_FAMILIES``, allowed by name rather than listed).

The ``passkey_webhook_*`` families belong to the webhook dispatcher (``python -m worker
webhooks``), whose production process tests/dispatcher/test_dispatcher_process.py scrapes:
every comparison below with a live scrape covers the ``passkey_auth_``/``passkey_api_``
prefixes alone.

tests/deploy/test_metric_names.py checks the names against the list in ``deploy/metrics.txt``;
this module checks the list against the processes. A real worker (``run_worker`` with its
probes served) and the real front-end (``serve_api``) run against the session broker. A few
commands go through Kafka so the labelled series exist (register + confirm that succeeds, a
provider fault through a ``sim-unavailable-`` ref, a malformed record), and a passkey-confirm
and a poll go through the front-end's HTTP API. Then each process' ``/metrics`` is scraped over
HTTP and parsed with prometheus_client's parser.

The front-end part is skipped only when ``worker.api.app`` is not in the tree, and never under
CI (see ``require_api`` in conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.broker import EmbeddedBroker
from tests.deploy.conftest import (
    API_KEY,
    ApiUrls,
    api_app,
    live_settings,
    require_api,
    serving_api,
    serving_worker,
    topic_namespace,
    write_api_keys,
)
from tests.deploy.test_metric_names import (
    METRICS_FILE,
    SHARED_FAMILIES,
    STANDARD_FAMILIES,
    STANDARD_LABELS,
    WORKER_API_LABELS,
    dashboard_expressions,
    exported,
    recorded,
    rule_expressions,
    scan,
)
from tests.harness import Bus, bus, confirm_cmd, register_cmd
from worker import __version__
from worker.auth.provider import BREAKER_STATES
from worker.runtime import tracing

pytestmark = pytest.mark.integration

WORKER_PREFIX = "passkey_auth_"
API_PREFIX = "passkey_api_"
WEBHOOK_PREFIX = "passkey_webhook_"  # not scraped here (module docstring)
SCRAPE_TIMEOUT_S = 60.0  # only ends a scrape that would fail anyway: a loaded machine commits later
# Labels the client library adds itself: histogram buckets.
LIBRARY_LABELS = frozenset({"le"})


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Exposition:
    """One scrape of ``/metrics``, parsed. Families without a sample (a labelled metric no
    label set was used for yet) count as not exported. The standard families are kept apart
    (``standard``: listed name -> label names), out of the product's contract."""

    types: dict[str, str] = field(default_factory=dict)  # family name -> counter/gauge/...
    samples: list[Sample] = field(default_factory=list)
    standard: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Exposition:
        exposition = cls()
        for family in text_string_to_metric_families(text):
            if not family.samples:
                continue
            listed = f"{family.name}_total" if family.type == "counter" else family.name
            if listed in STANDARD_FAMILIES:
                exposition.standard[listed] = {k for s in family.samples for k in s.labels}
                continue
            exposition.types[family.name] = family.type
            exposition.samples += [Sample(s.name, dict(s.labels), s.value) for s in family.samples]
        return exposition

    @property
    def sample_names(self) -> set[str]:
        return {s.name for s in self.samples}

    @property
    def label_names(self) -> set[str]:
        return {label for s in self.samples for label in s.labels} - LIBRARY_LABELS

    def exports(self, name: str) -> bool:
        """``name`` is a series (``passkey_auth_commands_total``, ``..._bucket``) or a histogram
        family by its base name, as ``deploy/metrics.txt`` lists histograms."""
        return name in self.sample_names or self.types.get(name) == "histogram"

    def listed_names(self) -> set[str]:
        """The exported families as ``deploy/metrics.txt`` spells them: counters by their
        ``_total`` series, histograms by their base, gauges as they are. The client's
        ``*_created`` companion series are not part of the contract."""
        names = set()
        for name, kind in self.types.items():
            if name.endswith("_created"):
                continue
            names.add(f"{name}_total" if kind == "counter" else name)
        return names

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


@dataclass(frozen=True)
class Live:
    worker: Exposition
    api: Exposition | None


def named_in_deploy() -> dict[str, set[str]]:
    """Every metric name deploy/ refers to, and where: the rules' and the dashboard's
    expressions (recording-rule outputs left out) and deploy/metrics.txt."""
    where: dict[str, set[str]] = {}
    records = recorded()
    sources = {
        "deploy/prometheus/rules": rule_expressions(),
        "deploy/grafana dashboard": dashboard_expressions(),
    }
    for source, exprs in sources.items():
        for expr in exprs:
            for name in scan(expr).metrics - records:
                where.setdefault(name, set()).add(source)
    for name in exported():
        where.setdefault(name, set()).add(METRICS_FILE.name)
    return where


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def scrape(base_url: str) -> Exposition:
    async with httpx.AsyncClient(timeout=5.0) as client:
        resp = await client.get(f"{base_url}/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain"), resp.headers
    return Exposition.parse(resp.text)


async def scrape_until_complete(base_url: str, prefix: str) -> Exposition:
    """Scrape until every name deploy/ refers to with ``prefix`` is exported, or the time is
    up (then the tests below say what is missing). Lag, for one, appears at the first commit
    after a record was processed."""
    wanted = {n for n in named_in_deploy() if n.startswith(prefix)}
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    exposition = await scrape(base_url)
    while not all(exposition.exports(n) for n in wanted) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        exposition = await scrape(base_url)
    return exposition


async def registered(b: Bus, account_id: str, ref: str) -> None:
    cmd = register_cmd(account_id, ref)
    await b.send(cmd)
    await b.wait_for(lambda: bool(b.status_events(command_id=cmd.command_id)))


async def drive_worker(b: Bus) -> None:
    """Commands through Kafka: a confirm that succeeds (and the flow's follow-up to
    authorized), a provider outage, a malformed record."""
    ok = uid("acc-ok")
    await registered(b, ok, uid("ok"))
    cmd = confirm_cmd(ok)
    await b.send(cmd)
    assert (await b.reply_to(cmd.command_id))["http_status"] == 200
    await b.wait_for(lambda: bool(b.status_events(account_id=ok, status="authorized")))

    down = uid("acc-down")
    await registered(b, down, uid("sim-unavailable"))
    cmd = confirm_cmd(down)
    await b.send(cmd)
    reply = await b.reply_to(cmd.command_id)
    assert reply["http_status"] == 502
    assert reply["body"]["error"]["numeric_code"] == 30002

    await b.send_raw(b"malformed", b"\xff not json")
    await b.wait_for(lambda: bool(b.raw.get(b.settings.topics.dlq)))


async def drive_api(b: Bus, base_url: str) -> None:
    """A passkey-confirm and a poll through the front-end, answered by the worker."""
    account = uid("acc-api")
    await registered(b, account, uid("ok"))
    headers = {"X-Api-Key": API_KEY}
    async with httpx.AsyncClient(base_url=base_url, timeout=15.0, headers=headers) as http:
        resp = await http.post(f"/v1/accounts/{account}/auth/passkey-confirm")
        assert resp.status_code == 200, resp.text
        # A query answered by the worker, behind the confirm: its outcome at once.
        resp = await http.get(f"/v1/accounts/{account}/auth")
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"]["status"] != "passkey_confirmation"
        unauthenticated = await http.get(f"/v1/accounts/{account}/auth", headers={"X-Api-Key": ""})
        assert unauthenticated.status_code == 401


@pytest.fixture(scope="module")
async def live(
    broker: EmbeddedBroker, simulator: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Live]:
    with topic_namespace() as prefix:
        settings = live_settings(
            broker,
            prefix,
            provider_urls={"simulator": simulator},
            provider_max_attempts=2,  # the outage still retries once: passkey_auth_provider_retries
            provider_backoff_base_s=0.01,
            api_reply_timeout_s=10.0,
        )
        async with contextlib.AsyncExitStack() as stack:
            b = await stack.enter_async_context(bus(settings))
            worker_url = await stack.enter_async_context(serving_worker(settings))
            api_urls: ApiUrls | None = None
            if api_app() is not None:
                keys: Path = write_api_keys(tmp_path_factory.mktemp("live-api") / "keys.json")
                api_urls = await stack.enter_async_context(serving_api(settings, keys))
            await drive_worker(b)
            if api_urls is not None:
                await drive_api(b, api_urls.api)
            worker = await scrape_until_complete(worker_url, WORKER_PREFIX)
            api = (
                None
                if api_urls is None
                else await scrape_until_complete(api_urls.metrics, API_PREFIX)
            )
            yield Live(worker, api)


# --------------------------------------------------------------------------------------------


def test_every_name_belongs_to_a_process() -> None:
    names = named_in_deploy()
    prefixes = (WORKER_PREFIX, API_PREFIX, WEBHOOK_PREFIX)
    everyones = STANDARD_FAMILIES | SHARED_FAMILIES
    assert {
        n: s for n, s in names.items() if not n.startswith(prefixes) and n not in everyones
    } == {}


def test_worker_exports_every_auth_metric_deploy_names(live: Live) -> None:
    names = named_in_deploy()
    missing = {
        n: sorted(s)
        for n, s in names.items()
        if n.startswith(WORKER_PREFIX) and not live.worker.exports(n)
    }
    assert missing == {}, "named in deploy/ but not exported by the running worker"


def test_front_end_exports_every_api_metric_deploy_names(live: Live) -> None:
    require_api()
    assert live.api is not None
    api = live.api
    names = named_in_deploy()
    missing = {
        n: sorted(s) for n, s in names.items() if n.startswith(API_PREFIX) and not api.exports(n)
    }
    assert missing == {}, "named in deploy/ but not exported by the running front-end"


def test_metrics_file_lists_exactly_what_the_processes_export(live: Live) -> None:
    """The other direction: a family added to the code must be added to deploy/metrics.txt
    (and so, by test_metric_names, to the dashboard); each process exports its prefix only,
    besides the shared and the standard families. Compares the passkey_auth_ and passkey_api_
    families only: the dispatcher's passkey_webhook_ families are checked by
    tests/dispatcher/test_dispatcher_process.py."""
    listed = exported()
    worker = live.worker.listed_names() - SHARED_FAMILIES
    assert {n for n in worker if not n.startswith(WORKER_PREFIX)} == set()
    assert worker == {n for n in listed if n.startswith(WORKER_PREFIX)}
    if live.api is None:
        require_api()
        return
    api = live.api.listed_names() - SHARED_FAMILIES
    assert {n for n in api if not n.startswith(API_PREFIX)} == set()
    assert api == {n for n in listed if n.startswith(API_PREFIX)}


def test_every_process_exports_the_standard_and_shared_families(live: Live) -> None:
    """Memory, CPU, file descriptors and GC of each process, under the client's own names and
    labels, and the build each one runs."""
    require_api()
    assert live.api is not None
    for exposition, service in (
        (live.worker, tracing.SERVICE_WORKER),
        (live.api, tracing.SERVICE_API),
    ):
        assert set(exposition.standard) == STANDARD_FAMILIES, service
        assert set().union(*exposition.standard.values()) == STANDARD_LABELS, service
        assert exposition.listed_names() >= SHARED_FAMILIES
        assert exposition.value("passkey_build_info") == 1
        assert exposition.value("passkey_build_info", service=service, version=__version__) == 1


def test_metrics_file_spells_each_family_by_its_type(live: Live) -> None:
    """Counters by their ``_total`` name, histograms by their base, gauges as they are (the
    live families: auth_ and api_)."""
    types = dict(live.worker.types)
    if live.api is not None:
        types.update(live.api.types)
    for name in exported():
        if name.startswith(WEBHOOK_PREFIX):
            continue
        if name.endswith("_total"):
            assert types.get(name.removesuffix("_total")) == "counter", name
        else:
            assert types.get(name) in {"gauge", "histogram"}, name


def test_label_contract_is_what_the_processes_use(live: Live) -> None:
    """WORKER_API_LABELS (test_metric_names.py), which the rules and the dashboard may group
    and filter by, are the labels the worker and the front-end really put on their series, no
    more, no less (the dispatcher's WEBHOOK_LABELS are not scraped here yet)."""
    require_api()
    assert live.api is not None
    assert live.worker.label_names | live.api.label_names == WORKER_API_LABELS


def test_scrape_counts_what_was_done(live: Live) -> None:
    """The series carry the values of the traffic above (exact counts of this worker)."""
    w = live.worker
    assert w.value("passkey_auth_errors_total", numeric_code="30002", http_status="502") == 1
    assert w.value("passkey_auth_errors_total", code="invalid_request", numeric_code="10000") == 1
    assert w.value("passkey_auth_dlq_records_total") == 1
    assert w.value("passkey_auth_commands_total", type="passkey_confirm", outcome="error") == 1
    assert w.value("passkey_auth_commands_total", type="unknown", outcome="invalid") == 1
    assert w.value("passkey_auth_provider_retries_total", operation="confirm_passkey") >= 1
    assert w.value("passkey_auth_status_changes_total", status="authorized") >= 1
    assert w.value("passkey_auth_worker_ready") == 1
    assert w.value("passkey_auth_worker_heartbeat_timestamp_seconds") > time.time() - 60
    # The outage command's 2 failed attempts stay under PROVIDER_BREAKER_THRESHOLD: closed,
    # and a series for each of the other states at 0.
    breaker = {
        s.labels["state"]: s.value
        for s in w.samples
        if s.name == "passkey_auth_provider_breaker_state" and s.labels["provider"] == "simulator"
    }
    assert breaker == {state: float(state == "closed") for state in BREAKER_STATES}
    if live.api is not None:
        confirm = "/v1/accounts/{account_id}/auth/passkey-confirm"
        assert live.api.value("passkey_api_requests_total", route=confirm, status="200") == 1
        assert live.api.value("passkey_api_ready") == 1
