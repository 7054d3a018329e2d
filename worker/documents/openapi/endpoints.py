"""The OpenAPI table of the webhook-endpoint routes: create and list, read, change and delete
one, stop and resume its deliveries."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks.bodies import (
    CreateEndpointBody,
    EndpointListResponse,
    EndpointSecretResponse,
    UpdateEndpointBody,
)
from worker.api.webhooks.quotas import ENDPOINT_QUOTA, EndpointLimits
from worker.api.webhooks.routes import (
    WEBHOOK_ACTIVATE,
    WEBHOOK_DEACTIVATE,
    WEBHOOK_ENDPOINT,
    WEBHOOK_ENDPOINTS,
)
from worker.api.webhooks.urls import url_rule_text
from worker.documents.openapi.parts import (
    EMPTY_BODY,
    RID_HEADER,
    Failure,
    json_body,
    json_response,
    preflight,
)
from worker.documents.openapi.webhook_parts import (
    OPTIONAL_BODY,
    WITH_SECRET,
    endpoint_answer,
    secret_response,
    webhook_failures,
    webhook_operation,
)
from worker.settings import Settings
from worker.webhooks.targets import TargetPolicy

_ENDPOINT_QUOTA: Final = Settings.model_fields["webhook_endpoints_per_workspace"].default


def _url_rule(policy: TargetPolicy) -> str:
    """The ``url`` a create or change accepts under ``policy``."""
    scheme = "`https` or `http`" if policy.allow_http else "`https`"
    return (
        f"`url` must be an absolute {scheme} URL (no user or password) of the form its"
        f" `pattern` states ({url_rule_text(allow_http=policy.allow_http)}), whose host is"
        # The same words whichever way private targets are set: the public document does not
        # tell which (a deployment's configuration is the operator's).
        " not a loopback, private, link-local or otherwise special address unless the"
        " deployment allows private targets (then any but an unspecified, multicast or"
        " broadcast one); checked again, on every address the name resolves to, when"
        " delivering."
    )


def _body_400(limits: EndpointLimits) -> str:
    """Why a create or change body answers 400 under ``limits``."""
    return (
        "The body is missing, not JSON, not an object, has unknown fields or invalid values"
        " (an unknown event type, a `url` that is not allowed: the message names the reason),"
        f" or a field over its limit (`url` {limits.url_max_chars} characters, `description`"
        f" {limits.description_max_chars}, `event_types` {limits.event_types_max_items} entries:"
        " the message names the field and the limit)."
    )


def endpoint_paths(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The routes on the workspace's endpoints and on one endpoint's record and status
    (``worker.api.webhooks.routes``)."""
    url_rule = _url_rule(policy)
    body_400 = _body_400(limits)
    return {
        WEBHOOK_ENDPOINTS: {
            "post": webhook_operation(
                "createWebhookEndpoint",
                "Create a webhook endpoint",
                f"{url_rule} Absent or `null` `event_types` subscribes to every event type."
                " The answer is the only time the signing secret is shown (until a rotation)."
                " A workspace has at most `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
                f" {_ENDPOINT_QUOTA}; deleted ones do not count).",
                one_endpoint=False,
                ok_status="201",
                ok=secret_response(f"Created. {WITH_SECRET}", EndpointSecretResponse),
                failures=(
                    *webhook_failures(
                        "create_webhook_endpoint_failed",
                        bad_request=body_400,
                        not_found=False,
                        extra="nothing was created.",
                    ),
                    Failure(
                        ENDPOINT_QUOTA,
                        "The workspace has `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
                        f" {_ENDPOINT_QUOTA}): delete one before creating another. Nothing was"
                        " created.",
                    ),
                ),
                body=json_body(CreateEndpointBody, "The new endpoint.", required=True),
            ),
            "get": webhook_operation(
                "listWebhookEndpoints",
                "List the workspace's webhook endpoints",
                "Oldest first; secrets are never listed.",
                one_endpoint=False,
                portal=True,
                ok_status="200",
                ok=json_response("The endpoints.", EndpointListResponse),
                failures=webhook_failures(
                    "list_webhook_endpoints_failed", bad_request=None, not_found=False
                ),
            ),
            "options": preflight("preflightWebhookEndpoints"),
        },
        WEBHOOK_ENDPOINT: {
            "get": webhook_operation(
                "getWebhookEndpoint",
                "A webhook endpoint",
                "Its signing secret is not shown.",
                one_endpoint=True,
                portal=True,
                ok_status="200",
                ok=endpoint_answer(),
                failures=webhook_failures(
                    "get_webhook_endpoint_failed", bad_request="Malformed `endpoint_id`."
                ),
            ),
            "patch": webhook_operation(
                "updateWebhookEndpoint",
                "Change a webhook endpoint",
                f"Send at least one of `url`, `event_types`, `description`. {url_rule}"
                " `event_types: null` subscribes to every event type; `description: null`"
                " clears it.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint_answer(),
                failures=webhook_failures(
                    "update_webhook_endpoint_failed",
                    bad_request="Malformed `endpoint_id`; or: " + body_400 + " An empty object.",
                ),
                body=json_body(UpdateEndpointBody, "The fields to change.", required=True),
            ),
            "delete": webhook_operation(
                "deleteWebhookEndpoint",
                "Delete a webhook endpoint",
                "Deliveries to it stop; its id answers 404 from then on.",
                one_endpoint=True,
                ok_status="204",
                ok={"description": "Deleted; no body.", "headers": dict(RID_HEADER)},
                failures=webhook_failures(
                    "delete_webhook_endpoint_failed", bad_request=OPTIONAL_BODY
                ),
                body=EMPTY_BODY,
            ),
            "options": preflight("preflightWebhookEndpoint", "endpoint_id"),
        },
        WEBHOOK_DEACTIVATE: {
            "post": webhook_operation(
                "deactivateWebhookEndpoint",
                "Stop deliveries to an endpoint",
                "`status` becomes `inactive`; events that occur meanwhile are not delivered"
                " (replay them after activating).",
                one_endpoint=True,
                portal=True,
                ok_status="200",
                ok=endpoint_answer(),
                failures=webhook_failures(
                    "deactivate_webhook_endpoint_failed", bad_request=OPTIONAL_BODY
                ),
                body=EMPTY_BODY,
            ),
            "options": preflight("preflightDeactivateWebhookEndpoint", "endpoint_id"),
        },
        WEBHOOK_ACTIVATE: {
            "post": webhook_operation(
                "activateWebhookEndpoint",
                "Resume deliveries to an endpoint",
                "`status` becomes `active`, also after the dispatcher disabled it.",
                one_endpoint=True,
                portal=True,
                ok_status="200",
                ok=endpoint_answer(),
                failures=webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=OPTIONAL_BODY
                ),
                body=EMPTY_BODY,
            ),
            "options": preflight("preflightActivateWebhookEndpoint", "endpoint_id"),
        },
    }
