"""Fixtures of the front-end tests (the session broker and ``make_settings`` come from
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.api.support import ALLOWED_ORIGIN, write_keys
from worker.settings import Settings

ApiSettings = Callable[..., Settings]


@pytest.fixture
def keys_path(tmp_path: Path) -> Path:
    return write_keys(tmp_path / "api-keys.json")


@pytest.fixture
def api_settings(make_settings: Callable[..., Settings], keys_path: Path) -> ApiSettings:
    """``make_settings`` plus the front-end's knobs: test keys, one allowed origin, a short
    reply timeout."""

    def factory(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "api_keys_file": keys_path,
            "api_cors_origins": [ALLOWED_ORIGIN],
            "api_reply_timeout_s": 5.0,
        }
        values.update(overrides)
        return make_settings(**values)

    return factory
