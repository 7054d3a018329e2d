"""What a writer on ``api.presence`` that is not a front-end can do to the limits: records
from the future, and a flood of made-up replica ids. Neither may shrink every replica's share
of a workspace's rate for ever, nor grow a replica's memory without bound."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import ConsumerRecord

from worker.api.presence import (
    FORGET_AFTER_S,
    MAX_REPLICAS,
    PRESENCE_TTL_S,
    Presence,
    PresenceRecord,
)

NOW = 1_800_000_000.0


def _record(replica_id: str, at: float, seq: int = 0) -> ConsumerRecord[bytes, bytes]:
    value = PresenceRecord(replica_id=replica_id, at=at, seq=seq).model_dump_json().encode()
    return ConsumerRecord("p", 0, seq, 0, 0, replica_id.encode(), value, None, 1, 1, [])


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((args, kwargs))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _presence() -> Presence:
    return Presence(None, "p", _Producer(), replica_id="api_me", clock=lambda: NOW)


def test_a_record_from_the_future_does_not_count_as_live() -> None:
    presence = _presence()
    presence.handle([_record("api_honest", NOW - 1), _record("api_forged", NOW + 10**9)])
    assert presence.live() == 2, "the forged replica would shrink every share for ever"
    presence.handle([_record("api_skewed", NOW + PRESENCE_TTL_S / 2)])
    assert presence.live() == 3, "a clock a little ahead still counts"


async def test_a_record_from_the_future_is_forgotten() -> None:
    presence = _presence()
    presence.handle([_record("api_forged", NOW + FORGET_AFTER_S * 10)])
    await presence.forget_dead()
    assert presence.live() == 1
    assert "api_forged" not in presence._seen


def test_made_up_replica_ids_are_bounded() -> None:
    presence = _presence()
    presence.handle([_record(f"api_{i:032x}", NOW) for i in range(MAX_REPLICAS + 500)])
    assert len(presence._seen) == MAX_REPLICAS
    assert presence.ignored == 500
