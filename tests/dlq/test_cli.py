"""``python -m worker dlq list|show|redrive`` against the real (embedded) broker.

The test writes the dead letters itself, as the record contract says the worker and the
dispatcher write them (docs/operations.md, "Dead letters"): several reasons, keys and ages,
with and without ``dlq.source``, a null value, a binary value, a 300 KB header, and hostile
ones (non-UTF-8 key and headers, terminal escapes, malformed or foreign ``dlq.source``, a
source partition the topic does not have, forged ``dlq.*`` headers among the original's).
Every command goes through ``worker.cli.main`` (on a thread: it runs its own event loop), and
once through a subprocess.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog

from devstack.broker import EmbeddedBroker, free_port
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from tests.harness import REPO
from worker.cli import build_parser, main
from worker.contract.topics import Topics
from worker.engine.catch_up import catch_up
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import assign_all
from worker.settings import Settings

pytestmark = pytest.mark.integration

_seq = itertools.count()
HUGE = b"h" * 300_000
BINARY = bytes(range(256))
TRACE = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")


@dataclass(frozen=True)
class Letter:
    """One dead letter the test writes: where (``webhook``: the webhook DLQ), what, how old."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    age: timedelta
    webhook: bool = False


def dlq(
    reason: bytes | str,
    source: bytes | str | None,
    *original: tuple[str, bytes | None],
    detail: bytes = b"could not decode",
    exception: str | None = None,
) -> list[tuple[str, bytes | None]]:
    """The headers of a record-fault dead letter: the original's, then the engine's."""

    def as_bytes(v: bytes | str) -> bytes:
        return v if isinstance(v, bytes) else v.encode()

    headers = [*original, ("dlq.reason", as_bytes(reason)), ("dlq.detail", detail)]
    if source is not None:
        headers.append(("dlq.source", as_bytes(source)))
    if exception is not None:
        headers += [
            ("dlq.exception", exception.encode()),
            ("dlq.fingerprint", b"0123456789abcdef"),
            ("dlq.attempts", b"3"),
        ]
    return headers


def letters(t: Topics) -> dict[str, Letter]:
    """The data set, by name. Ages: three older than an hour, the rest younger."""
    m = timedelta(minutes=1)
    return {
        # partition 0 of the auth DLQ
        "json": Letter(0, b"acc_1", b'{"type": "passkey_confirm",', dlq(
            "not_json", f"{t.commands}:0:5", TRACE, ("reply-partition", b"2")), 180 * m),
        "forged": Letter(0, b"acc_2", b"[]", dlq(
            "not_object", f"{t.commands}:1:7",
            TRACE, ("dlq.reason", b"forged"), ("dlq.source", f"{t.state}:0:0".encode()),
        ), 120 * m),
        "poison": Letter(0, b"acc_1", BINARY, dlq(
            "handler_failed", f"{t.commands}:2:9", TRACE, ("x-huge", HUGE),
            exception="RecursionError",
        ), 30 * m),
        # partition 1
        "null": Letter(1, b"acc_3", None, dlq("invalid", f"{t.commands}:7:1"), 20 * m),
        "nosource": Letter(1, b"acc_4", b"x", dlq("unknown_type", None), 10 * m),
        "hostile": Letter(1, b"\xff\xfeacc", b"\x1b[31mred", dlq(
            b"\xff\xfe", b"\xff:0:1", ("x-null", None),
            detail=b"\x1b]0;pwned\x07 evil\n\ttabs"), 5 * m),
        # partition 2
        "malformed": Letter(2, b"acc_5", b"{}", dlq("invalid", "no-numbers-here"), 4 * m),
        "negative": Letter(2, b"acc_5", b"{}", dlq("invalid", f"{t.commands}:-1:3"), 3 * m),
        "state": Letter(2, b"acc_6", b"{}", dlq("invalid", f"{t.state}:0:1"), 2 * m),
        # the webhook DLQ: a failed delivery and an event the dispatcher could not process
        "delivery": Letter(0, b"acc_1", b'{"type": "auth.status_changed"}', [
            ("webhook.id", b"msg_1"), ("webhook.endpoint", b"ep_1"),
            ("webhook.event_type", b"auth.status_changed"), ("webhook.attempts", b"8"),
            ("webhook.last_status", b"503"), ("webhook.last_error", b""), TRACE,
        ], 60 * m, webhook=True),
        "event": Letter(1, b"acc_7", b"not json", dlq(
            "not_json", f"{t.status}:1:3", TRACE), 30 * m, webhook=True),
    }  # fmt: skip


AUTH = {"json", "forged", "poison", "null", "nosource", "hostile", "malformed", "negative", "state"}


@dataclass
class DataSet:
    settings: Settings
    letters: dict[str, Letter]
    at: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """name → (DLQ topic, partition, offset) as written."""

    def name(self, topic: str, partition: int, offset: int) -> str:
        for name, where in self.at.items():
            if where == (topic, partition, offset):
                return name
        raise AssertionError(f"{topic}:{partition}:{offset} was not written by the test")

    def pos(self, name: str) -> str:
        _, partition, offset = self.at[name]
        return f"{partition}:{offset}"


def env_settings(mp: pytest.MonkeyPatch, broker: EmbeddedBroker) -> Settings:
    """A fresh TOPIC_* namespace and the broker in the environment, where ``main`` reads
    them, and the same as a Settings object."""
    prefix = f"dlq{os.getpid()}_{next(_seq)}"
    for name in Topics.model_fields:
        mp.setenv(f"TOPIC_{name.upper()}", f"{prefix}.{name}")
    mp.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    mp.setenv("KAFKA_FETCH_MAX_WAIT_MS", str(EMBEDDED_FETCH_MAX_WAIT_MS))
    mp.setenv("KAFKA_OFFSET_GAP_HOLD_S", str(EMBEDDED_OFFSET_GAP_HOLD_S))
    mp.setenv("COMMANDS_PARTITIONS", "3")
    mp.setenv("OTHER_PARTITIONS", "3")
    mp.setenv("LOG_LEVEL", "WARNING")
    mp.setenv("LOG_FORMAT", "console")
    settings = Settings()
    assert settings.topics.dlq == f"{prefix}.dlq"
    return settings


async def seed(settings: Settings) -> DataSet:
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    data = DataSet(settings, letters(settings.topics))
    now = datetime.now(UTC)
    producer = build_producer(settings.kafka_config(), max_request_size=2 * 1024 * 1024)
    await producer.start()
    try:
        for name, d in data.letters.items():
            topic = settings.topics.webhook_dlq if d.webhook else settings.topics.dlq
            meta = await producer.send_and_wait(
                topic,
                d.value,
                key=d.key,
                partition=d.partition,
                headers=d.headers,
                timestamp_ms=int((now - d.age).timestamp() * 1000),
            )
            data.at[name] = (topic, meta.partition, meta.offset)
    finally:
        await producer.stop()
    return data


async def read_all(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` (group-less, to the high-water marks)."""
    consumer = build_consumer(settings.kafka_config())
    await consumer.start()
    got: list[Any] = []
    try:
        tps = await assign_all(consumer, topic)
        await catch_up(consumer, tps, lambda _, rs: got.extend(rs))
    finally:
        await consumer.stop()
    return got


@pytest.fixture(scope="module")
def module_env(broker: EmbeddedBroker) -> Iterator[tuple[pytest.MonkeyPatch, Settings]]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp, env_settings(mp, broker)


@pytest.fixture(scope="module")
async def data(module_env: tuple[pytest.MonkeyPatch, Settings]) -> DataSet:
    """The data set, written once for the read-only tests of this module."""
    return await seed(module_env[1])


@pytest.fixture
async def fresh(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> DataSet:
    """The data set in a namespace of its own, for a test that redrives."""
    return await seed(env_settings(monkeypatch, broker))


@pytest.fixture(autouse=True)
def _session_log_config() -> Iterator[None]:
    """``main`` configures structlog for its process, printing to the ``sys.stderr`` of the
    moment (the capture of this test): the session's configuration is put back after each
    test, so later tests do not log into a closed capture."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    """``python -m worker dlq ...`` in-process; its event loop runs on a thread."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["dlq", *args])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


async def listed(data: DataSet, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    run = await cli(capsys, "list", "--json", *args)
    assert run.code == 0, run.err
    return [data.name(o["topic"], o["partition"], o["offset"]) for o in run.json_lines()]


# --- list -----------------------------------------------------------------------------------


async def test_list_reads_every_dead_letter_partition_by_partition(
    data: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    names = await listed(data, capsys)
    assert names == [n for n in data.letters if n in AUTH]  # partition, then offset order
    assert await listed(data, capsys, "--topic", "webhook") == ["delivery", "event"]


async def test_a_slow_first_fetch_is_not_an_empty_partition(
    data: DataSet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded broker holds every fetch for the full wait: with a wait longer than a
    replay's idle poll, no partition has answered when the first poll comes back empty."""
    monkeypatch.setenv("KAFKA_FETCH_MAX_WAIT_MS", "700")
    assert await listed(data, capsys, "--topic", "webhook") == ["delivery", "event"]
    run = await cli(capsys, "show", "--topic", "webhook", data.pos("event"))
    assert run.code == 0, run.err


async def test_list_json_fields(data: DataSet, capsys: pytest.CaptureFixture[str]) -> None:
    run = await cli(capsys, "list", "--json")
    by_name = {data.name(o["topic"], o["partition"], o["offset"]): o for o in run.json_lines()}
    t = data.settings.topics
    poison = by_name["poison"]
    assert poison["reason"] == "handler_failed"
    assert poison["key"] == {"utf8": "acc_1", "size": 5, "truncated": False}
    assert poison["source"] == f"{t.commands}:2:9"
    assert (poison["exception"], poison["fingerprint"], poison["attempts"]) == (
        "RecursionError", "0123456789abcdef", "3",
    )  # fmt: skip
    assert poison["value_bytes"] == 256
    assert by_name["forged"]["reason"] == "not_object"
    assert by_name["forged"]["source"] == f"{t.commands}:1:7"
    assert by_name["null"]["value_bytes"] is None
    hostile = by_name["hostile"]
    assert hostile["key"]["base64"] == base64.b64encode(b"\xff\xfeacc").decode()
    assert hostile["reason"] == "hex:fffe"
    assert hostile["source"] is None
    assert hostile["source_header"] == "hex:ff3a303a31"
    # a day's worth of clock skew at most between the broker's timestamps and ours
    poison_time = datetime.fromisoformat(poison["timestamp"])
    assert abs(datetime.now(UTC) - timedelta(minutes=30) - poison_time) < timedelta(minutes=5)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--reason", "not_json"], ["json"]),
        (["--reason", "not_json", "--reason", "handler_failed"], ["json", "poison"]),
        (["--reason", "forged"], []),
        (["--reason", "invalid"], ["null", "malformed", "negative", "state"]),
        (["--key", "acc_1"], ["json", "poison"]),
        (["--key", "acc_5", "--key", "acc_3"], ["null", "malformed", "negative"]),
        (["--key", "acc_none"], []),
        (["--since", "1h"], ["poison", "null", "nosource", "hostile", "malformed", "negative",
                             "state"]),
        (["--until", "1h"], ["json", "forged"]),
        (["--since", "150m", "--until", "90m"], ["forged"]),
        (["--source-topic", "commands"], ["json", "forged", "poison", "null"]),
        (["--source-topic", "state"], ["state"]),
        (["--source-topic", "status"], []),
        (["--key", "acc_1", "--reason", "handler_failed", "--since", "1h"], ["poison"]),
        (["--limit", "2"], ["json", "forged"]),
        (["--topic", "webhook", "--reason", "delivery_failed"], ["delivery"]),
        (["--topic", "webhook", "--source-topic", "status"], ["event"]),
    ],
)  # fmt: skip
async def test_list_filters(
    data: DataSet, capsys: pytest.CaptureFixture[str], args: list[str], expected: list[str]
) -> None:
    assert await listed(data, capsys, *args) == expected


async def test_list_absolute_times(data: DataSet, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    since = (now - timedelta(minutes=150)).isoformat()
    until = (now - timedelta(minutes=90)).strftime("%Y-%m-%dT%H:%M:%S")  # no zone: UTC
    assert await listed(data, capsys, "--since", since, "--until", until) == ["forged"]


async def test_list_says_when_the_limit_cut_it(
    data: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = await cli(capsys, "list", "--limit", "2")
    assert run.code == 0
    assert "2 of 3 records" in run.err  # stopped at the third match, which is not listed
    assert "--limit 2, more records match" in run.err
    exact = await cli(capsys, "list", "--reason", "invalid", "--limit", "4")
    assert "4 of 9 records" in exact.err
    assert "more records match" not in exact.err


async def test_list_lines_are_terminal_safe(
    data: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = await cli(capsys, "list")
    assert run.code == 0
    header, *lines = run.out.splitlines()
    assert header.split("\t")[:3] == ["at", "time", "reason"]
    assert len(lines) == len(AUTH)
    assert all(c.isprintable() or c == "\t" for line in lines for c in line)
    hostile = next(line for line in lines if line.startswith(data.pos("hostile") + "\t"))
    fields = hostile.split("\t")
    assert len(fields) == 7
    assert fields[2:5] == ["hex:fffe", "hex:fffe616363", "hex:ff3a303a31"]
    assert fields[6] == "\\x1b]0;pwned\\x07 evil\\n\\ttabs"
    poison = next(line for line in lines if line.startswith(data.pos("poison") + "\t"))
    assert poison.split("\t")[2:6] == [
        "handler_failed", "acc_1", f"{data.settings.topics.commands}:2:9", "RecursionError",
    ]  # fmt: skip


# --- show -----------------------------------------------------------------------------------


async def test_show_renders_headers_and_a_binary_value(
    data: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = await cli(capsys, "show", data.pos("poison"))
    assert run.code == 0, run.err
    assert "reason     handler_failed" in run.out
    assert "  dlq.exception: RecursionError" in run.out
    assert "value      256 bytes, not UTF-8, base64" in run.out
    encoded = run.out.split("value      256 bytes, not UTF-8, base64\n")[1]
    assert base64.b64decode("".join(encoded.split())) == BINARY
    assert len(run.out) < 10_000  # the 300 KB header is cut
    assert "  x-huge: " + "h" * 1024 + "…" in run.out
    full = await cli(capsys, "show", data.pos("poison"), "--full")
    assert "  x-huge: " + HUGE.decode() + "\n" in full.out


async def test_show_json(data: DataSet, capsys: pytest.CaptureFixture[str]) -> None:
    run = await cli(capsys, "show", data.pos("poison"), "--json")
    [shown] = run.json_lines()
    assert base64.b64decode(shown["value"]["base64"]) == BINARY
    names = [name for name, _ in shown["headers"]]
    assert names == [name for name, _ in data.letters["poison"].headers]
    huge = dict(shown["headers"])["x-huge"]
    assert (huge["size"], huge["truncated"], len(huge["utf8"])) == (300_000, True, 1024)
    full = (await cli(capsys, "show", data.pos("poison"), "--json", "--full")).json_lines()[0]
    assert dict(full["headers"])["x-huge"]["utf8"] == HUGE.decode()


async def test_show_hostile_and_null(data: DataSet, capsys: pytest.CaptureFixture[str]) -> None:
    run = await cli(capsys, "show", data.pos("hostile"))
    assert run.code == 0, run.err
    assert "\x1b" not in run.out and "\x07" not in run.out
    assert "value      8 bytes, UTF-8\n\\x1b[31mred" in run.out
    assert "  x-null: null" in run.out
    assert "key        hex:fffe616363" in run.out
    null = await cli(capsys, "show", data.pos("null"))
    assert "value      null" in null.out


async def test_show_of_a_webhook_dead_letter(
    data: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = await cli(capsys, "show", "--topic", "webhook", data.pos("delivery"))
    assert run.code == 0, run.err
    assert "reason     delivery_failed" in run.out
    assert "  webhook.endpoint: ep_1" in run.out
    assert '{"type": "auth.status_changed"}' in run.out


async def test_show_of_nothing(data: DataSet, capsys: pytest.CaptureFixture[str]) -> None:
    _, partition, offset = data.at["state"]
    for at in (f"{partition}:{offset + 1}", f"{partition}:{10**15}", "9:0"):
        run = await cli(capsys, "show", at)
        assert run.code == 1
        assert f"no record at {at}" in run.err
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["dlq", "show", "0:-1"])
    assert exited.value.code == 2


async def test_a_missing_topic_or_broker_is_one_line(
    data: DataSet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await cli(capsys, "list", "--topic", "no.such.topic")
    assert run.code == 1
    # said at once from the cluster's topic list, not after waiting for partitions
    assert "dlq: no.such.topic: LookupError: the cluster has no topic 'no.such.topic'" in run.err
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    run = await cli(capsys, "list")
    assert run.code == 1
    # aiokafka's own error line may come first (one log stream: worker/runtime/logs.py)
    assert run.err.splitlines()[-1].startswith(
        f"dlq: {data.settings.topics.dlq}: KafkaConnectionError"
    )
    assert "Traceback" not in run.err


# --- redrive --------------------------------------------------------------------------------


async def test_redrive_needs_dry_run_or_yes() -> None:
    for args in (["dlq", "redrive"], ["dlq", "redrive", "--dry-run", "--yes"]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(args)
        assert exited.value.code == 2


async def test_redrive_dry_run_writes_nothing(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    t = fresh.settings.topics
    run = await cli(capsys, "redrive", "--dry-run")
    assert run.code == 0, run.err
    assert f"would redrive\t{fresh.pos('json')}\t-> {t.commands}:0" in run.out
    assert f"would redrive\t{fresh.pos('null')}\t-> {t.commands}:keyed" in run.out
    assert "would redrive 4\n" in run.err
    assert "skipped 5\n" in run.err
    for topic in (t.commands, t.state, t.status, t.errors, t.webhook_replays):
        assert await read_all(fresh.settings, topic) == []


async def test_redrive_re_produces_to_the_source_with_the_original_headers(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    t = fresh.settings.topics
    run = await cli(capsys, "redrive", "--yes")
    assert run.code == 0, run.err
    assert "redriven 4\n" in run.err and f"  to {t.commands}: 4\n" in run.err
    skipped = {line.split("\t")[1]: line.split("\t")[2] for line in run.out.splitlines()
               if line.startswith("skipped\t")}  # fmt: skip
    assert skipped == {
        fresh.pos("nosource"): "no dlq.source header",
        fresh.pos("hostile"): "dlq.source is not <topic>:<partition>:<offset>",
        fresh.pos("malformed"): "dlq.source is not <topic>:<partition>:<offset>",
        fresh.pos("negative"): "dlq.source is not <topic>:<partition>:<offset>",
        fresh.pos("state"): f"dlq.source names {t.state}, not a topic the worker or "
        "dispatcher reads",
    }
    assert await read_all(fresh.settings, t.state) == []  # a forged source steers nothing

    records = await read_all(fresh.settings, t.commands)
    by_value = {r.value: r for r in records}
    assert len(records) == len(by_value) == 4
    by_name = {name: by_value[fresh.letters[name].value] for name in ("json", "forged",
               "poison", "null")}  # fmt: skip
    for name, partition in (("json", 0), ("forged", 1), ("poison", 2)):
        record, letter = by_name[name], fresh.letters[name]
        assert record.partition == partition, name
        assert (record.key, record.value) == (letter.key, letter.value), name
        originals = [(k, v) for k, v in letter.headers if not k.startswith("dlq.")]
        marker = ("dlq.redriven", f"{t.dlq}:{fresh.pos(name)}".encode())
        assert list(record.headers) == [*originals, marker], name
    # partition 7 of the source does not exist: placed by key, the null value kept
    null = by_name["null"]
    assert null.value is None and null.key == b"acc_3" and null.partition in (0, 1, 2)


async def test_redrive_of_the_webhook_dlq_skips_failed_deliveries(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    t = fresh.settings.topics
    run = await cli(capsys, "redrive", "--topic", "webhook", "--yes")
    assert run.code == 0, run.err
    assert f"skipped\t{fresh.pos('delivery')}\ta failed webhook delivery: replay it with " in (
        run.out
    )
    assert "POST /v1/webhook-endpoints/{endpoint_id}/replay (docs/api.md" in run.out
    [event] = await read_all(fresh.settings, t.status)
    assert (event.partition, event.key, event.value) == (1, b"acc_7", b"not json")
    assert list(event.headers) == [TRACE, ("dlq.redriven", f"{t.webhook_dlq}:1:0".encode())]


async def test_redrive_with_filters_and_a_limit(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    t = fresh.settings.topics
    run = await cli(capsys, "redrive", "--yes", "--reason", "not_json", "--reason", "invalid",
                    "--limit", "2")  # fmt: skip
    assert run.code == 0, run.err
    # selected in order: json (sent), null (sent); malformed would be the third
    assert "redriven 2\n" in run.err
    assert "--limit 2, more records match" in run.err
    assert "a second run with the same filters sends these again" in run.err
    records = await read_all(fresh.settings, t.commands)
    assert sorted(r.key for r in records) == [b"acc_1", b"acc_3"]


async def test_a_record_the_producer_refuses_fails_alone(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead letter over the producer's request size (written by a producer allowing more)
    is one failed send: the others of the run still go, and the exit status says so."""
    t = fresh.settings.topics
    producer = build_producer(fresh.settings.kafka_config(), max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        big = await producer.send_and_wait(
            t.dlq, b"x" * (1536 * 1024), key=b"acc_big", partition=2,
            headers=dlq("too_large", f"{t.commands}:0:1"),
        )  # fmt: skip
    finally:
        await producer.stop()
    run = await cli(capsys, "redrive", "--yes", "--source-topic", "commands")
    assert run.code == 1
    assert f"failed\t2:{big.offset}\tMessageSizeTooLargeError" in run.out
    assert "redriven 4\n" in run.err and "failed 1\n" in run.err
    assert len(await read_all(fresh.settings, t.commands)) == 4


def test_the_command_in_a_subprocess(data: DataSet) -> None:
    """``python -m worker dlq`` as an operator runs it, on the default event loop."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "dlq", "list", "--json", "--key", "acc_1"],
        cwd=REPO,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    names = [data.name(o["topic"], o["partition"], o["offset"])
             for o in map(json.loads, proc.stdout.splitlines())]  # fmt: skip
    assert names == ["json", "poison"]
    assert "2 of 9 records" in proc.stderr


async def test_redriven_records_read_back_from_a_consumer(
    fresh: DataSet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The marker survives a second failure: a redriven record dead-lettered again carries
    ``dlq.redriven`` among its original headers, and ``list`` shows where it came from."""
    t = fresh.settings.topics
    assert (await cli(capsys, "redrive", "--yes", "--reason", "not_object")).code == 0
    [redriven] = await read_all(fresh.settings, t.commands)
    producer = build_producer(fresh.settings.kafka_config())
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            t.dlq,
            redriven.value,
            key=redriven.key,
            partition=0,
            headers=[*redriven.headers, *dlq("not_object", f"{t.commands}:1:0")],
        )
    finally:
        await producer.stop()
    run = await cli(capsys, "list", "--json", "--reason", "not_object")
    again = [o for o in run.json_lines() if o["offset"] == meta.offset]
    assert again[0]["redriven_from"] == f"{t.dlq}:{fresh.pos('forged')}"
    assert again[0]["source"] == f"{t.commands}:1:0"
