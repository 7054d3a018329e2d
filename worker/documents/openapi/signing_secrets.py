"""The OpenAPI table of the routes on an endpoint's signing secrets: rotate, and end a
rotation's overlap early."""

from __future__ import annotations

from typing import Any

from worker.api.webhooks.bodies import EndpointSecretResponse
from worker.api.webhooks.routes import WEBHOOK_EXPIRE_PREVIOUS, WEBHOOK_ROTATE
from worker.documents.openapi.parts import EMPTY_BODY, preflight
from worker.documents.openapi.webhook_parts import (
    OPTIONAL_BODY,
    WITH_SECRET,
    endpoint_answer,
    secret_response,
    webhook_failures,
    webhook_operation,
)


def signing_secret_paths() -> dict[str, Any]:
    """``POST .../rotate-secret`` and ``POST .../expire-previous-secret``."""
    return {
        WEBHOOK_ROTATE: {
            "post": webhook_operation(
                "rotateWebhookEndpointSecret",
                "Rotate the signing secret",
                "A new secret signs every delivery from now on; the previous one keeps signing"
                " beside it (two `v1,` signatures) for `WEBHOOK_SECRET_OVERLAP_S` (default 24"
                " h), so receivers can switch without losing a delivery. Any older secret"
                " stops signing: at most two ever sign. `expire-previous-secret` ends the"
                " overlap early.",
                one_endpoint=True,
                portal=True,
                ok_status="200",
                ok=secret_response(f"Rotated. {WITH_SECRET}", EndpointSecretResponse),
                failures=webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=OPTIONAL_BODY
                ),
                body=EMPTY_BODY,
            ),
            "options": preflight("preflightRotateWebhookEndpointSecret", "endpoint_id"),
        },
        WEBHOOK_EXPIRE_PREVIOUS: {
            "post": webhook_operation(
                "expirePreviousWebhookEndpointSecret",
                "Stop the previous signing secret now",
                "Ends a rotation's overlap early: from now on only the current secret signs"
                " (one `v1,` signature). Call it once receivers verify with the new secret, or"
                " right after rotating a leaked one. Answers the endpoint (without a secret);"
                " nothing changes when only the current secret signs already.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint_answer(),
                failures=webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=OPTIONAL_BODY
                ),
                body=EMPTY_BODY,
            ),
            "options": preflight("preflightExpirePreviousWebhookEndpointSecret", "endpoint_id"),
        },
    }
