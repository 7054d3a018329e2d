"""API keys: hashed storage, constant-time resolution, the CLI and the dev keys file."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from tests.api.support import KEY_A, KEY_B, KEY_DISABLED, write_keys
from worker.api.keys import (
    KeyEntry,
    KeyStore,
    add_key,
    cli_create_key,
    generate_key,
    hash_key,
)
from worker.settings import Settings


def test_resolve_by_workspace_and_rejects_unknown_disabled_and_odd_keys(tmp_path: Path) -> None:
    store = KeyStore.from_file(write_keys(tmp_path / "keys.json"))
    assert len(store) == 3
    assert store.resolve(KEY_A) == "ws_a"
    assert store.resolve(KEY_B) == "ws_b"
    assert store.resolve(KEY_DISABLED) is None
    for raw in ("", "pk_", KEY_A.upper(), KEY_A + " ", KEY_A[:-1], "x" * 10_000, "ключ"):
        assert store.resolve(raw) is None


def test_the_file_holds_hashes_only(tmp_path: Path) -> None:
    path = write_keys(tmp_path / "keys.json")
    text = path.read_text()
    assert KEY_A not in text
    assert hash_key(KEY_A) in text
    assert re.fullmatch(r"[0-9a-f]{64}", hash_key(KEY_A))
    store = KeyStore([KeyEntry("ws_x", "k1", bytes.fromhex(hash_key("raw")))])
    assert store.resolve("raw") == "ws_x"


def test_generated_keys_are_prefixed_urlsafe_and_unique() -> None:
    keys = {generate_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert re.fullmatch(r"pk_[A-Za-z0-9_-]{43}", key)


def test_cli_creates_appends_and_prints_the_key_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "secrets" / "keys.json"
    settings = Settings(api_keys_file=path)
    assert cli_create_key(settings, workspace_id="ws_new", file=None) == 0
    out = capsys.readouterr()
    key = out.out.strip()
    assert re.fullmatch(r"pk_[A-Za-z0-9_-]{43}", key)
    assert key not in out.err
    assert "ws_new" in out.err
    text = path.read_text()
    assert key not in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert KeyStore.from_file(path).resolve(key) == "ws_new"

    other = tmp_path / "other.json"
    write_keys(other)
    assert cli_create_key(settings, workspace_id="ws_a", file=other) == 0
    second = capsys.readouterr().out.strip()
    store = KeyStore.from_file(other)
    assert len(store) == 4
    assert store.resolve(second) == "ws_a"
    assert store.resolve(KEY_B) == "ws_b"  # existing entries are kept
    assert len(json.loads(path.read_text())["keys"]) == 1  # the --file overrides the setting


def test_cli_refuses_without_file_bad_workspace_or_malformed_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_create_key(Settings(), workspace_id="ws_a", file=None) == 2
    assert cli_create_key(Settings(), workspace_id="bad id", file=tmp_path / "k.json") == 1
    broken = tmp_path / "broken.json"
    broken.write_text('{"keys": [{"workspace_id": "ws_a"}]}')
    assert cli_create_key(Settings(), workspace_id="ws_a", file=broken) == 1
    assert broken.read_text() == '{"keys": [{"workspace_id": "ws_a"}]}'
    out = capsys.readouterr()
    assert "pk_" not in out.out


def test_malformed_file_is_refused_at_start_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    for content in (
        "not json",
        '{"keys": [{"workspace_id": "ws_a", "key_id": "k", "sha256": "' + "z" * 64 + '"}]}',
        '{"keys": [{"workspace_id": "bad id", "key_id": "k", "sha256": "' + "a" * 64 + '"}]}',
    ):
        path.write_text(content)
        with pytest.raises(ValueError, match="invalid keys file") as info:
            KeyStore.from_file(path)
        assert "z" * 64 not in str(info.value)


def test_reload_picks_up_new_and_disabled_keys_and_survives_a_bad_edit(tmp_path: Path) -> None:
    path = write_keys(tmp_path / "keys.json")
    store = KeyStore.from_file(path, reload_interval_s=0)
    assert store.resolve(KEY_A) == "ws_a"
    _, fresh = add_key(path, "ws_c")
    assert store.resolve(fresh) == "ws_c"
    doc = json.loads(path.read_text())
    for entry in doc["keys"]:
        if entry["key_id"] == "key_a":
            entry["active"] = False
    path.write_text(json.dumps(doc))
    assert store.resolve(KEY_A) is None
    path.write_text("{ broken")
    assert store.resolve(fresh) == "ws_c"  # the last good keys stay in force
    assert store.resolve(KEY_A) is None


def test_no_keys_file_means_no_valid_key() -> None:
    store = KeyStore.from_file(None)
    assert len(store) == 0
    assert store.resolve(KEY_A) is None
