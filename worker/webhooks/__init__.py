"""The webhook library the front-end and the dispatcher share: the endpoint registry and the
endpoints topic's tail and store, Standard Webhooks signing, secrets at rest, URL checks and
their bounded name lookups, the event catalogue and sample events, the operational-event
announcer, the scan behind a replay (docs/architecture.md, "Webhook fan-out"). The records
both read and write are in ``worker.contract``; the dispatcher itself is
``worker.dispatcher``."""

__all__ = [
    "announcer",
    "endpoint_writes",
    "endpoints",
    "event_types",
    "lookup",
    "replay_scan",
    "samples",
    "secrets_box",
    "signing",
    "targets",
]
