"""The wire contract: messages and the error catalogue (the documents made from them are in
``worker.documents``)."""

__all__ = [
    "catalogue",
    "compact_ids",
    "delivery_log",
    "endpoint_ceilings",
    "messages",
    "operational_events",
    "shared_timestamps",
    "topics",
    "webhook_endpoints",
    "webhook_events",
]
