"""``python -m worker <command>``: the entry point of every production process. The development
tools are ``python -m devstack`` and the benchmark ``python -m bench``, neither in this package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from worker import preflight
from worker.api import keys_cli
from worker.runtime import eventloop, logs, tracing
from worker.runtime.process import run_subcommand, run_until_signal, tune_gc
from worker.settings import Settings

Main = Callable[[], Coroutine[Any, Any, None]]


def _serve(settings: Settings, args: argparse.Namespace, run: Main, providers: bool = False) -> int:
    """A serving process (``run``, ``api``, ``webhooks``): refused by the preflight, else the GC
    tuned and tracing from OTEL_* (``worker.runtime.tracing``, saying where spans go), then
    ``run()`` until a signal."""
    if (refused := preflight.refuse(settings, args.command, providers=providers)) is not None:
        return refused
    tune_gc(settings.worker_gc_threshold)
    setup = tracing.configure(args.service)
    logs.get_logger(__name__).info(
        "tracing_configured",
        service=setup.service,
        exporters=list(setup.targets) or None,
        mode="exporting" if setup.recording else "propagating only",
    )
    return run_until_signal(run(), settings.event_loop)


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from worker.auth.app import run_worker

    return _serve(settings, args, lambda: run_worker(settings), providers=True)


def cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    """``topics create|check``: the deploy step. Prints one row per topic and setting; exits 0
    when every topic is as specified, 1 when one is not, 2 when Kafka cannot be reached."""
    from aiokafka.errors import KafkaError

    if (refused := preflight.refuse(settings, "topics")) is not None:
        return refused
    from worker.engine.kafka import topics_report
    from worker.engine.topics import problems, render_table

    create = args.action == "create"
    try:
        report = topics_report(settings.kafka_config(), settings.topic_plan(), create=create)
        findings = eventloop.run(report, settings.event_loop)
    except KafkaError as exc:
        logs.get_logger(__name__).error(
            "kafka_unreachable", bootstrap=settings.bootstrap, error=repr(exc)
        )
        return 2
    print(render_table(findings))
    wrong = problems(findings)
    if wrong:
        print(
            f"\n{len(wrong)} problem(s); an existing topic is never altered: fix it with the "
            "platform's tooling (kafka-configs.sh --alter, kafka-topics.sh)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    from worker.api.app import serve_api
    from worker.documents.openapi.document import document_routes

    return _serve(settings, args, lambda: serve_api(settings, documents=document_routes))


def cmd_webhooks(settings: Settings, args: argparse.Namespace) -> int:
    from worker.dispatcher.app import run_dispatcher

    return _serve(settings, args, lambda: run_dispatcher(settings))


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    from worker.documents.export import write_all

    for path in write_all(Path(args.out), Path(args.docs)):
        print(f"wrote {path}")
    return 0


def _deprecated_keys_form(argv: list[str]) -> list[str]:
    """``keys WORKSPACE [--file F]``, the deprecated short form, → ``keys create WORKSPACE
    [--file F]``, with a deprecation note on stderr, so scripts that use it keep working."""
    short_form = len(argv) >= 2 and argv[0] == "keys" and argv[1] not in keys_cli.COMMANDS
    if short_form and not argv[1].startswith("-"):
        print("`keys WORKSPACE` is deprecated: use `keys create WORKSPACE`", file=sys.stderr)
        return ["keys", "create", *argv[1:]]
    return argv


# --- dlq: list, show and redrive dead letters (worker/dlq/cli.py) -----------------------


def cmd_dlq(settings: Settings, args: argparse.Namespace) -> int:
    from worker.dlq import cli as dlq
    from worker.dlq.letter import Filter

    topic = dlq.dlq_topic(settings, args.topic)
    action: Coroutine[Any, Any, int]
    if args.dlq_action == "show":
        action = dlq.show_letter(
            settings,
            topic,
            args.at,
            full=args.full,
            as_json=args.json,
            out=sys.stdout,
            err=sys.stderr,
        )
    else:
        select = Filter.of(
            reasons=args.reason,
            keys=args.key,
            since=args.since,
            until=args.until,
            source_topics=[dlq.source_topic(settings, t) for t in args.source_topic],
        )
        query = dlq.Query(topic, select, args.limit)
        if args.dlq_action == "list":
            action = dlq.list_letters(
                settings, query, as_json=args.json, out=sys.stdout, err=sys.stderr
            )
        else:
            action = dlq.redrive(
                settings, query, dry_run=args.dry_run, out=sys.stdout, err=sys.stderr
            )
    code: int = eventloop.run(dlq.run(action, topic, sys.stderr), settings.event_loop)
    return code


def _when(text: str) -> datetime:
    from worker.dlq.letter import parse_when

    try:
        return parse_when(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at(text: str) -> tuple[int, int]:
    from worker.dlq.letter import parse_at

    try:
        return parse_at(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 1000000, got {text[:20]!r}")
    return int(text)


def add_dlq_parser(sub: Any) -> None:
    topic_help = "auth (TOPIC_DLQ, the default), webhook (TOPIC_WEBHOOK_DLQ) or a topic name"
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--topic", default="auth", help=topic_help)
    select.add_argument(
        "--reason", action="append", default=[], help="dlq.reason (repeat for any of several; "
        "delivery_failed: failed webhook deliveries)",
    )  # fmt: skip
    select.add_argument("--key", action="append", default=[], help="record key (repeatable)")
    select.add_argument(
        "--since", type=_when, help="dead-lettered at or after: ISO-8601 (UTC if no zone) or "
        "a duration ago (30m, 1h, 2d)",
    )  # fmt: skip
    select.add_argument("--until", type=_when, help="dead-lettered before; same forms")
    select.add_argument(
        "--source-topic", action="append", default=[], help="topic of dlq.source, by name or "
        "as its setting (commands, status, errors, webhook_replays); repeatable",
    )  # fmt: skip
    select.add_argument(
        "--limit", type=_limit, default=100, help="records listed or redriven at most (100)"
    )
    dlq = sub.add_parser("dlq", help="dead letters: list, show one, redrive to the source")
    dlq_sub = dlq.add_subparsers(dest="dlq_action", required=True)
    listing = dlq_sub.add_parser(
        "list", parents=[select], help="one line per dead letter, oldest first per partition"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    show = dlq_sub.add_parser("show", help="headers and value of one dead letter")
    show.add_argument("at", type=_at, help="<partition>:<offset>, as list prints it")
    show.add_argument("--topic", default="auth", help=topic_help)
    show.add_argument("--full", action="store_true", help="do not cut key, headers or value")
    show.add_argument("--json", action="store_true", help="as one JSON object")
    redrive = dlq_sub.add_parser(
        "redrive", parents=[select], help="re-produce dead letters to their source topic"
    )
    confirm = redrive.add_mutually_exclusive_group(required=True)
    confirm.add_argument("--dry-run", action="store_true", help="say what would be sent")
    confirm.add_argument("--yes", action="store_true", help="send them")
    dlq.set_defaults(fn=cmd_dlq)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="one worker of the pool (production entry point)").set_defaults(
        fn=cmd_run, service=tracing.SERVICE_WORKER
    )
    sub.add_parser("api", help="one API front-end process").set_defaults(
        fn=cmd_api, service=tracing.SERVICE_API
    )
    sub.add_parser(
        "webhooks", help="one webhook dispatcher of the pool (delivers events to endpoints)"
    ).set_defaults(fn=cmd_webhooks, service=tracing.SERVICE_WEBHOOKS)
    topics = sub.add_parser(
        "topics", help="create or check every topic's partitions, replication and configs"
    )
    topics.add_argument(
        "action",
        choices=["create", "check"],
        help="create: make the missing topics with their configuration, then check; "
        "check: only compare (exit 1 on any problem)",
    )
    topics.set_defaults(fn=cmd_topics)
    schemas = sub.add_parser(
        "schemas", help="export JSON Schemas, catalogue and OpenAPI; the flow diagram to docs/"
    )
    schemas.add_argument("--out", default="schemas", help="directory (default ./schemas)")
    schemas.add_argument("--docs", default="docs", help="directory of docs/flow.md (./docs)")
    schemas.set_defaults(fn=cmd_schemas)
    keys = sub.add_parser(
        "keys", help="API keys: list, create, disable, enable, rotate, delete (docs/api.md)"
    )
    keys_cli.add_arguments(keys)
    keys.set_defaults(fn=keys_cli.run)
    add_dlq_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_deprecated_keys_form(given))
    settings = Settings()
    return run_subcommand(args, settings.log_config(), lambda: args.fn(settings, args))


if __name__ == "__main__":
    sys.exit(main())
