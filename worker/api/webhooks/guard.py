"""The wrapper every webhook route runs in: a quota's refusal answered as its catalogued error, any
other exception as the route's catalogued 500, logged without the request's body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.bodies import error_response
from worker.api.reading import request_id_of
from worker.api.webhooks.clients import WebhookClients
from worker.api.webhooks.creates import is_pending
from worker.api.webhooks.quotas import Refused
from worker.contract.catalogue import ServiceError
from worker.contract.webhook_endpoints import EndpointRecord
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger("worker.api.webhooks.routes")

Handler = Callable[[Request], Awaitable[Response]]
#: The catalogued 500s of the webhook routes: of a read, and of a change (sends included).
READ: Final = "get_webhook_endpoint_failed"
UPDATE: Final = "update_webhook_endpoint_failed"
NOT_CONFIGURED: Final = "The service is not configured for webhooks; nothing was changed."
NOT_FOUND: Final = "The webhook endpoint does not exist in this workspace."


def guarded(
    handler: Handler, failure: str, template: str, refused: Callable[[str], None]
) -> Handler:
    """``handler`` with a quota's refusal answered (and told to ``refused``) and any
    unexpected exception turned into the route's catalogued 500."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Refused as exc:
            refused(exc.quota)
            log.info(
                "webhook_quota_refused",
                request_id=request_id_of(request),
                route=template,
                quota=exc.quota,
            )
            response = error_response(request_id_of(request), exc.error)
            if exc.retry_after_s is not None:
                response.headers["Retry-After"] = str(exc.retry_after_s)
            return response
        except ServiceError:
            raise
        except Exception as exc:
            log.error(
                "webhook_route_failed",
                request_id=request_id_of(request),
                route=template,
                error=type(exc).__name__,
            )
            raise ServiceError.of(failure) from None

    return endpoint


@dataclass(eq=False, kw_only=True)
class WebhookHandlers:
    """What the handlers of every webhook route start from: ``clients`` is ``None`` when the
    service has no secrets key, and every route then answers its 500; ``admitted_workspace`` is
    the front-end's key check and rate limit (``ApiRoutes.admitted_workspace``); ``wait_s``
    bounds how long a request waits for a read model to catch up at start-up; ``refused``
    counts quota refusals."""

    #: The 500's messages while a read model catches up at start-up, and once it has stopped.
    NOT_YET: ClassVar[str] = "Not available yet; retry shortly."
    DOWN: ClassVar[str] = "Not available right now."

    clients: WebhookClients | None
    admitted_workspace: Callable[[Request], str]
    wait_s: float
    refused: Callable[[str], None]

    def route(self, path: str, handler: Handler, method: str, failure: str) -> Route:
        return Route(path, guarded(handler, failure, path, self.refused), methods=[method])

    def _caller(self, request: Request, failure: str) -> tuple[WebhookClients, str]:
        """The clients and the key's workspace (key check and rate limit first)."""
        workspace_id = self.admitted_workspace(request)
        if self.clients is None:
            raise ServiceError.of(failure, NOT_CONFIGURED)
        return self.clients, workspace_id

    async def _ready(self, failure: str, *tails: TopicTail) -> None:
        """The read models are caught up (waiting up to ``wait_s`` at start-up) and alive."""
        for tail in tails:
            if not tail.caught_up and not await tail.wait_caught_up(self.wait_s):
                raise ServiceError.of(failure, self.NOT_YET)
            if not tail.running:
                raise ServiceError.of(failure, self.DOWN)

    @staticmethod
    def _find(clients: WebhookClients, workspace_id: str, endpoint_id: str) -> EndpointRecord:
        """The workspace's endpoint, or the one 404 (also for a create not yet admitted)."""
        record = clients.store.registry.get(workspace_id, endpoint_id)
        if record is None or is_pending(record):
            raise ServiceError.of("not_found", NOT_FOUND)
        return record
