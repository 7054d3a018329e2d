"""Edits of the API keys file: each a read-modify-write under a lock, replacing the file atomically,
keeping fields it does not know and writing only hashes (docs/operations.md, "API keys")."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from worker.api.keys import FileEntry, generate_key, hash_key, parse_keys_file
from worker.contract.messages import ID_PATTERN, valid_id

__all__ = [
    "LOCK_TIMEOUT_S",
    "KeyFileError",
    "KeyInfo",
    "KeyState",
    "create_key",
    "delete_key",
    "iso",
    "list_keys",
    "locked",
    "rotate_key",
    "set_active",
]

#: How long an edit waits for another ``keys`` command to release the lock.
LOCK_TIMEOUT_S: Final = 10.0

KeyState = Literal["active", "expiring", "expired", "disabled"]


class KeyFileError(ValueError):
    """An edit that cannot be made (unknown key id, duplicate id, lock held, ...)."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What an operator may see of a key: everything but its hash."""

    key_id: str
    workspace_id: str
    active: bool
    created_at: datetime | None
    expires_at: datetime | None
    replaced_by: str | None

    @classmethod
    def of(cls, entry: FileEntry) -> KeyInfo:
        return cls(**entry.model_dump(include=set(cls.__dataclass_fields__)))

    def state(self, now: datetime | None = None) -> KeyState:
        """``active``; ``expiring`` (valid until ``expires_at``); ``expired``; ``disabled``."""
        if not self.active:
            return "disabled"
        if self.expires_at is None:
            return "active"
        return "expiring" if (now or datetime.now(UTC)) < self.expires_at else "expired"


def iso(moment: datetime, timespec: str = "seconds") -> str:
    """RFC 3339 in UTC, ``Z``-suffixed, as the file stores its times."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def _changed_now(entry: dict[str, Any]) -> None:
    """Stamp a disable or enable (milliseconds: a portal session opened before it is refused,
    one opened just after is not)."""
    entry["changed_at"] = iso(datetime.now(UTC), "milliseconds")


@contextlib.contextmanager
def locked(path: Path, *, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` (on ``<path>.lock``, kept afterwards: removing a
    lock file races with its next user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise KeyFileError(
                        f"{lock_path} is held by another keys command; try again"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    """The file's JSON (validated first), or an empty document when it does not exist."""
    if not path.exists():
        return {"keys": []}
    parse_keys_file(path)  # refuse to edit a malformed file
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    document.setdefault("keys", [])
    return document


def _write_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file, fsync and rename; owner read/write only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _find(document: dict[str, Any], key_id: str, path: Path) -> dict[str, Any]:
    for entry in document["keys"]:
        if entry.get("key_id") == key_id:
            found: dict[str, Any] = entry
            return found
    raise KeyFileError(f"no key {key_id!r} in {path}")


def _info(entry: dict[str, Any]) -> KeyInfo:
    return KeyInfo.of(FileEntry.model_validate(entry))


def _new_entry(
    document: dict[str, Any], path: Path, workspace_id: str, raw_key: str, key_id: str | None
) -> dict[str, Any]:
    if not valid_id(workspace_id):
        raise KeyFileError(f"workspace id {workspace_id!r} does not match {ID_PATTERN}")
    taken = {e.get("key_id") for e in document["keys"]}
    if key_id is None:
        key_id = f"key_{secrets.token_hex(6)}"
        while key_id in taken:
            key_id = f"key_{secrets.token_hex(6)}"
    elif not valid_id(key_id):
        raise KeyFileError(f"key id {key_id!r} does not match {ID_PATTERN}")
    elif key_id in taken:
        raise KeyFileError(f"key id {key_id!r} already exists in {path}")
    entry = {
        "workspace_id": workspace_id,
        "key_id": key_id,
        "sha256": hash_key(raw_key),
        "active": True,
        "created_at": iso(datetime.now(UTC)),
    }
    document["keys"].append(entry)
    return entry


def list_keys(path: Path) -> list[KeyInfo]:
    """Every key of ``path`` in file order (an absent file has none)."""
    if not path.exists():
        return []
    return [KeyInfo.of(entry) for entry in parse_keys_file(path).keys]


def create_key(
    path: Path, workspace_id: str, *, raw_key: str | None = None, key_id: str | None = None
) -> tuple[str, str]:
    """Append a key for ``workspace_id`` (new and random unless ``raw_key`` is given); the raw
    key exists only in the returned ``(key_id, raw_key)``."""
    raw_key = raw_key or generate_key()
    with locked(path):
        document = _read(path)
        entry = _new_entry(document, path, workspace_id, raw_key, key_id)
        _write_atomic(path, document)
    return entry["key_id"], raw_key


def set_active(path: Path, key_id: str, active: bool) -> KeyInfo:
    """Disable or enable a key (clearing a rotation's ``expires_at``); either stamps
    ``changed_at``, so the key's portal sessions opened before stay dead once it is enabled."""
    with locked(path):
        document = _read(path)
        entry = _find(document, key_id, path)
        entry["active"] = active
        _changed_now(entry)
        if active:
            entry.pop("expires_at", None)
        _write_atomic(path, document)
        return _info(entry)


def rotate_key(path: Path, key_id: str, *, grace_s: float = 0.0) -> tuple[KeyInfo, str, str]:
    """A new key for the workspace of ``key_id``; the old one is disabled now (``grace_s``
    0) or expires ``grace_s`` seconds from now. Returns ``(old key, new key id, raw key)``."""
    if grace_s < 0:
        raise KeyFileError("the grace period cannot be negative")
    raw_key = generate_key()
    with locked(path):
        document = _read(path)
        old = _find(document, key_id, path)
        new = _new_entry(document, path, str(old["workspace_id"]), raw_key, None)
        old["replaced_by"] = new["key_id"]
        current = _info(old).expires_at
        until = datetime.now(UTC) + timedelta(seconds=grace_s)
        if grace_s <= 0:
            old["active"] = False
            _changed_now(old)
        elif current is None or until < current:  # a grace never extends an earlier expiry
            old["expires_at"] = iso(until)
        _write_atomic(path, document)
        return _info(old), new["key_id"], raw_key


def delete_key(path: Path, key_id: str, *, force: bool = False) -> KeyInfo:
    """Remove a key's entry. A key that is still valid (active or expiring) is removed only
    with ``force``: disable it first and watch its last-used time go quiet."""
    with locked(path):
        document = _read(path)
        entry = _find(document, key_id, path)
        info = _info(entry)
        if info.state() in ("active", "expiring") and not force:
            raise KeyFileError(
                f"key {key_id!r} is {info.state()}: disable it first, or pass --force"
            )
        document["keys"] = [e for e in document["keys"] if e is not entry]
        _write_atomic(path, document)
        return info
