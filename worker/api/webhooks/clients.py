"""The started clients behind the webhook routes, in a module of their own so the route modules
import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass

from worker.api.webhooks.account_events import AccountEvents, CursorCodec
from worker.api.webhooks.delivery_log_scan import DeliveryLogScan
from worker.api.webhooks.replay import ReplayRunner
from worker.api.webhooks.sends import DeliverySends
from worker.engine.tail import TopicTail
from worker.webhooks.announcer import Announcer
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointsTail


@dataclass(frozen=True)
class WebhookClients:
    """The started clients behind the routes, present only when webhooks are configured."""

    endpoints: EndpointsTail
    store: EndpointStore
    deliveries: DeliveryLogScan
    replays: ReplayRunner
    #: Announces ``endpoint.enabled`` (``worker.webhooks.announcer``).
    announcer: Announcer
    #: An account's events and their cursors (``follow_routes``; a replay's progress is on
    #: ``replays.board``).
    events: AccountEvents
    cursors: CursorCodec
    sends: DeliverySends

    @property
    def tails(self) -> tuple[TopicTail, ...]:
        return (self.endpoints,)
