"""Tests of the front-end's webhook routes and scans (``worker.api.webhooks``), against a real
broker over real HTTP."""
