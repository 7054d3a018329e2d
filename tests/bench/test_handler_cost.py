"""Smoke test of ``python -m bench.handler_cost``: every handler answers every confirm 200 with
one provider call each, in process (no timing thresholds)."""

from __future__ import annotations

import asyncio

from bench.handler_cost import measure


def test_every_handler_answers_every_confirm_with_one_call_each() -> None:
    best = asyncio.run(measure(n=120, size=25, rounds=1))
    assert set(best) == {"floor", "batched", "executor"}
    for kind, got in best.items():
        assert got["provider_calls"] == 120, kind
        assert got["replies"] == {200: 120}, kind
        assert got["us_per_confirm"] > 0, kind
