"""The alert rules fire in a real Prometheus server scraping a real worker.

promtool's unit tests (deploy/prometheus/tests) feed the rules hand-written series; here the
series come from the running processes, so a rule that names a label value the worker never
uses (``type="passkey_confirm"``, ``code="provider_unavailable"``) or a label it never sets
would be caught.

Set-up: the worker (``run_worker``, probes served) and, when it is in the tree, the front-end,
against the session broker and the provider simulator; a Prometheus server (the Debian binary)
on a free loopback port with a generated configuration: scrape and evaluation interval 1 s,
both jobs with ``namespace="passkey-e2e"`` as the cluster's relabelling would set, storage in a
temporary directory that is removed at the end.

**Accelerated rules.** The project's alerts wait minutes (``for: 5m``) over 5-15 minute windows.
Prometheus loads a generated copy of deploy/prometheus/rules in which every duration, the
``for:`` of each alert and the range windows (and offsets) of every expression, is divided by
``SPEEDUP`` (a minute becomes a second), with windows kept at ``MIN_WINDOW_S`` or more so
``rate()`` always sees several scrapes. Nothing else changes: names, labels, annotations and the
expressions' text with the durations masked are identical, which
``test_accelerated_rules_keep_the_expressions`` asserts; promtool checks the copy.

Then two malformed records (each one a DLQ record and a 400 invalid_request 10000) and a
scripted burst of ``passkey_confirm`` commands on ``sim-unavailable-`` accounts (each one 502
provider_unavailable 30002) run until Prometheus' own rule evaluation, polled on
``/api/v1/alerts``, reports PasskeyProviderUnavailable (numeric_code 30002) and
PasskeyDLQGrowing firing (bounded by ``ALERT_TIMEOUT_S``). ``sum by (numeric_code)
(passkey_auth_errors_total)`` on ``/api/v1/query`` must then return exactly the errors caused,
and no other alert may be pending or firing.

The second malformed record is sent only once Prometheus has scraped the first: the worker
creates a labelled series at its first increment, with value 1, and ``increase()``/``rate()``
cannot count a series' first value, so a single DLQ record after a worker start never fires
PasskeyDLQGrowing (the same holds for the first error of each code in the error-rate alerts,
which sustained error rates make irrelevant there).

Without the ``prometheus`` binary the test is skipped, and fails under CI (conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from devstack.broker import free_port
from tests.deploy.conftest import (
    api_app,
    serving_api,
    serving_worker,
    write_api_keys,
)
from tests.harness import Bus, bus, confirm_cmd, register_cmd
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))

SPEEDUP = 60  # a minute of the project's rules becomes a second
MIN_WINDOW_S = 4  # at 1 s scrapes, rate() over a window sees at least four samples
INTERVAL = "1s"
NAMESPACE = "passkey-e2e"

# Failing confirms are spread over a few accounts (one lane each) of two kinds: the provider
# is down (502 provider_unavailable 30002, after a retry), or the account names a provider the
# worker has no adapter for (502 provider_adapter_not_found 30004, without a call).
DOWN_ACCOUNTS = 4
UNKNOWN_PROVIDER_ACCOUNTS = 2
UNKNOWN_PROVIDER = "no-such-provider"
BURST_INTERVAL_S = 0.25
ALERT_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 30.0

EXPECTED_ALERTS = frozenset(
    {"PasskeyProviderUnavailable", "PasskeyErrorRateHigh", "PasskeyDLQGrowing"}
)
API_ALERTS = frozenset({"PasskeyApiNoReadyInstances", "PasskeyReplyTimeouts"})
# The webhook dispatcher is not run by this test (it is built on another branch): its absence
# fires this alert (absent(passkey_webhook_dispatcher_ready{job="passkey-webhooks"})), as it should.
DISPATCHER_ABSENT_ALERTS = frozenset({"PasskeyWebhookNoReadyDispatchers"})

# --- accelerated copy of the rules ------------------------------------------------------------

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_UNIT_MS["y"] = 365 * _UNIT_MS["d"]
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
# Durations inside a range or subquery selector ([5m], [1h:1m]) and after `offset`.
_RANGE = re.compile(rf"\[\s*({_DURATION})\s*(?::\s*({_DURATION})?\s*)?\]")
_OFFSET = re.compile(rf"(\boffset\s+-?)({_DURATION})\b")


def duration_ms(text: str) -> int:
    parts = _DURATION_PART.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(int(n) * _UNIT_MS[u] for n, u in parts)


def format_ms(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def shorten(text: str, *, floor_s: int = 0) -> str:
    """``text`` divided by ``SPEEDUP``, at least ``floor_s`` seconds and never below 1 s."""
    return format_ms(max(duration_ms(text) // SPEEDUP, floor_s * 1000, 1000))


def accelerate_expr(expr: str) -> str:
    def window(match: re.Match[str]) -> str:
        rng, step = match.group(1), match.group(2)
        out = shorten(rng, floor_s=MIN_WINDOW_S)
        return f"[{out}:{shorten(step)}]" if step else f"[{out}]"

    expr = _RANGE.sub(window, expr)
    return _OFFSET.sub(lambda m: m.group(1) + shorten(m.group(2)), expr)


def mask_durations(expr: str) -> str:
    """The expression with its durations replaced by a placeholder: its shape."""
    expr = _RANGE.sub(lambda m: "[D:D]" if m.group(2) else "[D]", expr)
    return _OFFSET.sub(lambda m: m.group(1) + "D", expr)


def accelerated(groups: dict[str, Any]) -> dict[str, Any]:
    """A copy of one rule file's content with every ``for:`` and window shortened."""
    out = copy.deepcopy(groups)
    for group in out["groups"]:
        assert "interval" not in group, "a group interval would need accelerating too"
        for rule in group["rules"]:
            rule["expr"] = accelerate_expr(str(rule["expr"]))
            if "for" in rule:
                rule["for"] = shorten(str(rule["for"]))
            assert "keep_firing_for" not in rule, "keep_firing_for would need accelerating too"
    return out


def accelerated_rule_files() -> dict[str, str]:
    """File name -> YAML text of the accelerated copy of each rule file."""
    return {
        path.name: yaml.safe_dump(accelerated(yaml.safe_load(path.read_text())), sort_keys=False)
        for path in RULE_FILES
    }


def test_accelerated_rules_keep_the_expressions() -> None:
    for path in RULE_FILES:
        original = yaml.safe_load(path.read_text())
        fast = accelerated(original)
        for group, fast_group in zip(original["groups"], fast["groups"], strict=True):
            assert group["name"] == fast_group["name"]
            for rule, fast_rule in zip(group["rules"], fast_group["rules"], strict=True):
                assert set(rule) == set(fast_rule)
                for key in set(rule) - {"expr", "for"}:
                    assert rule[key] == fast_rule[key], (path.name, key)
                expr, fast_expr = str(rule["expr"]), str(fast_rule["expr"])
                assert mask_durations(expr) == mask_durations(fast_expr)
                if "for" in rule:
                    assert duration_ms(fast_rule["for"]) < duration_ms(rule["for"])


@pytest.mark.parametrize(
    ("expr", "fast"),
    [
        ("rate(x_total[5m])", "rate(x_total[5s])"),
        ("delta(x[10m]) > 0 and y offset 1h", "delta(x[10s]) > 0 and y offset 60s"),
        ("max_over_time(rate(x[2m])[30m:1m])", "max_over_time(rate(x[4s])[30s:1s])"),
        ("rate(x[1h30m]) > 60 and time() - y > 300", "rate(x[90s]) > 60 and time() - y > 300"),
    ],
)
def test_accelerate_expr(expr: str, fast: str) -> None:
    assert accelerate_expr(expr) == fast


def test_rules_have_no_string_the_accelerator_could_misread() -> None:
    """The regexes do not parse PromQL: a quoted value holding ``[`` or ``offset`` would be
    rewritten too. The project's rules have none."""
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for value in re.findall(r'"[^"]*"|\'[^\']*\'|`[^`]*`', str(rule["expr"])):
                    assert "[" not in value and "offset" not in value, (rule, value)


def test_promtool_accepts_the_accelerated_rules(promtool: str, tmp_path: Path) -> None:
    paths = []
    for name, text in accelerated_rule_files().items():
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    check(promtool, "check", "rules", *paths)


# --- the Prometheus server --------------------------------------------------------------------


def check(promtool: str, *args: str | Path) -> None:
    proc = subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def prometheus_config(targets: dict[str, str], rule_files: list[str]) -> dict[str, Any]:
    """One static target per job (job name -> host:port), labelled like the cluster's."""
    return {
        "global": {
            "scrape_interval": INTERVAL,
            "scrape_timeout": INTERVAL,
            "evaluation_interval": INTERVAL,
        },
        "rule_files": rule_files,
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}],
            }
            for job, target in targets.items()
        ],
    }


@dataclass
class PrometheusServer:
    base_url: str
    directory: Path
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


@contextlib.contextmanager
def prometheus_server(
    binary: str, promtool: str, targets: dict[str, str]
) -> Iterator[PrometheusServer]:
    """A Prometheus process on a free loopback port, its config, the accelerated rules and its
    TSDB in a fresh temporary directory; the process is stopped (SIGTERM, then SIGKILL) and the
    directory removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="passkey-prometheus-e2e-"))
    try:
        rules = directory / "rules"
        rules.mkdir()
        for name, text in accelerated_rule_files().items():
            (rules / name).write_text(text)
        config = directory / "prometheus.yml"
        files = [str(rules / name) for name in sorted(p.name for p in RULE_FILES)]
        config.write_text(yaml.safe_dump(prometheus_config(targets, files), sort_keys=False))
        check(promtool, "check", "config", config)
        port = free_port()
        log = directory / "prometheus.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    "--storage.tsdb.retention.time=1h",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=info",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=directory,
            )
        try:
            yield PrometheusServer(f"http://127.0.0.1:{port}", directory, process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class PromApi:
    """The HTTP API of the running server, with bounded polling."""

    def __init__(self, server: PrometheusServer, client: httpx.AsyncClient) -> None:
        self.server = server
        self.client = client

    async def get(self, path: str, **params: str) -> Any:
        resp = await self.client.get(f"{self.server.base_url}{path}", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = (await self.get("/api/v1/alerts"))["alerts"]
        return alerts

    async def query(self, promql: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    async def until(self, what: str, check: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        """Await ``check()`` until it returns something truthy; fail with the server's log."""
        deadline = time.monotonic() + timeout
        while True:
            if self.server.process.poll() is not None:
                pytest.fail(f"prometheus exited:\n{self.server.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                found = await check()
                if found:
                    return found
            if time.monotonic() > deadline:
                rules = await self.get("/api/v1/rules")
                pytest.fail(
                    f"{what}: not after {timeout:g} s\nrules: {rules}\n"
                    f"log:\n{self.server.log_tail()}"
                )
            await asyncio.sleep(0.25)

    async def ready(self) -> None:
        async def up() -> bool:
            resp = await self.client.get(f"{self.server.base_url}/-/ready")
            return resp.status_code == 200

        await self.until("prometheus ready", up, WAIT_TIMEOUT_S)

    async def targets_up(self, jobs: set[str]) -> None:
        async def up() -> bool:
            targets = (await self.get("/api/v1/targets"))["activeTargets"]
            healthy = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            return healthy == jobs

        await self.until(f"targets {sorted(jobs)} up", up, WAIT_TIMEOUT_S)


def by_state(alerts: list[dict[str, Any]], state: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for alert in alerts:
        if alert["state"] == state:
            out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
    return out


# --- the end-to-end test ----------------------------------------------------------------------


async def registered_accounts(b: Bus, n: int, *, provider: str = "simulator") -> list[str]:
    """``n`` accounts at the challenge whose confirms fail: on the simulator with a
    ``sim-unavailable-`` ref, or with a provider the worker has no adapter for."""
    accounts = [f"acc-{provider}-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    commands = [register_cmd(a, f"sim-unavailable-{a}", provider=provider) for a in accounts]
    for cmd in commands:
        await b.send(cmd)
    await b.wait_for(
        lambda: all(b.status_events(command_id=c.command_id) for c in commands), WAIT_TIMEOUT_S
    )
    return accounts


async def api_scrapes(prom: PromApi) -> dict[str, Any]:
    """Whether a scrape of the front-end failed, and whether it ever reported not ready, over
    the test's span: what tells a missed scrape from a front-end that was not ready."""
    missed = await prom.query('min_over_time(up{job="passkey-api"}[10m]) == 0')
    not_ready = await prom.query('min_over_time(passkey_api_ready{job="passkey-api"}[10m]) == 0')
    return {"missed": missed, "not_ready": not_ready}


def dlq_reason(b: Bus) -> str:
    """The ``dlq.reason`` header of the records the worker dead-lettered (one reason)."""
    reasons = {
        dict(headers)["dlq.reason"].decode() for _, _, headers in b.raw[b.settings.topics.dlq]
    }
    assert len(reasons) == 1, reasons
    return reasons.pop()


@pytest.mark.slow
@pytest.mark.integration
async def test_failing_commands_fire_the_alerts_in_prometheus(
    make_settings: Callable[..., Settings],
    simulator: str,
    prometheus_bin: str,
    promtool: str,
    tmp_path: Path,
) -> None:
    settings = make_settings(
        provider_urls={"simulator": simulator},
        provider_max_attempts=2,
        provider_backoff_base_s=0.01,
        worker_metrics_host="127.0.0.1",
        worker_metrics_port=free_port(),
    )
    with_api = api_app() is not None
    async with contextlib.AsyncExitStack() as stack:
        b = await stack.enter_async_context(bus(settings))
        worker_url = await stack.enter_async_context(serving_worker(settings))
        targets = {"passkey-worker": worker_url.removeprefix("http://")}
        if with_api:
            keys = write_api_keys(tmp_path / "keys.json")
            api = await stack.enter_async_context(serving_api(settings, keys))
            targets["passkey-api"] = api.metrics.removeprefix("http://")
        down = await registered_accounts(b, DOWN_ACCOUNTS)
        unknown = await registered_accounts(b, UNKNOWN_PROVIDER_ACCOUNTS, provider=UNKNOWN_PROVIDER)

        with prometheus_server(prometheus_bin, promtool, targets) as server:
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=5.0))
            prom = PromApi(server, client)  # closed with the stack, after the server stops
            await prom.ready()
            await prom.targets_up(set(targets))
            # What may be active with nothing wrong: the absence of the processes this test
            # does not run.
            at_rest = (
                DISPATCHER_ABSENT_ALERTS if with_api else DISPATCHER_ABSENT_ALERTS | API_ALERTS
            )

            # Until a process's first scrape its ready gauge is absent, so the rules' absent()
            # arms go pending from Prometheus' first evaluation, and fire when that scrape comes
            # later than the accelerated ``for`` (3 s), as PasskeyApiNoReadyInstances did on a
            # slow machine (no scrape failed, the front-end never reported not ready). The
            # burst starts once the rules were evaluated with every scraped series: a process
            # that is not ready keeps its alert active, and this wait fails.
            async def settled() -> bool:
                return {a["labels"]["alertname"] for a in await prom.alerts()} <= at_rest

            await prom.until("only the alerts of absent processes active", settled, WAIT_TIMEOUT_S)

            # Two malformed records (PasskeyDLQGrowing, and 400 invalid_request 10000 each),
            # the second once Prometheus has scraped the first: the worker creates the
            # reason's series at its first record, with value 1, and increase() cannot see a
            # series' first value.
            await b.send_raw(b"malformed", b"\xff not json")

            async def dlq_scraped() -> bool:
                return bool(await prom.query("passkey_auth_dlq_records_total == 1"))

            await prom.until("first DLQ record scraped", dlq_scraped, WAIT_TIMEOUT_S)
            await b.send_raw(b"malformed", b"\xff still not json")

            # The burst: failing confirms, alternately of each kind, until Prometheus reports
            # every expected alert firing.
            sent: list[str] = []
            sent_unknown: list[str] = []
            seen_firing: dict[str, list[dict[str, str]]] = {}
            deadline = time.monotonic() + ALERT_TIMEOUT_S
            # Until every expected alert fired; others may fire as well (the dispatcher's
            # absence), so not "while the fired ones are a proper subset of the expected".
            while not EXPECTED_ALERTS.issubset(seen_firing):
                if time.monotonic() > deadline:
                    rules = await prom.get("/api/v1/rules")
                    pytest.fail(
                        f"{sorted(EXPECTED_ALERTS - set(seen_firing))} not firing after"
                        f" {ALERT_TIMEOUT_S:g} s and {len(sent) + len(sent_unknown)} failing"
                        f" confirms\nrules: {rules}\n{server.log_tail()}"
                    )
                n = len(sent) + len(sent_unknown)
                if n % 2:
                    cmd = confirm_cmd(unknown[len(sent_unknown) % UNKNOWN_PROVIDER_ACCOUNTS])
                    sent_unknown.append(cmd.command_id)
                else:
                    cmd = confirm_cmd(down[len(sent) % DOWN_ACCOUNTS])
                    sent.append(cmd.command_id)
                await b.send(cmd)
                await asyncio.sleep(BURST_INTERVAL_S)
                for name, labels in by_state(await prom.alerts(), "firing").items():
                    seen_firing.setdefault(name, labels)

            # Every command the burst sent is answered with its error.
            every = [*sent, *sent_unknown]
            await b.wait_for(lambda: all(b.replies(command_id=c) for c in every), WAIT_TIMEOUT_S)
            for ids, numeric_code in ((sent, 30002), (sent_unknown, 30004)):
                answers = {
                    (r["http_status"], r["body"]["error"]["numeric_code"])
                    for c in ids
                    for r in b.replies(command_id=c)
                }
                assert answers == {(502, numeric_code)}
            await b.wait_for(lambda: len(b.raw.get(settings.topics.dlq, [])) == 2, WAIT_TIMEOUT_S)

            # Prometheus counts exactly the errors caused, by numeric_code (the worker creates
            # the series of every error it can produce at zero, so the rest read 0).
            expected = {"30002": float(len(sent)), "30004": float(len(sent_unknown)), "10000": 2.0}

            async def errors_counted() -> dict[str, float] | None:
                result = await prom.query("sum by (numeric_code) (passkey_auth_errors_total) > 0")
                counts = {r["metric"]["numeric_code"]: float(r["value"][1]) for r in result}
                return counts if counts == expected else None

            assert await prom.until(
                f"passkey_auth_errors_total by numeric_code == {expected}",
                errors_counted,
                WAIT_TIMEOUT_S,
            )
            confirms = await prom.query(
                'sum by (outcome) (passkey_auth_commands_total{type="passkey_confirm"})'
            )
            assert {r["metric"]["outcome"]: float(r["value"][1]) for r in confirms} == {
                "error": float(len(sent) + len(sent_unknown))
            }

            # The alerts, as Prometheus' own evaluation of the (accelerated) rules had them.
            assert seen_firing["PasskeyProviderUnavailable"] == [
                {
                    "alertname": "PasskeyProviderUnavailable",
                    "namespace": NAMESPACE,
                    "numeric_code": "30002",
                    "severity": "critical",
                }
            ]
            assert seen_firing["PasskeyErrorRateHigh"] == [
                {
                    "alertname": "PasskeyErrorRateHigh",
                    "namespace": NAMESPACE,
                    "code": "provider_adapter_not_found",
                    "numeric_code": "30004",
                    "severity": "critical",
                }
            ]
            [dlq_alert] = seen_firing["PasskeyDLQGrowing"]
            assert dlq_alert["namespace"] == NAMESPACE
            assert dlq_alert["reason"] == dlq_reason(b)
            # Nothing else fired or is about to: workers and front-end ready, no lag, no stall,
            # no reply timeout (and no webhook alert but the dispatcher's absence).
            alerts = await prom.alerts()
            active = {a["labels"]["alertname"] for a in alerts} | set(seen_firing)
            allowed = EXPECTED_ALERTS | at_rest
            scrapes = await api_scrapes(prom) if with_api else {}
            if scrapes.get("missed") and not scrapes.get("not_ready"):
                # A scrape of the in-process front-end that overran the 1 s timeout leaves
                # passkey_api_ready absent for a moment, and the rule's absent() arm goes pending on
                # that alone; the front-end itself never reported not ready.
                allowed |= {"PasskeyApiNoReadyInstances"}
            assert active - allowed == set(), (alerts, scrapes)

        assert server.process.returncode is not None
        assert not server.directory.exists()
