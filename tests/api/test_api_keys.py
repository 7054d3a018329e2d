"""API keys: hashed storage, constant-time resolution, expiry and last-used times, the keys
file's locked atomic edits and every ``python -m worker keys`` command (the front-end side of
the lifecycle, through a running front-end, is in test_api_keys_e2e.py)."""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.api.support import KEY_A, KEY_B, KEY_DISABLED, write_keys
from worker.api.keyfile import (
    KeyFileError,
    create_key,
    delete_key,
    list_keys,
    locked,
    rotate_key,
    set_active,
)
from worker.api.keys import KeyEntry, KeyStore, generate_key, hash_key
from worker.cli import main
from worker.runtime import logs

add_key = create_key
KEY_RE = r"pk_[A-Za-z0-9_-]{43}"


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


def test_a_key_id_twice_is_a_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    entry = {"workspace_id": "ws_a", "key_id": "k", "sha256": "a" * 64}
    path.write_text(json.dumps({"keys": [entry, entry | {"sha256": "b" * 64}]}))
    with pytest.raises(ValueError, match="appears twice"):
        KeyStore.from_file(path)


# -- the store: expiry and last use ----------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_expiring_key_is_valid_until_its_expiry_then_refused() -> None:
    clock = Clock(1_000.0)
    entry = KeyEntry("ws_a", "k_old", bytes.fromhex(hash_key("old")), expires_at=1_010.0)
    store = KeyStore([entry], clock=clock)
    assert store.resolve("old") == "ws_a"
    clock.now = 1_009.999
    assert store.resolve("old") == "ws_a"
    clock.now = 1_010.0
    assert store.resolve("old") is None


def test_last_used_records_every_presentation_of_a_stored_key_only(tmp_path: Path) -> None:
    clock = Clock(5_000.0)
    path = write_keys(tmp_path / "keys.json")
    store = KeyStore(
        [
            KeyEntry("ws_a", "key_a", bytes.fromhex(hash_key(KEY_A))),
            KeyEntry("ws_a", "key_off", bytes.fromhex(hash_key(KEY_DISABLED)), active=False),
        ],
        path=path,
        reload_interval_s=0,
        clock=clock,
    )
    assert store.last_used() == []
    assert store.resolve("pk_unknown") is None
    assert store.resolve("") is None
    assert store.last_used() == []
    store.resolve(KEY_A)
    clock.now = 5_001.0
    assert store.resolve(KEY_DISABLED) is None  # refused, but its client is still out there
    assert sorted(store.last_used()) == [("key_a", "ws_a", 5_000.0), ("key_off", "ws_a", 5_001.0)]
    delete_key(path, "key_off")  # the reload forgets a deleted key's time
    store.resolve(KEY_A)
    assert store.last_used() == [("key_a", "ws_a", 5_001.0)]


# -- the file's edits ------------------------------------------------------------------------


def test_lifecycle_edits_keep_hashes_only_and_unknown_fields(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "keys.json"
    key_id, raw = create_key(path, "ws_new")
    assert re.fullmatch(KEY_RE, raw)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    doc["keys"][0]["note"] = "kept by every edit"
    path.write_text(json.dumps(doc))

    assert set_active(path, key_id, False).state() == "disabled"
    assert KeyStore.from_file(path).resolve(raw) is None
    assert set_active(path, key_id, True).state() == "active"
    assert KeyStore.from_file(path).resolve(raw) == "ws_new"

    old, new_id, new_raw = rotate_key(path, key_id)
    assert (old.state(), old.replaced_by) == ("disabled", new_id)
    store = KeyStore.from_file(path)
    assert store.resolve(raw) is None
    assert store.resolve(new_raw) == "ws_new"

    text = path.read_text()
    assert raw not in text and new_raw not in text
    assert hash_key(raw) in text and hash_key(new_raw) in text
    assert json.loads(text)["keys"][0]["note"] == "kept by every edit"
    assert [k.key_id for k in list_keys(path)] == [key_id, new_id]


def test_rotate_with_grace_keeps_the_old_key_until_it_expires(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key_id, raw = create_key(path, "ws_a")
    before = datetime.now(UTC)
    old, new_id, new_raw = rotate_key(path, key_id, grace_s=3600)
    assert old.state() == "expiring" and old.active
    assert old.expires_at is not None
    assert (
        before + timedelta(seconds=3590) < old.expires_at <= datetime.now(UTC) + timedelta(hours=1)
    )
    assert old.state(old.expires_at) == "expired"
    store = KeyStore.from_file(path)
    assert store.resolve(raw) == "ws_a"
    assert store.resolve(new_raw) == "ws_a"
    # a second rotation with a longer grace never extends the first expiry
    again, _, _ = rotate_key(path, key_id, grace_s=7200)
    assert again.expires_at == old.expires_at
    # enabling clears the expiry: valid again without limit
    assert set_active(path, key_id, True).expires_at is None
    assert [k.state() for k in list_keys(path)] == ["active", "active", "active"]
    assert new_id in {k.key_id for k in list_keys(path)}


def test_delete_refuses_a_valid_key_without_force(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key_id, raw = create_key(path, "ws_a")
    with pytest.raises(KeyFileError, match="disable it first"):
        delete_key(path, key_id)
    assert KeyStore.from_file(path).resolve(raw) == "ws_a"
    assert delete_key(path, key_id, force=True).key_id == key_id
    assert list_keys(path) == []
    assert KeyStore.from_file(path).resolve(raw) is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: set_active(p, "key_missing", False),
        lambda p: rotate_key(p, "key_missing"),
        lambda p: delete_key(p, "key_missing"),
        lambda p: create_key(p, "ws_a", key_id="key_a"),
        lambda p: create_key(p, "bad id"),
        lambda p: create_key(p, "ws_a", key_id="bad/id"),
        lambda p: rotate_key(p, "key_a", grace_s=-1),
    ],
)
def test_refused_edits_leave_the_file_unchanged(tmp_path: Path, edit: object) -> None:
    path = write_keys(tmp_path / "keys.json")
    before = path.read_bytes()
    with pytest.raises(KeyFileError):
        edit(path)  # type: ignore[operator]
    assert path.read_bytes() == before


def test_a_malformed_file_is_never_edited(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"keys": [{"workspace_id": "ws_a"}]}')
    for edit in (
        lambda: create_key(broken, "ws_a"),
        lambda: set_active(broken, "k", False),
        lambda: rotate_key(broken, "k"),
        lambda: delete_key(broken, "k", force=True),
    ):
        with pytest.raises(ValueError, match="invalid keys file"):
            edit()
    assert broken.read_text() == '{"keys": [{"workspace_id": "ws_a"}]}'


def test_concurrent_edits_lose_nothing(tmp_path: Path) -> None:
    """Forty creates from eight threads, each a read-modify-write of the same file: with the
    lock every one of them is in the file; the file parses after every write."""
    path = tmp_path / "keys.json"
    with ThreadPoolExecutor(max_workers=8) as pool:
        created = list(pool.map(lambda i: create_key(path, f"ws_{i % 5}"), range(40)))
    stored = {k.key_id for k in list_keys(path)}
    assert stored == {key_id for key_id, _ in created}
    store = KeyStore.from_file(path)
    assert all(store.resolve(raw) is not None for _, raw in created)


def test_a_held_lock_makes_an_edit_wait_then_give_up(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with locked(path):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        with (
            pytest.raises(KeyFileError, match="held by another keys command"),
            locked(path, timeout_s=0.2),
        ):
            pass
    finally:
        release.set()
        thread.join(10)
    with locked(path, timeout_s=0.2):  # released: free again
        pass
    assert not path.exists()  # locking alone writes nothing


# -- python -m worker keys ... ----------------------------------------------------------------


@pytest.fixture(autouse=True)
def _process_logging_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` configures structlog for a process, onto this test's captured stderr; the
    tests after it would log into a closed file."""
    monkeypatch.setattr(logs, "configure", lambda *_, **__: None)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_create_prints_the_key_once_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.json"
    monkeypatch.setenv("API_KEYS_FILE", str(path))
    code, out, err = cli(capsys, "keys", "create", "ws_new", "--key-id", "key_new")
    assert code == 0
    raw = out.strip()
    assert re.fullmatch(KEY_RE, raw)
    assert raw not in err
    assert "created key_new for workspace ws_new" in err and "shown only once" in err
    assert KeyStore.from_file(path).resolve(raw) == "ws_new"
    code, out, err = cli(capsys, "keys", "list")
    assert raw not in out + err  # never shown again
    assert hash_key(raw) not in out + err


def test_cli_legacy_form_still_creates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = write_keys(tmp_path / "other.json")
    code, out, err = cli(capsys, "keys", "ws_a", "--file", str(other))
    assert code == 0
    assert "deprecated" in err and "keys create" in err
    store = KeyStore.from_file(other)
    assert len(store) == 4
    assert store.resolve(out.strip()) == "ws_a"
    assert store.resolve(KEY_B) == "ws_b"  # existing entries are kept


def test_cli_list_disable_enable_rotate_delete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_keys(tmp_path / "keys.json")
    f = ("--file", str(path))
    code, out, err = cli(capsys, "keys", "list", *f)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "KEY_ID",
        "WORKSPACE_ID",
        "STATE",
        "CREATED_AT",
        "EXPIRES_AT",
        "LAST_USED",
    ]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["key_a", "ws_a", "active"],
        ["key_b", "ws_b", "active"],
        ["key_off", "ws_a", "disabled"],
    ]
    assert "--metrics-url" in err

    code, out, _ = cli(capsys, "keys", "disable", "key_a", *f)
    assert code == 0
    assert out.startswith("disabled key_a (workspace ws_a): disabled")
    assert KeyStore.from_file(path).resolve(KEY_A) is None

    code, out, _ = cli(capsys, "keys", "enable", "key_a", *f)
    assert (code, out.startswith("enabled key_a (workspace ws_a): active")) == (0, True)
    assert KeyStore.from_file(path).resolve(KEY_A) == "ws_a"

    code, out, err = cli(capsys, "keys", "rotate", "key_a", "--grace", "2h", *f)
    assert code == 0
    new_raw = out.strip()
    assert re.fullmatch(KEY_RE, new_raw)
    assert "key_a expires at" in err
    rows = {}
    code, out, _ = cli(capsys, "keys", "list", "--json", *f)
    for line in out.splitlines():
        row = json.loads(line)
        rows[row["key_id"]] = row
    new_id = rows["key_a"]["replaced_by"]
    assert rows["key_a"]["state"] == "expiring"
    assert rows[new_id]["state"] == "active" and rows[new_id]["workspace_id"] == "ws_a"
    assert all("sha256" not in row for row in rows.values())

    code, out, err = cli(capsys, "keys", "rotate", new_id, *f)
    assert code == 0 and f"{new_id} is disabled" in err
    assert KeyStore.from_file(path).resolve(new_raw) is None

    code, out, err = cli(capsys, "keys", "delete", "key_b", *f)
    assert code == 1 and "disable it first" in err and out == ""
    code, out, _ = cli(capsys, "keys", "delete", "key_off", *f)
    assert (code, out.strip()) == (0, "deleted key_off (workspace ws_a, was disabled)")
    code, out, _ = cli(capsys, "keys", "delete", "key_b", "--force", *f)
    assert code == 0 and "was active" in out
    left = {k.key_id: k for k in list_keys(path)}
    assert len(left) == 3 and {"key_a", new_id} <= set(left)
    assert left[new_id].replaced_by in left


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (("keys", "list"), 2, "no keys file"),
        (("keys", "disable", "key_zz", "--file", "{path}"), 1, "no key 'key_zz'"),
        (("keys", "enable", "key_zz", "--file", "{path}"), 1, "no key 'key_zz'"),
        (("keys", "rotate", "key_zz", "--file", "{path}"), 1, "no key 'key_zz'"),
        (("keys", "delete", "key_zz", "--file", "{path}"), 1, "no key 'key_zz'"),
        (("keys", "create", "bad id", "--file", "{path}"), 1, "does not match"),
        (("keys", "ws_a", "--file", "{broken}"), 1, "invalid keys file"),
    ],
)
def test_cli_refusals_name_the_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    monkeypatch.delenv("API_KEYS_FILE", raising=False)
    path = write_keys(tmp_path / "keys.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"keys": [{"workspace_id": "ws_a"}]}')
    before = path.read_bytes()
    got, out, err = cli(capsys, *(a.format(path=path, broken=broken) for a in argv))
    assert got == code
    assert message in err
    assert "pk_" not in out
    assert path.read_bytes() == before


def test_cli_rejects_a_bad_grace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["keys", "rotate", "key_a", "--grace", "soon", "--file", str(tmp_path / "k.json")])
    assert exit_info.value.code == 2
    assert "not a duration" in capsys.readouterr().err
