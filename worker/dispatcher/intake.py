"""What a record of auth.status, auth.errors or webhook.replays asks of the dispatcher: its
event and the endpoints it goes to, read against the endpoint registry (docs/architecture.md,
"Webhook fan-out"). Decoding only: nothing is written here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord

from worker.contract.delivery_log import Replay, decode_replay
from worker.contract.operational_events import OperationalRecord, is_operational
from worker.contract.webhook_endpoints import is_pending
from worker.contract.webhook_events import WebhookEvent, from_copy, from_error, from_status
from worker.dispatcher.instrumentation import Incoming, Undecodable
from worker.runtime.logs import get_logger
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.replay_scan import recovery_replay_id

log = get_logger(__name__)

_REPLAYED = {"status": from_status, "errors": from_error, "webhook": from_copy}


@dataclass(frozen=True, slots=True)
class Intake:
    """Reads records against ``endpoints``. ``endpoints_to_end`` reads the registry's tail to
    the end webhook.endpoints has now (``TopicTail.read_to_end``): the front-end writes an
    endpoint before it accepts a replay for it, but the tail's own consumer can be behind the
    one that fetched the replay (a fetch wait apart, or a start's catch-up)."""

    endpoints: EndpointRegistry
    status_topic: str
    replay_topic: str
    endpoints_to_end: Callable[[], Awaitable[bool]] | None = None

    async def read_current(self, msg: ConsumerRecord[bytes, bytes]) -> Incoming | Undecodable:
        """The record's event and its endpoints (``_decode``); for a replay whose endpoint the
        registry has never read, or holds as a create still pending (the front-end that took the
        send in had read its activation), that endpoint looked up again once the registry's
        tail read to the end. Still lacking: deleted, or another workspace's; it goes nowhere.
        An endpoint the registry holds for another workspace, or saw deleted, needs no second
        look: one ListOffsets request per queued replay of a deleted endpoint saved."""
        read, replay = self._decode(msg)
        if replay is None or self.endpoints_to_end is None or not isinstance(read, Incoming):
            return read
        if self._recovery_seen_disabled(replay):
            # The recovery re-enabled the endpoint before it queued this replay, but another
            # member's registry may not have read that write yet: read to the end once, so a
            # missed event is not failed as "endpoint disabled" by a stale view.
            await self.endpoints_to_end()
            return self._replay_to(read.event, replay)
        if read.targets and not is_pending(read.targets[0]):
            return read
        current = True
        if read.targets or not self.endpoints.known(replay.endpoint_id):
            # Held as a create still pending here, it was active on the front-end that took
            # this send in: this registry is behind the activation.
            current = await self.endpoints_to_end()
            read = self._replay_to(read.event, replay)
        if not read.targets:
            log.info(
                "webhook_replay_endpoint_gone",
                partition=msg.partition,
                offset=msg.offset,
                registry_current=current,
            )
        return read

    def _recovery_seen_disabled(self, replay: Replay) -> bool:
        """``replay`` is the recovery of the disable this registry still holds: a stale view,
        since the recovery's replay is queued only after its endpoint was written active."""
        held = self.endpoints.get(replay.workspace_id, replay.endpoint_id)
        return (
            held is not None
            and held.status == "disabled"
            and held.recovery is not None
            and recovery_replay_id(held.id, held.recovery.disabled_at) == replay.replay_id
        )

    def _decode(
        self, msg: ConsumerRecord[bytes, bytes]
    ) -> tuple[Incoming | Undecodable, Replay | None]:
        """The record's event and the endpoints it goes to (those of its workspace subscribed to
        its type, or a replay request's one endpoint: none when it is gone, or of another
        workspace than the event), and the replay request it was (``None`` for any other)."""
        try:
            if msg.topic == self.replay_topic and is_operational(msg.value):
                return operational_incoming(msg.value or b"", self.endpoints), None
            if msg.topic == self.replay_topic:
                replay = decode_replay(msg.value or b"")
                return self._replay_to(
                    _REPLAYED[replay.source](replay.event.encode()), replay
                ), replay
            if msg.value is None:
                raise ValueError("no value")
            decode = from_status if msg.topic == self.status_topic else from_error
            event = decode(msg.value)
        except Exception as exc:
            # Nothing can be delivered from it: to the DLQ as it came, never fatal.
            return Undecodable(type(exc).__name__, f"{type(exc).__name__}: {str(exc)[:200]}"), None
        if event.workspace_id is None:
            return Incoming(event, ()), None
        return Incoming(
            event, self.endpoints.subscribers(event.workspace_id, event.event_type)
        ), None

    def _replay_to(self, event: WebhookEvent, replay: Replay) -> Incoming:
        """A replay's event to its one endpoint, as the registry holds it now."""
        endpoint = self.endpoints.get(replay.workspace_id, replay.endpoint_id)
        if endpoint is None or event.workspace_id != replay.workspace_id:
            return Incoming(event, ())
        return Incoming(event, (endpoint,), replay.replay_id)


def operational_incoming(value: bytes, endpoints: EndpointRegistry) -> Incoming:
    """The deliveries of an operational record: the workspace's active endpoints whose
    ``event_types`` name its type (opt-in: an endpoint without a filter keeps receiving the
    account events it was built for, never a body of another shape), the subject endpoint
    excepted. Raises ``pydantic.ValidationError`` for a value that is not one."""
    record = OperationalRecord.model_validate_json(value)
    targets = [
        e
        for e in endpoints.subscribers(record.workspace_id, record.event_type)
        if e.id != record.endpoint_id and e.event_types is not None
    ]
    return Incoming(record.event(), targets)
