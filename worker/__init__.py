"""Passkey auth-flow worker: consumes passkey-confirm commands from Kafka, decides through one
shared `transitions` machine, calls the provider adapter and publishes replies and events."""

__version__ = "0.1.0"
