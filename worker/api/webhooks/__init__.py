"""The front-end's own webhook routes, their bodies, quotas, replay and the deliveries scan: what
the API serves of webhooks (the process that delivers them is ``worker.dispatcher``)."""

__all__ = [
    "account_events",
    "bodies",
    "clients",
    "creates",
    "delivery_bodies",
    "delivery_log",
    "delivery_log_scan",
    "delivery_routes",
    "follow_bodies",
    "follow_routes",
    "guard",
    "quotas",
    "replay",
    "replay_status",
    "routes",
    "sends",
    "urls",
]
