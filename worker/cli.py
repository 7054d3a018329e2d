"""``python -m worker <command>``: the one entry point (design.md §11).

Commands: ``stack`` (everything, for development), ``run`` (one worker), ``api`` (one
front-end), ``broker``, ``simulator``, ``topics``, ``demo`` (send commands and watch the
results without the front-end), ``schemas`` (re-export schemas/), ``keys`` (API keys) and
``bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from worker import eventloop, logs
from worker.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]


def _run(coro: Coroutine[Any, Any, Any], settings: Settings) -> int:
    """Run ``coro`` on the configured event loop (``EVENT_LOOP``); SIGTERM/SIGINT cancel it,
    so its clean-up (child processes, sockets) runs. Commands with their own graceful stop
    (``run``, ``api``, ``stack``) install their own handlers over these."""

    async def until_signal() -> None:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        eventloop.run(until_signal(), settings.event_loop)
    except KeyboardInterrupt:
        return 130
    return 0


def _tune_gc(settings: Settings) -> None:
    """Long-lived server processes: raise the young-generation threshold (see the setting)."""
    if settings.worker_gc_threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(settings.worker_gc_threshold, gen1, gen2)


def cmd_run(settings: Settings, _: argparse.Namespace) -> int:
    from worker.app import run_worker

    _tune_gc(settings)
    return _run(run_worker(settings), settings)


def cmd_broker(settings: Settings, _: argparse.Namespace) -> int:
    from worker.broker import serve_broker

    return _run(serve_broker(settings.embedded_broker_port), settings)


def cmd_simulator(settings: Settings, _: argparse.Namespace) -> int:
    from worker.provider.simulator import serve_simulator

    return _run(serve_simulator(settings), settings)


def cmd_topics(settings: Settings, _: argparse.Namespace) -> int:
    from worker.kafka import ensure_topics

    counts = eventloop.run(ensure_topics(settings), settings.event_loop)
    for name, n in counts.items():
        print(f"{name}\t{n} partitions")
    return 0


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    from worker.api.app import serve_api

    _tune_gc(settings)
    return _run(serve_api(settings), settings)


def cmd_stack(settings: Settings, args: argparse.Namespace) -> int:
    from worker.stack import run_stack

    return _run(run_stack(settings, demo_accounts=args.demo_accounts), settings)


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from worker.demo import run_demo

    return _run(run_demo(settings, args), settings)


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    from worker.schemas import write_all

    for path in write_all(Path(args.out)):
        print(f"wrote {path}")
    return 0


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    from worker.api.keys import cli_create_key

    return cli_create_key(settings, workspace_id=args.workspace, file=args.file)


def cmd_bench(settings: Settings, args: argparse.Namespace) -> int:
    from worker.bench import main as bench_main

    return bench_main(settings, args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="one worker of the pool (production entry point)").set_defaults(
        fn=cmd_run
    )
    sub.add_parser("api", help="one API front-end process").set_defaults(fn=cmd_api)
    sub.add_parser("broker", help="the embedded Kafka-compatible broker alone").set_defaults(
        fn=cmd_broker
    )
    sub.add_parser("simulator", help="the provider simulator alone").set_defaults(fn=cmd_simulator)
    sub.add_parser("topics", help="create the six topics (idempotent)").set_defaults(fn=cmd_topics)
    stack = sub.add_parser("stack", help="the whole system on this machine (make run)")
    stack.add_argument(
        "--demo-accounts", type=int, default=5, help="demo accounts to register (default 5)"
    )
    stack.set_defaults(fn=cmd_stack)
    demo = sub.add_parser(
        "demo", help="send commands straight to Kafka and print replies and status events"
    )
    demo.add_argument("action", choices=["confirm", "register", "watch"])
    demo.add_argument("account_id")
    demo.add_argument("--workspace", default="ws_demo")
    demo.add_argument("--provider", default="simulator")
    demo.add_argument("--ref", default=None, help="provider_account_ref (default: the account)")
    demo.add_argument("--status", default="passkey_confirmation")
    demo.add_argument("--timeout", type=float, default=15.0)
    demo.set_defaults(fn=cmd_demo)
    schemas = sub.add_parser("schemas", help="export JSON Schemas, catalogue and OpenAPI")
    schemas.add_argument("--out", default=str(REPO_ROOT / "schemas"))
    schemas.set_defaults(fn=cmd_schemas)
    keys = sub.add_parser("keys", help="create an API key for a workspace (printed once)")
    keys.add_argument("workspace")
    keys.add_argument("--file", type=Path, default=None, help="keys file (default API_KEYS_FILE)")
    keys.set_defaults(fn=cmd_keys)
    bench = sub.add_parser("bench", help="throughput/latency benchmark", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(fn=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the benchmark owns its flags: `bench --quick` works as typed
        argv = ["bench", "--", *(a for a in argv[1:] if a != "--")]
    args = build_parser().parse_args(argv)
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    with contextlib.suppress(BrokenPipeError):
        code: int = args.fn(settings, args)
        return code
    return 1


if __name__ == "__main__":
    sys.exit(main())
