"""Workspace API keys: stored as SHA-256 hashes only, resolved in constant time.

The keys file (``API_KEYS_FILE``) is JSON::

    {"keys": [{"workspace_id": "ws_a", "key_id": "key_1f2e3d4c5b6a",
               "sha256": "<64 hex chars>", "active": true, "created_at": "..."}]}

A raw key never touches the disk or a log line: ``python -m worker keys WORKSPACE`` generates
``pk_<urlsafe token>``, appends its hash to the file and prints the key once. Setting ``active``
to false disables a key (401 invalid_api_key). The front-end re-reads the file when its
modification time changes, so new and disabled keys take effect without a restart.

API keys are high-entropy random tokens, so a plain SHA-256 is the right hash (a slow password
hash buys nothing against a 256-bit secret and would cost every request).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.logs import get_logger
from worker.messages import ID_PATTERN
from worker.settings import Settings

log = get_logger(__name__)

KEY_PREFIX: Final = "pk_"

MAX_KEY_LENGTH: Final = 512
_ID_RE: Final = re.compile(ID_PATTERN)


def hash_key(raw_key: str) -> str:
    """Hex SHA-256 of a raw key, as stored in the keys file."""
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    """A new raw key: ``pk_`` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class _FileEntry(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    workspace_id: Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]
    key_id: Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    active: bool = True


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    keys: list[_FileEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One stored key: the workspace it selects and the digest of the raw key."""

    workspace_id: str
    key_id: str
    digest: bytes
    active: bool = True


def load_keys(path: Path) -> list[KeyEntry]:
    """Parse a keys file; raises ``ValueError`` on malformed content (never echoing it)."""
    try:
        parsed = _KeysFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{path}: invalid keys file at {where}: {err['msg']}") from None
    return [
        KeyEntry(e.workspace_id, e.key_id, bytes.fromhex(e.sha256), e.active) for e in parsed.keys
    ]


class KeyStore:
    """Resolves a raw ``X-Api-Key`` to its workspace id.

    ``resolve`` hashes the presented key once and compares the digest with every stored digest
    using ``hmac.compare_digest``, without stopping at the first match, so the time taken does
    not depend on which entry (if any) matched. Built from a file, the store reloads it when
    its modification time or size changes (checked at most every ``reload_interval_s``); a
    file that became malformed is logged and the previous keys stay in force.
    """

    def __init__(
        self,
        entries: Iterable[KeyEntry] = (),
        *,
        path: Path | None = None,
        reload_interval_s: float = 2.0,
    ) -> None:
        self._entries: tuple[KeyEntry, ...] = tuple(entries)
        self._path = path
        self._reload_interval_s = reload_interval_s
        self._checked_at = time.monotonic()
        self._stamp = self._file_stamp()

    @classmethod
    def from_file(cls, path: Path | None, *, reload_interval_s: float = 2.0) -> KeyStore:
        """The keys of ``path``; ``None`` gives an empty store (every key is invalid)."""
        if path is None:
            return cls()
        return cls(load_keys(path), path=path, reload_interval_s=reload_interval_s)

    def __len__(self) -> int:
        return len(self._entries)

    def resolve(self, raw_key: str) -> str | None:
        """The workspace id of an active key, else ``None``."""
        self._maybe_reload()
        if not raw_key or len(raw_key) > MAX_KEY_LENGTH:
            return None
        digest = hashlib.sha256(raw_key.encode("utf-8")).digest()
        found: str | None = None
        for entry in self._entries:
            matched = hmac.compare_digest(digest, entry.digest)
            if matched and entry.active and found is None:
                found = entry.workspace_id
        return found

    def _file_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now = time.monotonic()
        if now - self._checked_at < self._reload_interval_s:
            return
        self._checked_at = now
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        try:
            entries = load_keys(self._path)
        except (OSError, ValueError) as exc:
            log.error("api_keys_reload_failed", path=str(self._path), error=str(exc))
            return
        self._entries = tuple(entries)
        self._stamp = stamp
        log.info("api_keys_reloaded", path=str(self._path), keys=len(entries))


def _write_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file and rename; owner read/write only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _entry_document(workspace_id: str, key_id: str, raw_key: str) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "key_id": key_id,
        "sha256": hash_key(raw_key),
        "active": True,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }


def add_key(
    path: Path, workspace_id: str, *, raw_key: str | None = None, key_id: str | None = None
) -> tuple[str, str]:
    """Append a key for ``workspace_id`` to ``path`` (created if missing): a new random one
    unless ``raw_key`` is given (the dev stack's well-known key).

    Returns ``(key_id, raw_key)``; the raw key exists only in the return value.
    """
    if not _ID_RE.fullmatch(workspace_id):
        raise ValueError(f"workspace id {workspace_id!r} does not match {ID_PATTERN}")
    document: dict[str, Any] = {"keys": []}
    if path.exists():
        load_keys(path)  # refuse to append to a malformed file
        document = json.loads(path.read_text(encoding="utf-8"))
        document.setdefault("keys", [])
    raw_key = raw_key or generate_key()
    key_id = key_id or f"key_{secrets.token_hex(6)}"
    document["keys"].append(_entry_document(workspace_id, key_id, raw_key))
    _write_atomic(path, document)
    return key_id, raw_key


def cli_create_key(settings: Settings, *, workspace_id: str, file: Path | None) -> int:
    """``python -m worker keys WORKSPACE [--file PATH]``: the key goes to stdout, once."""
    path = file or settings.api_keys_file
    if path is None:
        print("no keys file: pass --file or set API_KEYS_FILE", file=sys.stderr)
        return 2
    try:
        key_id, raw_key = add_key(path, workspace_id)
    except (OSError, ValueError) as exc:
        print(f"could not add a key: {exc}", file=sys.stderr)
        return 1
    print(raw_key, flush=True)
    print(
        f"created {key_id} for workspace {workspace_id} in {path}; the key is shown only once",
        file=sys.stderr,
    )
    return 0
