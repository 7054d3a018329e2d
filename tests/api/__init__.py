"""Tests of the API front-end (``worker.api``), against a real broker over real HTTP."""
