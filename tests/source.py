"""Parsing the repository's own source in tests."""

from __future__ import annotations

import ast
import time
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """``ast.parse`` of ``path``. CPython 3.11's AST builder keeps one recursion counter for
    all threads, so a parse that overlaps another thread's (a library parsing source in the
    background) can fail with "SystemError: AST constructor recursion depth mismatch"; that is
    no fault of the file, so it is parsed again."""
    source = path.read_text()
    for attempt in range(5):
        try:
            return ast.parse(source, str(path))
        except SystemError:
            if attempt == 4:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")
