"""Workspace API keys as SHA-256 hashes only (a high-entropy token needs no slow password hash),
resolved in constant time; a key's last use is a metric, never a log line (docs/api.md)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from worker.contract.messages import ID_PATTERN, validation_problems
from worker.runtime.logs import get_logger

log = get_logger(__name__)

KEY_PREFIX: Final = "pk_"

MAX_KEY_LENGTH: Final = 512


def hash_key(raw_key: str) -> str:
    """Hex SHA-256 of a raw key, as stored in the keys file."""
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    """A new raw key: ``pk_`` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class FileEntry(BaseModel):
    """One entry of the keys file as stored."""

    model_config = ConfigDict(extra="ignore", frozen=True, hide_input_in_errors=True)

    workspace_id: Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]
    key_id: Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    active: bool = True
    created_at: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    replaced_by: Annotated[str, Field(pattern=ID_PATTERN, max_length=128)] | None = None
    #: When the key was last disabled or enabled (absent in older files): a portal session
    #: opened before it is refused, so enabling a key again revives none of its sessions.
    changed_at: AwareDatetime | None = None


class KeysFile(BaseModel):
    """The whole keys file; key ids are unique."""

    model_config = ConfigDict(extra="ignore", frozen=True, hide_input_in_errors=True)

    keys: list[FileEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One stored key: the workspace it selects, the digest of the raw key and its state."""

    workspace_id: str
    key_id: str
    digest: bytes
    active: bool = True
    expires_at: float | None = None  # Unix time; the key is refused from then on
    created_at: float | None = None  # Unix time; with the digest, tells a re-created key apart
    changed_at: float | None = None  # Unix time of the last disable or enable

    def valid_at(self, now: float) -> bool:
        return self.active and (self.expires_at is None or now < self.expires_at)


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def parse_keys_file(path: Path) -> KeysFile:
    """The keys file, validated; raises ``ValueError`` on malformed content (never echoing it)."""
    try:
        parsed = KeysFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problem = validation_problems(exc, "")[0]
        raise ValueError(f"{path}: invalid keys file at {problem}") from None
    seen: set[str] = set()
    for entry in parsed.keys:
        if entry.key_id in seen:
            raise ValueError(f"{path}: invalid keys file: key id {entry.key_id} appears twice")
        seen.add(entry.key_id)
    return parsed


def load_keys(path: Path) -> list[KeyEntry]:
    """The entries of a keys file; raises ``ValueError`` on malformed content."""
    return [
        KeyEntry(
            e.workspace_id,
            e.key_id,
            bytes.fromhex(e.sha256),
            e.active,
            _timestamp(e.expires_at),
            _timestamp(e.created_at),
            _timestamp(e.changed_at),
        )
        for e in parse_keys_file(path).keys
    ]


class KeyStore:
    """Resolves a raw ``X-Api-Key`` to its workspace id, comparing its digest with every stored
    one without stopping at a match, so the time taken does not tell which entry matched. A file
    that became malformed is logged and the previous keys stay in force. Every presentation of
    a stored key, accepted or not, is its ``last_used``: a disabled key still presented shows a
    client that has not switched yet."""

    def __init__(
        self,
        entries: Iterable[KeyEntry] = (),
        *,
        path: Path | None = None,
        reload_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._entries: tuple[KeyEntry, ...] = tuple(entries)
        self._last_used: dict[str, float] = {}
        self._clock = clock
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
        """The workspace id of an active, unexpired key, else ``None``."""
        entry = self.resolve_entry(raw_key)
        return None if entry is None else entry.workspace_id

    def resolve_entry(self, raw_key: str) -> KeyEntry | None:
        """The entry of an active, unexpired key, else ``None``."""
        self._maybe_reload()
        if not raw_key or len(raw_key) > MAX_KEY_LENGTH:
            return None
        digest = hashlib.sha256(raw_key.encode("utf-8")).digest()
        found: KeyEntry | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest) and found is None:
                found = entry
        if found is None:
            return None
        now = self._clock()
        self._last_used[found.key_id] = now
        return found if found.valid_at(now) else None

    def entry_in_force(self, key_id: str, workspace_id: str) -> KeyEntry | None:
        """The entry of key ``key_id`` of ``workspace_id`` while it is in the file, active and
        unexpired: a portal session minted by it lives no longer than the key."""
        self._maybe_reload()
        now = self._clock()
        for e in self._entries:
            if e.key_id == key_id and e.workspace_id == workspace_id and e.valid_at(now):
                return e
        return None

    def last_used(self) -> list[tuple[str, str, float]]:
        """``(key_id, workspace_id, unix time)`` of each stored key presented since start."""
        return [
            (e.key_id, e.workspace_id, self._last_used[e.key_id])
            for e in self._entries
            if e.key_id in self._last_used
        ]

    def _file_stamp(self) -> tuple[int, int, int] | None:
        """Inode, modification time and size: an atomic rewrite always changes the inode."""
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

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
        kept = {e.key_id for e in self._entries}
        self._last_used = {k: t for k, t in self._last_used.items() if k in kept}
        log.info("api_keys_reloaded", path=str(self._path), keys=len(entries))
