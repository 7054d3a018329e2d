"""Which front-end replicas are live, and what each holds, so a workspace's limits hold across
replicas (docs/operations.md, "Front-door limits" and "Quotas").

Each replica writes a record under its id to the compacted, one-partition ``api.presence``
topic every ``PRESENCE_INTERVAL_S`` (and when its replays change) and tails the topic; a
replica is live while its newest record is younger than ``PRESENCE_TTL_S``. ``live`` divides
the per-workspace rate; ``claim`` decides a replay start when this replica reads its own record
back, against every other live replica's latest record before it (one order for all)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.messages import Identifier
from worker.engine.outage import BrokerHealth, send_retrying
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger(__name__)

PRESENCE_INTERVAL_S: Final = 2.0
#: A replica without a record younger than this is not live (three missed heartbeats).
PRESENCE_TTL_S: Final = 3 * PRESENCE_INTERVAL_S
#: How long a claim waits to read its own record back before it is refused.
CLAIM_TIMEOUT_S: Final = 5.0
#: Workspaces a presence record names at most (a replica's replays are bounded far below).
MAX_CLAIMED_WORKSPACES: Final = 1000
#: A replica silent this long is forgotten and its key tombstoned by whoever sees it (one
#: that died without its own tombstone), so neither the topic nor ``_seen`` keeps it.
FORGET_AFTER_S: Final = 20 * PRESENCE_TTL_S
#: Replicas tracked at once: a record naming one more is ignored (and counted). A pool is a
#: handful; anything past this is a writer on the topic that is not a front-end.
MAX_REPLICAS: Final = 256


def new_replica_id() -> str:
    """``api_`` + 32 hex characters, one per front-end process start."""
    return f"api_{uuid.uuid4().hex}"


class PresenceRecord(BaseModel):
    """The value on ``api.presence`` (key: ``replica_id``): a front-end replica is live, and
    holds ``replays`` (workspace id -> replays running or waiting, claims being decided
    included)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["api_presence"] = "api_presence"
    schema_version: Literal[1] = 1
    replica_id: Identifier
    at: float = Field(description="When written: Unix seconds, the writer's clock.")
    seq: int = Field(ge=0, description="The writer's record counter since it started.")
    replays: dict[Identifier, int] = Field(default_factory=dict, max_length=MAX_CLAIMED_WORKSPACES)


class Presence(TopicTail):
    """This replica's heartbeat and its view of the others (see the module docstring).

    ``consumer`` is unstarted and group-less (a ``SharedConsumer`` share); ``producer`` the
    front-end's started producer. ``clock`` (wall clock, seconds) is injectable for tests."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        producer: Any,
        *,
        replica_id: str | None = None,
        health: BrokerHealth | None = None,
        interval_s: float = PRESENCE_INTERVAL_S,
        ttl_s: float = PRESENCE_TTL_S,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(consumer, topic, name="api-presence", idle_timeout_ms=200)
        self.replica_id = replica_id or new_replica_id()
        self._producer = producer
        self._health = health or BrokerHealth()
        self._interval_s = interval_s
        self._ttl_s = ttl_s
        self._claim_timeout_s = claim_timeout_s
        self._clock = clock
        self._seen: dict[str, PresenceRecord] = {}
        self._held: Counter[str] = Counter()  # this replica's replays, claims included
        self._seq = 0
        self._deciding: dict[int, tuple[str, asyncio.Future[int]]] = {}
        self._claiming = asyncio.Lock()
        self._beat: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self.undecodable = 0
        #: Records of replicas past ``MAX_REPLICAS``, ignored.
        self.ignored = 0
        #: Told each replay record (key ``rp_...``) the topic also carries.
        self.forward: Callable[[Any], None] | None = None
        #: Told each record whose key starts with a prefix here (``ps_``: a portal session's
        #: revocation, ``worker.api.portal.revocations``), as ``forward`` is told replays'.
        self.takers: dict[bytes, Callable[[Any], None]] = {}

    # -- what the others hold ------------------------------------------------------------------

    def _others(self) -> Iterable[PresenceRecord]:
        now = self._clock()
        return (
            r
            for r in self._seen.values()
            # A record from the future (a wrong clock, or a forged record) is not live: it
            # would count for ever and never be forgotten.
            if r.replica_id != self.replica_id and abs(now - r.at) < self._ttl_s
        )

    def live(self) -> int:
        """Live replicas, this one included (before any record is read: 1)."""
        return 1 + sum(1 for _ in self._others())

    def held_elsewhere(self, workspace_id: str) -> int:
        """The workspace's replays on the other live replicas, as read so far."""
        return sum(r.replays.get(workspace_id, 0) for r in self._others())

    def handle(self, records: list[Any]) -> None:
        for msg in records:
            if msg.key and msg.key.startswith(b"rp_"):
                if self.forward is not None:  # a replay's (worker.api.webhooks.replay_status)
                    self.forward(msg)
                continue
            taker = _taker(self.takers, msg.key)
            if taker is not None:
                taker(msg)
                continue
            if msg.value is None:
                if msg.key:
                    self._seen.pop(msg.key.decode("utf-8", "replace"), None)
                continue
            try:
                record = PresenceRecord.model_validate_json(msg.value)
            except ValidationError:
                self.undecodable += 1
                continue
            held = self._seen.get(record.replica_id)
            if held is None and len(self._seen) >= MAX_REPLICAS:
                self.ignored += 1
                continue
            if held is None or held.seq < record.seq:  # a resent record may come late
                self._seen[record.replica_id] = record
            if record.replica_id == self.replica_id:
                deciding = self._deciding.pop(record.seq, None)
                if deciding is not None and not deciding[1].done():
                    # Every other replica's latest record before this one: the claim's order.
                    deciding[1].set_result(self.held_elsewhere(deciding[0]))

    # -- writing ---------------------------------------------------------------------------------

    def _next(self) -> tuple[int, bytes]:
        seq = self._seq
        self._seq += 1
        held = {ws: n for ws, n in self._held.items() if n > 0}
        record = PresenceRecord(replica_id=self.replica_id, at=self._clock(), seq=seq, replays=held)
        return seq, record.model_dump_json().encode()

    async def _send(self, value: bytes | None) -> None:
        await send_retrying(
            self._producer,
            self._health,
            self.topic,
            value,
            key=self.replica_id.encode(),
            partition=0,
        )

    async def beat(self) -> None:
        """Write this replica's record now."""
        await self._send(self._next()[1])

    async def forget_dead(self) -> None:
        """Tombstone the records of replicas silent for ``FORGET_AFTER_S``."""
        now = self._clock()
        for replica_id, record in list(self._seen.items()):
            if replica_id != self.replica_id and abs(now - record.at) > FORGET_AFTER_S:
                del self._seen[replica_id]
                await send_retrying(
                    self._producer,
                    self._health,
                    self.topic,
                    None,
                    key=replica_id.encode(),
                    partition=0,
                )

    async def _beating(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.beat(), self._interval_s * 2)
                await asyncio.wait_for(self.forget_dead(), self._interval_s * 2)
            except Exception as exc:  # the next beat tries again
                log.warning("api_presence_beat_failed", error=repr(exc))
            await asyncio.sleep(self._interval_s)

    async def start(self) -> None:
        await super().start()
        await self.beat()
        self._beat = asyncio.create_task(self._beating(), name="api-presence-beat")

    async def stop(self) -> None:
        """Stop beating and tombstone this replica's key (best effort: the TTL covers a
        replica that dies without it)."""
        for task in [self._beat, *self._releases]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._send(None), 2.0)
        await super().stop()

    # -- replay slots ----------------------------------------------------------------------------

    async def claim(self, workspace_id: str, limit: int) -> bool:
        """Take one of the workspace's ``limit`` replay slots across live replicas; ``False``
        when they are all held (or the claim could not be read back in time). A ``True`` must
        be given back with ``release``."""
        async with self._claiming:  # one claim in the log at a time per replica
            mine = self._held[workspace_id]
            if mine >= limit or mine + self.held_elsewhere(workspace_id) >= limit:
                return False
            self._held[workspace_id] += 1
            seq, value = self._next()
            decided: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._deciding[seq] = (workspace_id, decided)
            try:
                async with asyncio.timeout(self._claim_timeout_s):
                    await self._send(value)
                    elsewhere = await decided
            except Exception:  # time-out or broker: refused, the slot given back
                self._deciding.pop(seq, None)
                self.release(workspace_id)
                return False
            if mine + elsewhere >= limit:
                self.release(workspace_id)
                return False
            return True

    def release(self, workspace_id: str) -> None:
        """Give a slot back; the others read it with the next record (written at once)."""
        self._held[workspace_id] -= 1
        if self._held[workspace_id] <= 0:
            del self._held[workspace_id]
        if self.running:
            task = asyncio.get_running_loop().create_task(self._quietly(self.beat()))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    @staticmethod
    async def _quietly(beat: Any) -> None:
        with contextlib.suppress(Exception):
            await beat


def _taker(
    takers: dict[bytes, Callable[[Any], None]], key: bytes | None
) -> Callable[[Any], None] | None:
    if key:
        for prefix, taker in takers.items():
            if key.startswith(prefix):
                return taker
    return None


__all__ = [
    "MAX_REPLICAS",
    "PRESENCE_INTERVAL_S",
    "PRESENCE_TTL_S",
    "Presence",
    "PresenceRecord",
    "new_replica_id",
]
