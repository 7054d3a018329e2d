"""The webhook dispatcher (``python -m worker webhooks``): takes account events in, keeps each
(endpoint, account) pair's delivery state, signs and sends with the SSRF-safe sender, and
writes the delivery log and the webhook DLQ (docs/architecture.md, "Webhook fan-out"). It
shares the webhook library (``worker.webhooks``) with the front-end and writes the records of
``worker.contract``; it imports no other process."""

__all__ = [
    "app",
    "delivery",
    "delivery_store",
    "disabling",
    "dispatch_ports",
    "dispatcher",
    "endpoint_gate",
    "holds",
    "instrumentation",
    "intake",
    "metrics",
    "missed_first",
    "pair_writes",
    "probing",
    "publish",
    "refusals",
    "sender",
]
