"""Passkey auth-flow worker, the product package (what the image ships). Three processes,
``auth/`` (the worker), ``api/`` (the front-end) and ``webhooks/`` (the dispatcher), run on
``engine/`` (the consume loop, offsets, stores, Kafka), ``contract/`` (the wire) and
``runtime/`` (signals, probes, metrics, logs, tracing); ``cli.py`` starts them. The map:
docs/architecture.md, "Where each concept lives in the code"."""

__version__ = "0.1.0"
