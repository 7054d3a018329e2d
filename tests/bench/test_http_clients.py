"""``python -m bench.http_clients`` in a tiny configuration: every contender completes every
call with a valid answer, over plain TCP, TLS and mTLS, sized and chunked (behaviour, no
timings). The product's client against hostile servers: tests/runtime/test_http1.py."""

from __future__ import annotations

import pytest

from bench.http_clients import CONTENDERS, MODES, parse, run
from bench.http_curl import load_pycurl


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_every_contender_completes_every_call(chunked: bool) -> None:
    argv = ["--rounds", "1", "--calls", "60", "--calls-50", "120", "--in-flight", "1,5"]
    rows = run(parse(argv + (["--chunked"] if chunked else [])))
    expected = {c for c in CONTENDERS if c != "pycurl" or load_pycurl() is not None}
    assert {r["contender"] for r in rows} == expected
    assert {(r["mode"], r["in_flight"]) for r in rows} == {(m, n) for m in MODES for n in (1, 5)}
    for row in rows:
        calls = 60 if row["in_flight"] == 1 else 120
        assert (row["calls"], row["valid"], row["error"]) == (calls, calls, ""), row
        assert row["cpu_us"] > 0 and row["rate"] > 0
