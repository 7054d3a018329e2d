"""``make test`` schedules by group (``pytest-xdist --dist loadgroup``, groups set in
tests/conftest.py): the heavy tests one after the other, every other test with the rest of its
file. xdist reads the groups from the ``xdist_group`` marks in its own collection hook; if that
hook runs before the one that sets them, nothing is grouped, two heavy tests share the two cores
and two workers race one module fixture (the AsyncAPI parser's ``npm ci`` did, in CI). This runs
a real xdist session and looks for the group xdist appends to every test's node id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_xdist_schedules_each_test_in_its_group() -> None:
    tests = [
        "tests/documents/test_asyncapi.py::test_compacted_topics",
        "tests/documents/test_asyncapi.py::test_keys_carry_the_id_rule",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "--dist", "loadgroup", "-v", *tests],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for test in tests:
        assert f"PASSED {test}@tests/documents/test_asyncapi.py" in done.stdout, done.stdout
