"""Webhook fan-out: endpoints, the dispatcher and its delivery state, Standard Webhooks
signing, secrets at rest and the SSRF-safe sender (docs/architecture.md, "Webhook fan-out")."""
