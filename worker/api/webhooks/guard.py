"""The wrapper every webhook route runs in: a quota's refusal answered as its catalogued error, any
other exception as the route's catalogued 500, logged without the request's body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from worker.api.bodies import error_response
from worker.api.reading import request_id_of
from worker.api.webhooks.quotas import Refused
from worker.contract.catalogue import ServiceError
from worker.runtime.logs import get_logger

log = get_logger("worker.api.webhooks.routes")

Handler = Callable[[Request], Awaitable[Response]]
#: The catalogued 500s of the webhook routes: of a read, and of a change (sends included).
READ: Final = "get_webhook_endpoint_failed"
UPDATE: Final = "update_webhook_endpoint_failed"


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
