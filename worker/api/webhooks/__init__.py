"""The front-end's own webhook routes, their bodies, quotas, replay and the deliveries scan: what
the API serves of webhooks (the dispatcher that delivers them is ``worker.webhooks``)."""
