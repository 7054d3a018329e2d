"""``python -m worker <command>``: the entry point of every production process.

Commands: ``run`` (one worker of the pool), ``api`` (one front-end), ``webhooks`` (one
webhook dispatcher), ``topics`` (create the topics), ``keys`` (the API key lifecycle) and
``schemas`` (re-export ``schemas/`` and ``docs/flow.md``).
The development tools (the embedded broker, the simulator, ``make run``'s stack, the demo) are
``python -m devstack``, and the benchmark is ``python -m bench``; neither is in this package.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from worker import eventloop, logs, preflight, tracing
from worker.api import keys_cli
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

    if (refused := preflight.refuse(settings, "run", providers=True)) is not None:
        return refused
    tune_gc(settings)
    _trace(tracing.SERVICE_WORKER)
    return run_until_signal(run_worker(settings), settings)


def cmd_topics(settings: Settings, _: argparse.Namespace) -> int:
    from worker.kafka import ensure_topics

    if (refused := preflight.refuse(settings, "topics")) is not None:
        return refused
    counts = eventloop.run(ensure_topics(settings), settings.event_loop)
    for name, n in counts.items():
        print(f"{name}\t{n} partitions")
    return 0


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    from worker.api.app import serve_api

    if (refused := preflight.refuse(settings, "api")) is not None:
        return refused
    tune_gc(settings)
    _trace(tracing.SERVICE_API)
    return run_until_signal(serve_api(settings), settings)


def cmd_webhooks(settings: Settings, _: argparse.Namespace) -> int:
    from worker.webhooks.app import run_dispatcher

    if (refused := preflight.refuse(settings, "webhooks")) is not None:
        return refused
    tune_gc(settings)
    _trace(tracing.SERVICE_WEBHOOKS)
    return run_until_signal(run_dispatcher(settings), settings)


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    from worker.schemas import write_all

    for path in write_all(Path(args.out), Path(args.docs)):
        print(f"wrote {path}")
    return 0


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    return keys_cli.run(settings, args)


def _legacy_keys(argv: list[str]) -> list[str]:
    """``keys WORKSPACE [--file F]`` (before the lifecycle commands) → ``keys create
    WORKSPACE [--file F]``, with a deprecation note on stderr."""
    legacy = len(argv) >= 2 and argv[0] == "keys" and argv[1] not in keys_cli.COMMANDS
    if legacy and not argv[1].startswith("-"):
        print("`keys WORKSPACE` is deprecated: use `keys create WORKSPACE`", file=sys.stderr)
        return ["keys", "create", *argv[1:]]
    return argv


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
    sub.add_parser("topics", help="create every topic (idempotent)").set_defaults(fn=cmd_topics)
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
    keys.set_defaults(fn=cmd_keys)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_legacy_keys(list(sys.argv[1:] if argv is None else argv)))
    return run_command(args, Settings())


if __name__ == "__main__":
    sys.exit(main())
