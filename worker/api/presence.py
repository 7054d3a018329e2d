"""Which front-end replicas are live and what each holds, so a workspace's limits hold across
replicas (docs/operations.md, "Front-door limits"): each writes its record to the compacted
``api.presence`` topic every ``PRESENCE_INTERVAL_S`` and tails it, live while its newest record is
younger than ``PRESENCE_TTL_S``; ``claim`` orders replay starts by the topic (one order for all)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

from pydantic import Field

from worker.contract.messages import Identifier, TopicRecord
from worker.engine.broker_health import BrokerHealth
from worker.engine.compacted_view import CompactedView

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


class PresenceRecord(TopicRecord):
    """The value on ``api.presence`` (key: ``replica_id``): a front-end replica is live, and
    holds ``replays`` (workspace id -> replays running or waiting, claims being decided
    included)."""

    type: Literal["api_presence"] = "api_presence"
    replica_id: Identifier
    at: float = Field(description="When written: Unix seconds, the writer's clock.")
    seq: int = Field(ge=0, description="The writer's record counter since it started.")
    replays: dict[Identifier, int] = Field(default_factory=dict, max_length=MAX_CLAIMED_WORKSPACES)


class Presence(CompactedView):
    """This replica's heartbeat and its view of the others, on an unstarted group-less
    ``consumer`` and the front-end's started ``producer``."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        producer: Any,
        *,
        replica_id: str | None = None,
        health: BrokerHealth | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(consumer, topic, producer, name="api-presence", health=health)
        self.replica_id = replica_id or new_replica_id()
        self._clock = clock
        self._seen: dict[str, PresenceRecord] = {}
        self._held: Counter[str] = Counter()  # this replica's replays, claims included
        self._seq = 0
        self._claiming = asyncio.Lock()
        #: The workspace of the claim being decided (one at a time: ``_claiming``).
        self._claiming_for = ""
        #: Records of replicas past ``MAX_REPLICAS``, ignored.
        self.ignored = 0

    # -- what the others hold ------------------------------------------------------------------

    def _others(self) -> Iterable[PresenceRecord]:
        now = self._clock()
        return (
            r
            for r in self._seen.values()
            # A record from the future (a wrong clock, or a forged record) is not live: it
            # would count for ever and never be forgotten.
            if r.replica_id != self.replica_id and abs(now - r.at) < PRESENCE_TTL_S
        )

    def live(self) -> int:
        """Live replicas, this one included (before any record is read: 1)."""
        return 1 + sum(1 for _ in self._others())

    def held_elsewhere(self, workspace_id: str) -> int:
        """The workspace's replays on the other live replicas, as read so far."""
        return sum(r.replays.get(workspace_id, 0) for r in self._others())

    def take(self, msg: Any) -> None:
        if msg.value is None:
            if msg.key:
                self._seen.pop(msg.key.decode("utf-8", "replace"), None)
            return
        record = self.decoded(PresenceRecord.model_validate_json, msg.value)
        if record is None:
            return
        held = self._seen.get(record.replica_id)
        if held is None and len(self._seen) >= MAX_REPLICAS:
            self.ignored += 1
            return
        if held is None or held.seq < record.seq:  # a resent record may come late
            self._seen[record.replica_id] = record
        if record.replica_id == self.replica_id:
            # Every other replica's latest record before this one: the claim's order.
            self.read_back(record.seq, lambda: self.held_elsewhere(self._claiming_for))

    # -- writing ---------------------------------------------------------------------------------

    def _next(self) -> tuple[int, bytes]:
        seq = self._seq
        self._seq += 1
        held = {ws: n for ws, n in self._held.items() if n > 0}
        record = PresenceRecord(replica_id=self.replica_id, at=self._clock(), seq=seq, replays=held)
        return seq, record.model_dump_json().encode()

    async def beat(self) -> None:
        await self.send(self.replica_id, self._next()[1])

    async def forget_dead(self) -> None:
        """Tombstone the records of replicas silent for ``FORGET_AFTER_S``."""
        now = self._clock()
        for replica_id, record in list(self._seen.items()):
            if replica_id != self.replica_id and abs(now - record.at) > FORGET_AFTER_S:
                del self._seen[replica_id]
                await self.send(replica_id, None)

    async def _beat_and_forget(self) -> None:
        await self.beat()
        await self.forget_dead()

    async def start(self) -> None:
        await super().start()
        await self.beat()
        self.chores.every(
            PRESENCE_INTERVAL_S, self._beat_and_forget, timeout_s=PRESENCE_INTERVAL_S * 4
        )

    async def stop(self) -> None:
        """Stop beating and tombstone this replica's key (best effort: the TTL covers a
        replica that dies without it)."""
        await self.chores.stop()
        with contextlib.suppress(Exception):
            await self.send(self.replica_id, None, timeout_s=2.0)
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
            self._claiming_for = workspace_id
            seq, value = self._next()
            try:
                elsewhere = await self.send_read_back(seq, self.replica_id, value, CLAIM_TIMEOUT_S)
            except Exception:  # time-out or broker: refused, the slot given back
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
        self.send_quietly(self.replica_id, self._next()[1])


__all__ = [
    "MAX_REPLICAS",
    "PRESENCE_INTERVAL_S",
    "PRESENCE_TTL_S",
    "Presence",
    "PresenceRecord",
    "new_replica_id",
]
