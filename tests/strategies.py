"""Hypothesis strategies more than one test module draws from."""

from __future__ import annotations

from hypothesis import strategies as st

#: Command and request ids in every form they arrive in: UUIDs (canonical, upper-case, without
#: dashes), the front-end's ``req_`` ids, and arbitrary short ids.
uuids = st.uuids().map(str)
ids = (
    uuids
    | uuids.map(str.upper)
    | uuids.map(lambda u: u.replace("-", ""))
    | uuids.map(lambda u: "req_" + u.replace("-", ""))  # the front-end's request ids
    | uuids.map(lambda u: "req_" + u.replace("-", "").upper())
    | uuids.map(lambda u: "req_" + u)
    | st.text(alphabet="0123456789abcdefx-_.:@AFrq", max_size=40)
)
