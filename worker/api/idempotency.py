"""Idempotent confirms: an ``Idempotency-Key`` on ``POST .../passkey-confirm`` answers a repeat
(same workspace, key, account and body, within 24 h) with the first answer and no second command
(docs/architecture.md, "Idempotent confirms"). Every front-end replica shares the keys through
the compacted, one-partition ``api.idempotency`` topic, read by its shared view consumer: a
request *claims* its key with a record, the first claim of a key in the topic's one order wins
on every replica alike, and the winner writes its answer under its claim. A key is held 24 h,
at most ``API_IDEMPOTENCY_KEYS_PER_WORKSPACE`` per workspace."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.bodies import error_response
from worker.api.metrics import ApiMetrics
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Identifier
from worker.engine.outage import BrokerHealth, send_retrying
from worker.engine.tail import TopicTail
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

Slot = tuple[str, str]  # (workspace id, SHA-256 of the key)


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


class StoredAnswer(BaseModel):
    """The first answer to a key: its status and the exact JSON body sent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: int = Field(ge=200, le=599)
    body: str = Field(max_length=ANSWER_MAX_BYTES)


class IdempotencyRecord(BaseModel):
    """The value on ``api.idempotency`` (key: ``workspace_id/key_sha256/claim_id``): a request's
    claim of a key, then (same record key) its answer. The key itself is never stored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["api_idempotency"] = "api_idempotency"
    schema_version: Literal[1] = 1
    workspace_id: Identifier
    key_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    claim_id: Identifier
    replica_id: Identifier
    fingerprint: str = Field(pattern="^[0-9a-f]{64}$")
    at: float = Field(description="When claimed: Unix seconds, the writer's clock.")
    answer: StoredAnswer | None = None

    @property
    def slot(self) -> Slot:
        return (self.workspace_id, self.key_sha256)

    @property
    def record_key(self) -> bytes:
        return f"{self.workspace_id}/{self.key_sha256}/{self.claim_id}".encode()


class _Full:
    """A claim refused: the workspace holds its quota of keys."""


FULL: Final = _Full()


class IdempotencyKeys(TopicTail):
    """Every replica's view of the keys held, and this replica's claims (module docstring).

    Every replica applies the records in the topic's order with the same rule (``_apply``),
    so all agree on which claim holds a key: the first, unless it expired by the time of the
    next one (answered: ``KEY_TTL_S``; unanswered: ``claim_ttl_s``), and an answer over a
    claim (compaction may have removed its claim record)."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        producer: Any,
        *,
        replica_id: str,
        per_workspace: int,
        claim_ttl_s: float,
        health: BrokerHealth | None = None,
        ttl_s: float = KEY_TTL_S,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(consumer, topic, name="api-idempotency", idle_timeout_ms=200)
        self.replica_id = replica_id
        self.per_workspace = per_workspace
        self._producer = producer
        self._health = health or BrokerHealth()
        self._ttl_s = ttl_s
        self._claim_ttl_s = claim_ttl_s
        self._claim_timeout_s = claim_timeout_s
        self._sweep_interval_s = sweep_interval_s
        self._clock = clock
        self._slots: dict[Slot, IdempotencyRecord] = {}
        self._counts: Counter[str] = Counter()
        self._deciding: dict[str, asyncio.Future[IdempotencyRecord | _Full]] = {}
        self._stale: dict[bytes, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self.undecodable = 0

    # -- the view ----------------------------------------------------------------------------

    def held(self, workspace_id: str) -> int:
        """The workspace's keys in the view."""
        return self._counts[workspace_id]

    def _expired(self, record: IdempotencyRecord, at: float) -> bool:
        limit = self._ttl_s if record.answer is not None else self._claim_ttl_s
        return at - record.at > limit

    def _hold(self, record: IdempotencyRecord) -> None:
        if record.slot not in self._slots:
            self._counts[record.workspace_id] += 1
        self._slots[record.slot] = record

    def _drop(self, slot: Slot) -> None:
        record = self._slots.pop(slot, None)
        if record is not None:
            self._counts[record.workspace_id] -= 1
            if self._counts[record.workspace_id] <= 0:
                del self._counts[record.workspace_id]

    def _mark_stale(self, record: IdempotencyRecord) -> None:
        if len(self._stale) < MAX_STALE:
            self._stale[record.record_key] = record.at

    def _apply(self, record: IdempotencyRecord) -> IdempotencyRecord | _Full:
        """Apply one record; the record that holds its key afterwards (``FULL``: a claim
        refused for the workspace's quota)."""
        current = self._slots.get(record.slot)
        if (
            current is not None
            and current.claim_id != record.claim_id
            and self._expired(current, record.at)
        ):
            self._mark_stale(current)
            self._drop(record.slot)
            current = None
        if current is None:
            if record.answer is None and self._counts[record.workspace_id] >= self.per_workspace:
                self._mark_stale(record)
                return FULL
            self._hold(record)
            return record
        if current.claim_id == record.claim_id:
            if record.answer is not None:
                self._hold(record)
            return self._slots[record.slot]
        if record.answer is not None and current.answer is None:
            self._mark_stale(current)
            self._hold(record)
            return record
        self._mark_stale(record)
        return current

    def handle(self, records: list[Any]) -> None:
        for msg in records:
            if msg.value is None:
                self._tombstoned(msg.key or b"")
                continue
            try:
                record = IdempotencyRecord.model_validate_json(msg.value)
            except ValidationError:
                self.undecodable += 1
                continue
            if msg.key != record.record_key:
                self.undecodable += 1
                continue
            outcome = self._apply(record)
            if record.answer is None:
                deciding = self._deciding.pop(record.claim_id, None)
                if deciding is not None and not deciding.done():
                    deciding.set_result(outcome)

    def _tombstoned(self, key: bytes) -> None:
        self._stale.pop(key, None)
        parts = key.decode("utf-8", "replace").split("/")
        if len(parts) != 3:
            return
        held = self._slots.get((parts[0], parts[1]))
        if held is not None and held.claim_id == parts[2]:
            self._drop(held.slot)

    def holder(self, workspace_id: str, key: str) -> IdempotencyRecord | None:
        """The live record holding ``key`` in the workspace, by this replica's clock."""
        held = self._slots.get((workspace_id, _sha256(key)))
        if held is None or self._expired(held, self._clock()):
            return None
        return held

    # -- writing -----------------------------------------------------------------------------

    async def _send(self, key: bytes, value: bytes | None) -> None:
        await send_retrying(self._producer, self._health, self.topic, value, key=key, partition=0)

    async def claim(
        self, workspace_id: str, key: str, print_: str
    ) -> tuple[bool, IdempotencyRecord | _Full | None]:
        """Claim ``key``: whether this claim won, and the record that holds the key once it
        is read back (this claim when it won; ``FULL`` when the workspace holds its quota;
        ``None`` when the claim could not be written and read back in time: nothing held)."""
        claim = IdempotencyRecord(
            workspace_id=workspace_id,
            key_sha256=_sha256(key),
            claim_id=f"idm_{uuid.uuid4().hex}",
            replica_id=self.replica_id,
            fingerprint=print_,
            at=self._clock(),
        )
        decided: asyncio.Future[IdempotencyRecord | _Full] = (
            asyncio.get_running_loop().create_future()
        )
        self._deciding[claim.claim_id] = decided
        try:
            async with asyncio.timeout(self._claim_timeout_s):
                await self._send(claim.record_key, claim.model_dump_json().encode())
                outcome = await decided
        except Exception as exc:  # time-out or broker: nothing is claimed
            self._deciding.pop(claim.claim_id, None)
            log.warning("api_idempotency_claim_failed", error=type(exc).__name__)
            self.forget(claim)
            return False, None
        won = isinstance(outcome, IdempotencyRecord) and outcome.claim_id == claim.claim_id
        if not won:
            self.forget(claim)  # lost: its record goes
        return won, outcome

    async def answered(self, claim: IdempotencyRecord, status: int, body: bytes) -> bool:
        """Keep the answer of a won claim (written before it is sent, so a repeat on any
        replica finds it); ``False`` when it is too large or could not be written in time."""
        if len(body) > ANSWER_MAX_BYTES:
            return False
        record = claim.model_copy(
            update={"answer": StoredAnswer(status=status, body=body.decode("utf-8"))}
        )
        try:
            async with asyncio.timeout(max(CLAIM_MARGIN_S - 1.0, 0.5)):
                await self._send(record.record_key, record.model_dump_json().encode())
        except Exception as exc:
            log.warning("api_idempotency_answer_not_kept", error=type(exc).__name__)
            return False
        # Held here at once (reading it back applies it again, to the same effect), so a
        # repeat on this replica never waits for the read; the others read it in a fetch.
        self._apply(record)
        return True

    def forget(self, claim: IdempotencyRecord) -> None:
        """Tombstone ``claim`` in the background (a lost claim, or one whose request failed
        before an answer: a later request with the key runs again); dropped here at once."""
        self._tombstoned(claim.record_key)
        self._background(self._send(claim.record_key, None))

    def _background(self, write: Awaitable[None]) -> None:
        if not self.running:
            if asyncio.iscoroutine(write):
                write.close()
            return
        task = asyncio.get_running_loop().create_task(_quietly(write))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # -- expiry ------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Drop the expired keys from the view and tombstone them, and the lost claims whose
        requests are surely over."""
        now = self._clock()
        gone = [r for r in self._slots.values() if self._expired(r, now)]
        for record in gone:
            self._drop(record.slot)
            self._stale[record.record_key] = record.at
        for key, at in list(self._stale.items()):
            if now - at > self._claim_ttl_s:
                del self._stale[key]
                await self._send(key, None)

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            try:
                await asyncio.wait_for(self.sweep(), self._sweep_interval_s)
            except Exception as exc:  # the next sweep tries again
                log.warning("api_idempotency_sweep_failed", error=repr(exc))

    async def start(self) -> None:
        await super().start()
        self._sweeper = asyncio.create_task(self._sweeping(), name="api-idempotency-sweep")

    async def stop(self) -> None:
        for task in [self._sweeper, *self._writes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await super().stop()


def _sha256(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


async def _quietly(write: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):
        await write


def _replayed(
    held: IdempotencyRecord, print_: str, request_id: str, metrics: ApiMetrics
) -> Response:
    """The answer to a request whose key another request holds."""
    if held.fingerprint != print_:
        metrics.idempotency_refusals.labels("reused").inc()
        return error_response(request_id, ServiceError.of("idempotency_key_reused"))
    if held.answer is None:
        metrics.idempotency_refusals.labels("in_progress").inc()
        return error_response(
            request_id,
            ServiceError.of("idempotency_key_in_progress"),
            headers={"Retry-After": str(IN_PROGRESS_RETRY_S)},
        )
    metrics.idempotency_replays.inc()
    return Response(
        held.answer.body.encode("utf-8"),
        status_code=held.answer.status,
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
    """``run``'s answer, given once per key: a repeat gets the kept answer, another request
    with the key 409, a workspace out of keys 429, each counted in ``metrics``. An error
    ``run`` raises (no answer from the worker) gives the key up, so a retry runs again."""
    if not keys.caught_up and not await keys.wait_caught_up(CLAIM_TIMEOUT_S):
        raise ServiceError.of(
            "run_auth_action_failed",
            "The service is starting (idempotency keys not read yet); nothing was sent.",
        )
    held = keys.holder(workspace_id, key)
    if held is not None:
        return _replayed(held, print_, request_id, metrics)

    def exhausted() -> Response:
        metrics.idempotency_refusals.labels("exhausted").inc()
        return error_response(
            request_id,
            ServiceError.of("idempotency_keys_exhausted"),
            headers={"Retry-After": str(EXHAUSTED_RETRY_S)},
        )

    if keys.held(workspace_id) >= keys.per_workspace:
        return exhausted()
    won, outcome = await keys.claim(workspace_id, key, print_)
    if outcome is None:
        raise ServiceError.of(
            "run_auth_action_failed",
            "The Idempotency-Key could not be recorded in time; nothing was sent. Retry.",
        )
    if isinstance(outcome, _Full):
        return exhausted()
    if not won:
        return _replayed(outcome, print_, request_id, metrics)
    kept = False
    try:
        response = await run()
        kept = await keys.answered(outcome, response.status_code, bytes(response.body))
        if kept:
            metrics.idempotency_keys_stored.inc()
        return response
    finally:
        if not kept:  # no answer kept (an error, a time-out, a cancel): a retry runs again
            keys.forget(outcome)


__all__ = [
    "ANSWER_MAX_BYTES",
    "FULL",
    "HEADER",
    "KEY_MAX_CHARS",
    "KEY_TTL_S",
    "REPLAYED_HEADER",
    "IdempotencyKeys",
    "IdempotencyRecord",
    "StoredAnswer",
    "answer_once",
    "fingerprint",
    "key_of",
]
