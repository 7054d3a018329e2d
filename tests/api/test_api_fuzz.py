"""Property-based fuzzing of the live front-end from the committed ``schemas/openapi.json``.

schemathesis' own runner (``schemathesis run``, in a subprocess) with every check and every
phase: the document's examples, coverage (boundary values, each required header missing, every
method the document does not declare on each path), fuzzing (valid and invalid requests) and
the stateful phase, which follows the document's links (create an endpoint, then get, change,
rotate, replay, delete it; send it a test, read the log and that delivery, resend it: the
configuration gives it 60 scenarios of 30 steps and leaves out schemathesis' guessed links). It
sends over loopback HTTP to the app served by uvicorn in this event loop, backed by the real
broker, worker and provider simulator. A 5xx, a status or header the document does not state, a
schema-valid body refused, an invalid one accepted, a missing key not answered 401, an undeclared
method not answered 405 with ``Allow``, a deleted endpoint still served: all fail the test. The
configuration (``tests/api/schemathesis.toml``, shared with the long run against ``make run``)
switches off one check for one method, with its reason: ``use_after_free`` for ``OPTIONS``,
which answers for the route, not the endpoint.

The front-end is configured as ``make run`` is, where that matters to the contract: no
per-workspace rate limit (it would answer the fuzzer 429, documented but testing nothing), and
private webhook targets allowed (the address policy is the one rule the document states in
words, not in the ``pattern``; the committed document is the production one, ``https`` only, so
``http`` stays refused). The resend and test-send budget is off (429 again). The endpoint quota
is raised so that the fuzzing phase's creates do not leave the stateful phase nothing to
create; writes stay bounded by the example count.

Bounded: ``API_FUZZ_MAX_EXAMPLES`` (default 15) cases per operation and phase, and a wall-clock
cap on the subprocess; ``API_FUZZ_MAX_TIME_S`` (unset by default) makes it a timed run instead,
in which fuzzing and the stateful phase repeat until the time is spent (the long run:
``API_FUZZ_MAX_TIME_S=150``). ``API_FUZZ_SEED`` replays a run.
"""

from __future__ import annotations

import asyncio
import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import httpx
import pytest
import schemathesis
from prometheus_client import CollectorRegistry
from schemathesis.core.result import Ok

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, register, running_api, running_worker
from worker.api.event_types import EVENT_TYPES_PATH
from worker.api.routes import ACCOUNT_AUTH, PASSKEY_CONFIRM
from worker.api.webhooks.delivery_routes import WEBHOOK_DELIVERY, WEBHOOK_RESEND, WEBHOOK_TEST
from worker.api.webhooks.follow_routes import ACCOUNT_EVENTS, WEBHOOK_REPLAY_STATUS
from worker.api.webhooks.routes import WEBHOOK_DELIVERIES, WEBHOOK_ENDPOINT, WEBHOOK_ENDPOINTS
from worker.webhooks.secrets_box import generate_key

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COMMITTED = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"
CONFIG = Path(__file__).with_name("schemathesis.toml")
PHASES = "examples,coverage,fuzzing,stateful"
MAX_EXAMPLES = int(os.environ.get("API_FUZZ_MAX_EXAMPLES", "15"))
MAX_TIME_S = float(os.environ.get("API_FUZZ_MAX_TIME_S", "0"))
SEED = int(os.environ.get("API_FUZZ_SEED", "20261125"))
#: The subprocess is killed past this, whatever it is doing (a bound, not an expectation).
WALL_CLOCK_S = max(MAX_TIME_S * 2, 0) + 300
#: The document's example account (``AccountId``): registered, so the examples phase confirms
#: a real account.
EXAMPLE_ACCOUNT = "acc_demo_1"
#: schemathesis' checks (``schemathesis run --help``), all on by default.
EVERY_CHECK = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
    "object_level_authorization",
)


def schemathesis_command(base_url: str, reports: Path) -> list[str]:
    """``schemathesis run`` with every check and phase over the committed document."""
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        str(COMMITTED),
        "--url",
        base_url,
        # Every check is on by default; ``--checks all`` would also override the one
        # exception the configuration makes (a check named on the command line wins).
        "--phases",
        PHASES,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        # One worker thread: on CPython 3.11 two threads in ast.parse (hypothesis describing a
        # lambda) can fail with "SystemError: AST constructor recursion depth mismatch".
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--generation-database",
        "none",
        "--report",
        "junit",
        "--report-junit-path",
        str(reports / "junit.xml"),
    ]
    if MAX_TIME_S > 0:
        command += ["--max-time", f"{MAX_TIME_S:g}"]
    return command


def requests_answered(registry: CollectorRegistry) -> Counter[tuple[str, str, str]]:
    """The front-end's own count of what it answered: (route, method, status) → requests."""
    answered: Counter[tuple[str, str, str]] = Counter()
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "passkey_api_requests_total":
                labels = sample.labels
                answered[(labels["route"], labels["method"], labels["status"])] += int(sample.value)
    return answered


async def test_schemathesis_with_every_check_and_phase_finds_nothing(
    api_settings: ApiSettings, simulator: str, tmp_path: Path
) -> None:
    settings = api_settings(
        provider_urls={"simulator": simulator},
        api_reply_timeout_s=10.0,
        api_rate_limit_per_s=0,
        webhook_secrets_key=generate_key(),
        webhook_allow_private_targets=True,
        webhook_endpoints_per_workspace=10_000,
        webhook_sends_per_minute=0,
        # Long-polls wait at most half a second here: the fuzzer asks for up to 30 s on an
        # account that does not change, which the document allows and the run cannot afford.
        api_long_poll_max_s=0.5,
    )
    registry = CollectorRegistry()
    async with running_worker(settings), running_api(settings, registry=registry) as api:
        # Real accounts, so confirms reach the worker and the provider (200 and 409 paths).
        for i, account in enumerate((EXAMPLE_ACCOUNT, "acc_fuzz_1", "acc_fuzz_2")):
            await register(settings, account, f"ok-fuzz-{i}")
        process = await asyncio.create_subprocess_exec(
            *schemathesis_command(api.url, tmp_path),
            cwd=tmp_path,
            env={**os.environ, "API_FUZZ_KEY": KEY_A},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), WALL_CLOCK_S)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        report = output.decode(errors="replace")
        print(report)
        async with httpx.AsyncClient(base_url=api.url) as http:
            assert (await http.get("/healthz")).status_code == 200
        assert api.replies.pending == 0

    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0"), report[-6000:]
    assert process.returncode == 0, report[-6000:]

    # What the front-end itself answered: the run reached the behaviour it claims to test.
    answered = requests_answered(registry)
    print(sorted(answered.items()))
    assert sum(answered.values()) > 25 * MAX_EXAMPLES
    server_errors = {k: n for k, n in answered.items() if k[2].startswith("5")}
    assert not server_errors  # healthy accounts only: not even a documented 5xx
    by_status = Counter[str]()
    for (_, _, status), n in answered.items():
        by_status[status] += n
    assert by_status["405"] > 0  # the coverage phase's undeclared methods
    assert answered[(ACCOUNT_AUTH, "OPTIONS", "204")] > 0  # plain OPTIONS: Allow
    assert answered[(PASSKEY_CONFIRM, "POST", "200")] > 0  # the document's example account
    assert answered[(EVENT_TYPES_PATH, "GET", "200")] > 0
    # schema-valid URLs are accepted, and the stateful phase follows the links to them
    assert answered[(WEBHOOK_ENDPOINTS, "POST", "201")] > 0
    assert answered[(WEBHOOK_ENDPOINT, "GET", "200")] > 0
    assert answered[(WEBHOOK_ENDPOINT, "PATCH", "200")] > 0
    assert answered[(WEBHOOK_ENDPOINT, "DELETE", "204")] > 0
    # the new routes were reached: a replay's status through the replay's links
    assert answered[(WEBHOOK_REPLAY_STATUS, "GET", "200")] > 0
    assert sum(n for (route, _, _), n in answered.items() if route == ACCOUNT_EVENTS) > 0
    # the delivery routes, reached through the links: create → a test send → the log, that
    # delivery (both ids from the test send's answer) → its resend. How often the phase
    # carries both ids to the last two steps is up to schemathesis' draws (1 to 11 in the runs
    # that tuned this), so they are asserted reached, not reached with a delivery;
    # tests/api/webhooks/test_delivery_routes.py walks that chain on every run.
    assert answered[(WEBHOOK_TEST, "POST", "202")] > 0
    assert answered[(WEBHOOK_DELIVERIES, "GET", "200")] > 0
    assert (
        sum(n for (route, m, _), n in answered.items() if (route, m) == (WEBHOOK_DELIVERY, "GET"))
        > 0
    )
    assert (
        sum(n for (route, m, _), n in answered.items() if (route, m) == (WEBHOOK_RESEND, "POST"))
        > 0
    )


def test_the_committed_document_loads_with_its_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast, no server: schemathesis reads every operation of the committed document and the
    links the stateful phase follows, and the configuration switches off one check for
    OPTIONS alone."""
    monkeypatch.setenv("API_FUZZ_KEY", KEY_A)
    config = schemathesis.Config.from_path(CONFIG)
    schema = schemathesis.openapi.from_path(COMMITTED, config=config)
    ops = [op.ok() for op in schema.get_all_operations() if isinstance(op, Ok)]
    # 6 auth/probe operations, 14 webhook ones and their 11 preflights, the event catalogue
    # and its preflight, a portal session, its revocations (one, all) and their 2 preflights;
    # a replay's status and cancel, an account's events and their 3 preflights
    assert len(ops) == 44
    create = next(op for op in ops if op.label == f"POST {WEBHOOK_ENDPOINTS}")
    links = create.definition.raw["responses"]["201"]["links"]
    targets = {link["operationId"] for link in links.values()}
    by_id = {op.definition.raw["operationId"] for op in ops}
    assert targets <= by_id and len(targets) == 10
    replay = next(op for op in ops if op.definition.raw["operationId"] == "replayWebhookEvents")
    followed = {
        link["operationId"] for link in replay.definition.raw["responses"]["202"]["links"].values()
    }
    assert followed == {"getWebhookReplay", "cancelWebhookReplay"} <= by_id
    events = next(op for op in ops if op.definition.raw["operationId"] == "listAccountEvents")
    accepted = schema.config.checks_config_for(operation=events, phase="fuzzing")
    assert "400" in accepted.positive_data_acceptance.expected_statuses
    # create → test → the log → one delivery → resend (the stateful chain)
    test = next(op for op in ops if op.label == f"POST {WEBHOOK_TEST}")
    chained = {
        link["operationId"] for link in test.definition.raw["responses"]["202"]["links"].values()
    }
    assert chained == {"getWebhookDelivery", "resendWebhookDelivery", "listWebhookDeliveries"}
    delivery = next(op for op in ops if op.label == f"GET {WEBHOOK_DELIVERY}")
    onward = delivery.definition.raw["responses"]["200"]["links"]
    assert onward["ResendWebhookDelivery"]["parameters"] == {
        "endpoint_id": "$request.path.endpoint_id",
        "delivery_id": "$response.body#/data/delivery_id",
    }
    # The stateful phase follows the document's links only (no guessed ones), in scenarios
    # long enough for create → test → delivery → resend.
    stateful = schema.config.phases.stateful
    assert stateful.max_steps == 30
    assert stateful.generation.max_examples == 60
    assert [str(a) for a in stateful.inference.algorithms] == ["location-headers"]
    for op in ops:
        for phase in (None, "coverage", "fuzzing", "stateful"):
            checks = schema.config.checks_config_for(operation=op, phase=phase)
            for name in EVERY_CHECK:
                expected = name != "use_after_free" or op.method.upper() != "OPTIONS"
                assert checks.get_by_name(name=name).enabled == expected, (op.label, name)
