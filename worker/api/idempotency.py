"""Idempotent confirms: a repeated ``Idempotency-Key`` (same workspace, key, account and body) gets
the first answer and sends no second command. Replicas share the keys on the compacted
``api.idempotency`` topic, where the first claim in the topic's order wins on every replica
(docs/architecture.md, "Idempotent confirms").

Over 500 lines: the record, the view and a request's path through them are one protocol."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.bodies import error_response
from worker.api.metrics import ApiMetrics
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Identifier, Strict, TopicRecord
from worker.engine.broker_health import BrokerHealth
from worker.engine.compacted_view import CompactedView
from worker.runtime.admission import Share
from worker.runtime.logs import get_logger

log = get_logger(__name__)

HEADER: Final = b"idempotency-key"
KEY_MAX_CHARS: Final = 255
_KEY_RE: Final = re.compile(rb"[!-~]{1,%d}" % KEY_MAX_CHARS)
KEY_RULE: Final = (
    f"Idempotency-Key must be 1-{KEY_MAX_CHARS} printable ASCII characters without spaces,"
    " sent once"
)
#: How long a key holds its answer.
KEY_TTL_S: Final = 24 * 3600.0
#: A claim with no answer is abandoned this long after the request's reply time-out.
CLAIM_MARGIN_S: Final = 5.0
#: How long a claim waits to read its own record back before the request answers 500.
CLAIM_TIMEOUT_S: Final = 5.0
#: The largest answer kept (the worker's replies are a few hundred bytes); larger: not kept.
ANSWER_MAX_BYTES: Final = 4096
#: Between two sweeps of expired keys and lost claims.
SWEEP_INTERVAL_S: Final = 60.0
#: Lost or expired claims waiting for their tombstone; past it they wait for a restart's read.
MAX_STALE: Final = 10_000
#: ``Retry-After`` of a key in progress and of a workspace out of keys.
IN_PROGRESS_RETRY_S: Final = 1
EXHAUSTED_RETRY_S: Final = 60
REPLAYED_HEADER: Final = "Idempotent-Replayed"
#: Keys held in a process by default (``API_IDEMPOTENCY_KEYS_MAX``).
KEYS_MAX: Final = 100_000
#: ``Held.status`` of a claim its request gave up on this replica.
GIVEN_UP: Final = -1
#: Kept answers longer than this are deflated in memory (the topic keeps the JSON as is).
DEFLATE_OVER: Final = 64
#: Raw deflate with a 1 KiB window: answers are ≤ 4 KiB and mostly far shorter.
_WBITS: Final = -10
#: A preset dictionary of the answers' common text: a typical answer deflates to a third.
_ENVELOPE: Final = (
    b'{"request_id":"req_","data":{"account_id":"acc_","status":"passkey_confirmation_sent",'
    b'"auth_status":"passkey_confirmation_sent"},"error":{"code":"","numeric_code":,'
    b'"message":"The provider ","retryable":false,"details":{}}}'
)
_HEX64: Final = re.compile(rb"[0-9a-f]{64}")


def key_of(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` (``None``: none sent); 400 when it is empty, longer
    than ``KEY_MAX_CHARS``, not printable ASCII, or sent twice."""
    found: list[bytes] = [value for name, value in request.scope["headers"] if name == HEADER]
    if not found:
        return None
    if len(found) > 1 or _KEY_RE.fullmatch(found[0]) is None:
        raise ServiceError.of("invalid_request", f"Invalid header: {KEY_RULE}.")
    return found[0].decode("ascii")


def fingerprint(account_id: str, body: bytes) -> str:
    """What "the same request" means: the account and the body, byte for byte."""
    digest = hashlib.sha256(account_id.encode("utf-8"))
    digest.update(b"\n")
    digest.update(body)
    return digest.hexdigest()


class StoredAnswer(Strict):
    """The first answer to a key: its status and the exact JSON body sent."""

    status: int = Field(ge=200, le=599)
    body: str = Field(max_length=ANSWER_MAX_BYTES)


class IdempotencyRecord(TopicRecord):
    """The value on ``api.idempotency`` (key: ``workspace_id/key_sha256/claim_id``): a request's
    claim of a key, then (same record key) its answer. The key itself is never stored."""

    type: Literal["api_idempotency"] = "api_idempotency"
    workspace_id: Identifier
    key_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    claim_id: Identifier
    replica_id: Identifier
    fingerprint: str = Field(pattern="^[0-9a-f]{64}$")
    at: float = Field(description="When claimed: Unix seconds, the writer's clock.")
    answer: StoredAnswer | None = None

    @property
    def record_key(self) -> bytes:
        return f"{self.workspace_id}/{self.key_sha256}/{self.claim_id}".encode()


class _Full:
    """A claim refused: the workspace holds its share of the keys, or the process its cap."""


FULL: Final = _Full()


@dataclass(slots=True, eq=False)
class Held:
    """One key as the view keeps it, compactly because every replica keeps every workspace's
    keys (docs/architecture.md, "Resource bounds"): no model per key, the hashes as raw
    bytes, the answer as its encoded body (deflated when that pays), nothing derivable."""

    claim_id: str
    #: SHA-256 of the account and the body (``fingerprint``), 32 bytes.
    print_: bytes
    at: float
    #: The answer's status; 0 while the claim has none, ``GIVEN_UP`` once its request
    #: gave it up here (its tombstone is on its way).
    status: int = 0
    body: bytes = b""
    deflated: bool = False

    @classmethod
    def of(cls, record: IdempotencyRecord) -> Held:
        print_ = bytes.fromhex(record.fingerprint)
        if record.answer is None:
            return cls(record.claim_id, print_, record.at)
        body = record.answer.body.encode("utf-8")
        packed = _deflate(body) if len(body) > DEFLATE_OVER else body
        deflated = len(packed) < len(body)
        return cls(
            record.claim_id,
            print_,
            record.at,
            record.answer.status,
            packed if deflated else body,
            deflated,
        )

    @property
    def answered(self) -> bool:
        return self.status > 0

    def answer_body(self) -> bytes:
        """The answer's body, byte for byte as first sent."""
        return _inflate(self.body) if self.deflated else self.body


def record_key(workspace_id: str, digest: bytes, claim_id: str) -> bytes:
    """The topic's record key of a claim (``IdempotencyRecord.record_key``)."""
    return f"{workspace_id}/{digest.hex()}/{claim_id}".encode()


class IdempotencyKeys(CompactedView):
    """Every replica's view of the keys held, and this replica's claims. Every replica applies
    the records in the topic's order with one rule (``_apply``), so all agree on which claim
    holds a key and which the admission rule refuses; for the counts to agree too, the view
    changes only in that order (docs/architecture.md, "Idempotent confirms")."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        producer: Any,
        *,
        replica_id: str,
        per_workspace: int,
        claim_ttl_s: float,
        keys_max: int = KEYS_MAX,
        health: BrokerHealth | None = None,
        ttl_s: float = KEY_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(consumer, topic, producer, name="api-idempotency", health=health)
        self.replica_id = replica_id
        self.share = Share.capped(keys_max, per_workspace)
        self._ttl_s = ttl_s
        self._claim_ttl_s = claim_ttl_s
        self._clock = clock
        #: workspace id -> SHA-256 of the key (32 bytes) -> the claim holding it.
        self._slots: dict[str, dict[bytes, Held]] = {}
        #: Keys held in the process: the admission rule's ``in_use``.
        self.in_use = 0
        #: Of those, claims given up here whose tombstones are not read yet (``admits``).
        self.given_up = 0
        self._stale: dict[bytes, float] = {}

    # -- the view ----------------------------------------------------------------------------

    def held(self, workspace_id: str) -> int:
        keys = self._slots.get(workspace_id)
        return len(keys) if keys else 0

    def admits(self, workspace_id: str) -> bool:
        """Whether a new claim of the workspace is worth writing: ``_apply``'s rule on this
        replica's view, counting the claims given up here as gone (their tombstones, written
        first, are read before the new claim). ``_apply`` decides, in the topic's order."""
        held = max(0, self.held(workspace_id) - self.given_up)
        return self.share.admits(held, self.in_use - self.given_up)

    def _expired(self, held: Held, at: float) -> bool:
        limit = self._ttl_s if held.answered else self._claim_ttl_s
        return at - held.at > limit

    def _hold(self, workspace_id: str, digest: bytes, held: Held) -> Held:
        keys = self._slots.get(workspace_id)
        if keys is None:
            keys = self._slots[workspace_id] = {}
        old = keys.get(digest)
        if old is None:
            self.in_use += 1
        elif old.status == GIVEN_UP:
            self.given_up -= 1
        keys[digest] = held
        return held

    def _drop(self, workspace_id: str, digest: bytes) -> None:
        keys = self._slots.get(workspace_id)
        old = keys.pop(digest, None) if keys is not None else None
        if keys is not None and old is not None:
            self.in_use -= 1
            if old.status == GIVEN_UP:
                self.given_up -= 1
            if not keys:
                del self._slots[workspace_id]

    def _mark_stale(self, key: bytes, at: float) -> None:
        if len(self._stale) < MAX_STALE:
            self._stale[key] = at

    def _apply(self, record: IdempotencyRecord) -> Held | _Full:
        """Apply one record; the claim that holds its key afterwards (``FULL``: a claim
        refused by the admission rule)."""
        workspace_id, digest = record.workspace_id, bytes.fromhex(record.key_sha256)
        keys = self._slots.get(workspace_id)
        current = keys.get(digest) if keys else None
        if (
            current is not None
            and current.claim_id != record.claim_id
            and self._expired(current, record.at)
        ):
            self._mark_stale(record_key(workspace_id, digest, current.claim_id), current.at)
            self._drop(workspace_id, digest)
            current = None
        if current is None:
            if record.answer is None and not self.share.admits(
                self.held(workspace_id), self.in_use
            ):
                self._mark_stale(record.record_key, record.at)
                return FULL
            return self._keep(record, digest)
        if current.claim_id == record.claim_id:
            if record.answer is not None and not current.answered:
                return self._keep(record, digest)
            return current
        if record.answer is not None and not current.answered:
            self._mark_stale(record_key(workspace_id, digest, current.claim_id), current.at)
            return self._keep(record, digest)
        self._mark_stale(record.record_key, record.at)
        return current

    def _keep(self, record: IdempotencyRecord, digest: bytes) -> Held:
        # A record that holds its key is never one to tombstone (a claim refused on one
        # replica's earlier view may come back with its answer).
        self._stale.pop(record.record_key, None)
        return self._hold(record.workspace_id, digest, Held.of(record))

    def take(self, msg: Any) -> None:
        if msg.value is None:
            self._tombstoned(msg.key or b"")
            return
        record = self.decoded(IdempotencyRecord.model_validate_json, msg.value)
        if record is None:
            return
        if msg.key != record.record_key:
            self.undecodable += 1
            return
        outcome = self._apply(record)
        if record.answer is None:
            self.read_back(record.claim_id, lambda: outcome)

    def _tombstoned(self, key: bytes) -> None:
        self._stale.pop(key, None)
        parts = key.split(b"/")
        if len(parts) != 3 or _HEX64.fullmatch(parts[1]) is None:
            return
        workspace_id = parts[0].decode("utf-8", "replace")
        digest = bytes.fromhex(parts[1].decode("ascii"))
        keys = self._slots.get(workspace_id)
        held = keys.get(digest) if keys else None
        if held is not None and held.claim_id == parts[2].decode("utf-8", "replace"):
            self._drop(workspace_id, digest)

    def holder(self, workspace_id: str, key: str) -> Held | None:
        """The live claim holding ``key`` in the workspace, by this replica's clock."""
        keys = self._slots.get(workspace_id)
        held = keys.get(_digest(key)) if keys else None
        if held is None or held.status == GIVEN_UP or self._expired(held, self._clock()):
            return None
        return held

    # -- writing -----------------------------------------------------------------------------

    async def claim(
        self, workspace_id: str, key: str, print_: str
    ) -> tuple[IdempotencyRecord | None, Held | _Full | None]:
        """Claim ``key``: this claim when it won (else ``None``), and the claim that holds the
        key once it is read back (``FULL`` when the admission rule refused it; ``None`` when
        the claim could not be written and read back in time: nothing held)."""
        claim = IdempotencyRecord(
            workspace_id=workspace_id,
            key_sha256=_digest(key).hex(),
            claim_id=f"idm_{uuid.uuid4().hex}",
            replica_id=self.replica_id,
            fingerprint=print_,
            at=self._clock(),
        )
        try:
            outcome: Held | _Full = await self.send_read_back(
                claim.claim_id,
                claim.record_key,
                claim.model_dump_json().encode(),
                CLAIM_TIMEOUT_S,
            )
        except Exception as exc:  # time-out or broker: nothing is claimed
            log.warning("api_idempotency_claim_failed", error=type(exc).__name__)
            self.forget(claim)
            return None, None
        if isinstance(outcome, Held) and outcome.claim_id == claim.claim_id:
            return claim, outcome
        self.forget(claim)  # lost: its record goes
        return None, outcome

    async def answered(self, claim: IdempotencyRecord, status: int, body: bytes) -> bool:
        """Keep the answer of a won claim (written before it is sent, so a repeat on any
        replica finds it); ``False`` when it is too large or could not be written in time."""
        if len(body) > ANSWER_MAX_BYTES:
            return False
        record = claim.model_copy(
            update={"answer": StoredAnswer(status=status, body=body.decode("utf-8"))}
        )
        try:
            await self.send(
                record.record_key,
                record.model_dump_json().encode(),
                timeout_s=max(CLAIM_MARGIN_S - 1.0, 0.5),
            )
        except Exception as exc:
            log.warning("api_idempotency_answer_not_kept", error=type(exc).__name__)
            return False
        # Held here at once (reading it back applies it again, to the same effect), so a
        # repeat on this replica never waits for the read; the others read it in a fetch.
        self._apply(record)
        return True

    def forget(self, claim: IdempotencyRecord) -> None:
        """Tombstone ``claim`` in the background; given up here at once, so a retry claims
        again, it stays counted until its tombstone is read, as on every replica."""
        keys = self._slots.get(claim.workspace_id)
        held = keys.get(bytes.fromhex(claim.key_sha256)) if keys else None
        if held is not None and held.claim_id == claim.claim_id and held.status == 0:
            held.status = GIVEN_UP
            self.given_up += 1
        self.send_quietly(claim.record_key, None)

    # -- expiry ------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Tombstone the expired keys and the lost claims whose requests are surely over."""
        now = self._clock()
        gone = [
            record_key(workspace_id, digest, held.claim_id)
            for workspace_id, keys in self._slots.items()
            for digest, held in keys.items()
            if self._expired(held, now)
        ]
        for key in gone:
            self._stale.pop(key, None)
        await self.tombstone(gone)
        for key, at in list(self._stale.items()):
            if now - at > self._claim_ttl_s:
                del self._stale[key]
                await self.send(key, None)

    async def start(self) -> None:
        await super().start()
        self.chores.every(SWEEP_INTERVAL_S, self.sweep, timeout_s=SWEEP_INTERVAL_S)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


def _deflate(body: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, _WBITS, 1, zlib.Z_DEFAULT_STRATEGY, _ENVELOPE)
    return packer.compress(body) + packer.flush()


def _inflate(packed: bytes) -> bytes:
    unpacker = zlib.decompressobj(_WBITS, _ENVELOPE)
    return unpacker.decompress(packed) + unpacker.flush()


def _refused(
    metrics: ApiMetrics, request_id: str, reason: str, code: str, retry_after_s: int | None = None
) -> Response:
    """A request refused for its key, counted by ``reason``."""
    metrics.idempotency_refusals.labels(reason).inc()
    headers = None if retry_after_s is None else {"Retry-After": str(retry_after_s)}
    return error_response(request_id, ServiceError.of(code), headers)


def _replayed(held: Held, print_: str, request_id: str, metrics: ApiMetrics) -> Response:
    """The answer to a request whose key another request holds."""
    if held.print_ != bytes.fromhex(print_):
        return _refused(metrics, request_id, "reused", "idempotency_key_reused")
    if not held.answered:
        code = "idempotency_key_in_progress"
        return _refused(metrics, request_id, "in_progress", code, IN_PROGRESS_RETRY_S)
    metrics.idempotency_replays.inc()
    return Response(
        held.answer_body(),
        status_code=held.status,
        media_type=JSONResponse.media_type,
        headers={REPLAYED_HEADER: "true"},
    )


async def answer_once(
    keys: IdempotencyKeys,
    *,
    workspace_id: str,
    key: str,
    print_: str,
    request_id: str,
    run: Callable[[], Awaitable[Response]],
    metrics: ApiMetrics,
) -> Response:
    """``run``'s answer, given once per key: a repeat gets the kept answer, another request with
    the key 409, a new key the admission rule refuses 429; an error ``run`` raises gives the key
    up, so a retry runs again."""
    if not keys.caught_up and not await keys.wait_caught_up(CLAIM_TIMEOUT_S):
        raise ServiceError.of(
            "run_auth_action_failed",
            "The service is starting (idempotency keys not read yet); nothing was sent.",
        )
    held = keys.holder(workspace_id, key)
    if held is not None:
        return _replayed(held, print_, request_id, metrics)

    def exhausted() -> Response:
        code = "idempotency_keys_exhausted"
        return _refused(metrics, request_id, "exhausted", code, EXHAUSTED_RETRY_S)

    if not keys.admits(workspace_id):
        return exhausted()
    mine, outcome = await keys.claim(workspace_id, key, print_)
    if outcome is None:
        raise ServiceError.of(
            "run_auth_action_failed",
            "The Idempotency-Key could not be recorded in time; nothing was sent. Retry.",
        )
    if isinstance(outcome, _Full):
        return exhausted()
    if mine is None:
        return _replayed(outcome, print_, request_id, metrics)
    kept = False
    try:
        response = await run()
        kept = await keys.answered(mine, response.status_code, bytes(response.body))
        if kept:
            metrics.idempotency_keys_stored.inc()
        return response
    finally:
        if not kept:  # no answer kept (an error, a time-out, a cancel): a retry runs again
            keys.forget(mine)


__all__ = [
    "ANSWER_MAX_BYTES",
    "FULL",
    "HEADER",
    "KEYS_MAX",
    "KEY_MAX_CHARS",
    "KEY_TTL_S",
    "REPLAYED_HEADER",
    "Held",
    "IdempotencyKeys",
    "IdempotencyRecord",
    "StoredAnswer",
    "answer_once",
    "fingerprint",
    "key_of",
]
