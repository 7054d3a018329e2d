"""``python -m worker <command>``: the entry point of every production process.

Commands: ``run`` (one worker of the pool), ``api`` (one front-end), ``webhooks`` (one
webhook dispatcher), ``topics`` (create or check the topics: a deploy step), ``keys`` (API
keys) and ``schemas`` (re-export ``schemas/`` and ``docs/flow.md``).
The development tools (the embedded broker, the simulator, ``make run``'s stack, the demo) are
``python -m devstack``, and the benchmark is ``python -m bench``; neither is in this package.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from worker import eventloop, logs, tracing
from worker.process import run_command, run_until_signal, tune_gc
from worker.settings import Settings


def _trace(service: str) -> None:
    """Tracing of a serving process, from OTEL_* (``worker.tracing``); says where spans go."""
    setup = tracing.configure(service)
    logs.get_logger(__name__).info(
        "tracing_configured",
        service=setup.service,
        exporters=list(setup.targets) or None,
        mode="exporting" if setup.recording else "propagating only",
    )


def cmd_run(settings: Settings, _: argparse.Namespace) -> int:
    from worker.app import run_worker

    tune_gc(settings)
    _trace(tracing.SERVICE_WORKER)
    return run_until_signal(run_worker(settings), settings)


def cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    """``topics create|check``: the deploy step. Prints one row per topic and setting; exits 0
    when every topic is as specified, 1 when one is not, 2 when Kafka cannot be reached."""
    from aiokafka.errors import KafkaError

    from worker.kafka import topics_report
    from worker.topics import problems, render_table

    create = args.action == "create"
    try:
        findings = eventloop.run(topics_report(settings, create=create), settings.event_loop)
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


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    from worker.api.app import serve_api

    tune_gc(settings)
    _trace(tracing.SERVICE_API)
    return run_until_signal(serve_api(settings), settings)


def cmd_webhooks(settings: Settings, _: argparse.Namespace) -> int:
    from worker.webhooks.app import run_dispatcher

    tune_gc(settings)
    _trace(tracing.SERVICE_WEBHOOKS)
    return run_until_signal(run_dispatcher(settings), settings)


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    from worker.schemas import write_all

    for path in write_all(Path(args.out), Path(args.docs)):
        print(f"wrote {path}")
    return 0


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    from worker.api.keys import cli_create_key

    return cli_create_key(settings, workspace_id=args.workspace, file=args.file)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="one worker of the pool (production entry point)").set_defaults(
        fn=cmd_run
    )
    sub.add_parser("api", help="one API front-end process").set_defaults(fn=cmd_api)
    sub.add_parser(
        "webhooks", help="one webhook dispatcher of the pool (delivers events to endpoints)"
    ).set_defaults(fn=cmd_webhooks)
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
    keys = sub.add_parser("keys", help="create an API key for a workspace (printed once)")
    keys.add_argument("workspace")
    keys.add_argument("--file", type=Path, default=None, help="keys file (default API_KEYS_FILE)")
    keys.set_defaults(fn=cmd_keys)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    return run_command(args, Settings())


if __name__ == "__main__":
    sys.exit(main())
