"""``python -m devstack <command>``: the development tools.

Commands: ``stack`` (everything on this machine; what ``make run`` runs), ``broker`` (the
embedded broker alone), ``worker`` and ``webhooks`` (the product's ``python -m worker run`` and
``webhooks`` with the embedded broker's group consumer, ``devstack.consumer``), ``simulator``
(the provider simulator alone), ``receiver`` (a webhook receiver that verifies and prints each
delivery) and ``demo`` (send commands straight to Kafka and print what comes back).
"""

from __future__ import annotations

from worker.runtime.early_stop import exit_on_sigterm_while_starting

exit_on_sigterm_while_starting()  # before the imports below, which take most of a start

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from devstack.settings import DevSettings  # noqa: E402
from worker.runtime.process import run_subcommand, run_until_signal, tune_gc  # noqa: E402


def cmd_stack(settings: DevSettings, args: argparse.Namespace) -> int:
    from devstack.stack import run_stack

    return run_until_signal(
        run_stack(settings, demo_accounts=args.demo_accounts), settings.event_loop
    )


def cmd_broker(settings: DevSettings, _: argparse.Namespace) -> int:
    from devstack.broker import serve_broker

    return run_until_signal(serve_broker(settings.embedded_broker_port), settings.event_loop)


def cmd_worker(settings: DevSettings, _: argparse.Namespace) -> int:
    from devstack.consumer import EmbeddedBrokerConsumer
    from worker.auth.app import run_worker
    from worker.runtime import tracing
    from worker.startup import RootOptions

    tune_gc(settings.worker_gc_threshold)
    tracing.configure(tracing.SERVICE_WORKER)
    worker = run_worker(settings, RootOptions(consumer_class=EmbeddedBrokerConsumer))
    return run_until_signal(worker, settings.event_loop)


def cmd_webhooks(settings: DevSettings, _: argparse.Namespace) -> int:
    from devstack.consumer import EmbeddedBrokerConsumer
    from worker.dispatcher.app import run_dispatcher
    from worker.runtime import tracing
    from worker.startup import RootOptions

    tune_gc(settings.worker_gc_threshold)
    tracing.configure(tracing.SERVICE_WEBHOOKS)
    dispatcher = run_dispatcher(settings, RootOptions(consumer_class=EmbeddedBrokerConsumer))
    return run_until_signal(dispatcher, settings.event_loop)


def cmd_simulator(settings: DevSettings, _: argparse.Namespace) -> int:
    from devstack.simulator import serve_simulator

    return run_until_signal(serve_simulator(settings), settings.event_loop)


def cmd_receiver(settings: DevSettings, _: argparse.Namespace) -> int:
    from devstack.receiver import serve_receiver

    return run_until_signal(serve_receiver(settings), settings.event_loop)


def cmd_demo(settings: DevSettings, args: argparse.Namespace) -> int:
    from devstack.demo import run_demo

    return run_until_signal(run_demo(settings, args), settings.event_loop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    stack = sub.add_parser("stack", help="the whole system on this machine (make run)")
    stack.add_argument(
        "--demo-accounts", type=int, default=5, help="demo accounts to register (default 5)"
    )
    stack.set_defaults(fn=cmd_stack)
    sub.add_parser("broker", help="the embedded Kafka-compatible broker alone").set_defaults(
        fn=cmd_broker
    )
    sub.add_parser(
        "worker", help="`python -m worker run` with the embedded broker's group consumer"
    ).set_defaults(fn=cmd_worker)
    sub.add_parser(
        "webhooks", help="`python -m worker webhooks` with the embedded broker's group consumer"
    ).set_defaults(fn=cmd_webhooks)
    sub.add_parser("simulator", help="the provider simulator alone").set_defaults(fn=cmd_simulator)
    sub.add_parser(
        "receiver", help="a webhook receiver that verifies and prints each delivery"
    ).set_defaults(fn=cmd_receiver)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    settings = DevSettings()
    return run_subcommand(args, settings.log_config(), lambda: args.fn(settings, args))


if __name__ == "__main__":
    sys.exit(main())
