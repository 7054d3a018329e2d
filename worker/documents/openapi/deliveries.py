"""The OpenAPI table of the deliveries route: an endpoint's recent deliveries."""

from __future__ import annotations

from typing import Any

from worker.api.webhooks.bodies import DeliveryListResponse
from worker.api.webhooks.quotas import TOO_MANY
from worker.api.webhooks.routes import WEBHOOK_DELIVERIES
from worker.documents.openapi.parts import Failure, json_response, preflight
from worker.documents.openapi.webhook_parts import webhook_failures, webhook_operation


def delivery_paths() -> dict[str, Any]:
    """``GET .../deliveries``."""
    return {
        WEBHOOK_DELIVERIES: {
            "get": webhook_operation(
                "listWebhookDeliveries",
                "Recent deliveries to an endpoint",
                "The latest state of each of the endpoint's most recent deliveries (up to 100),"
                " most recently changed first.",
                one_endpoint=True,
                portal=True,
                ok_status="200",
                ok=json_response("The deliveries.", DeliveryListResponse),
                failures=(
                    *webhook_failures(
                        "get_webhook_endpoint_failed", bad_request="Malformed `endpoint_id`."
                    ),
                    Failure(
                        TOO_MANY,
                        "A deliveries request of the same workspace is still being answered on"
                        " this front-end (one at a time per workspace); retry after"
                        " `Retry-After` seconds.",
                    ),
                ),
            ),
            "options": preflight("preflightWebhookDeliveries", "endpoint_id"),
        },
    }
