"""The OpenAPI table of the webhook-endpoint routes, and the failures every webhook route
shares."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks import bodies, follow_routes, routes
from worker.api.webhooks.follow_bodies import ReplayStatusResponse
from worker.api.webhooks.quotas import ENDPOINT_QUOTA, TOO_MANY, EndpointLimits
from worker.api.webhooks.replay_status import KEPT_FOR_S, KEPT_PER_WORKSPACE
from worker.api.webhooks.urls import url_rule_text
from worker.documents.openapi.parts import (
    EMPTY_BODY,
    KEY_CHECK,
    RID_HEADER,
    Failure,
    json_body,
    json_response,
    linked,
    no_store,
    operation,
    param,
    path_item,
)
from worker.settings import Settings
from worker.webhooks.replay_scan import REPLAY_ID_RE
from worker.webhooks.targets import TargetPolicy

ON_ENDPOINT: Final = ("EndpointId", "RequestId")
#: The 400 of a route on one endpoint that reads no body.
OPTIONAL_BODY: Final = "Malformed `endpoint_id`, or a body that is not empty or a JSON object."
_WITH_SECRET: Final = "The endpoint and its signing secret (`whsec_...`): store it now."
_ENDPOINT_QUOTA: Final = Settings.model_fields["webhook_endpoints_per_workspace"].default
_REPLAY_QUOTA: Final = Settings.model_fields["webhook_replays_per_workspace"].default
_NOT_FOUND: Final = Failure(
    "not_found",
    "The endpoint does not exist in the key's workspace (unknown, deleted or another"
    " workspace's: the answers are the same), or the route does not exist.",
)
_REPLAY_NOT_FOUND: Final = Failure(
    "not_found",
    "The endpoint or the replay does not exist in the key's workspace (unknown, of another"
    " endpoint or workspace, or no longer kept: the answers are the same), or the route does"
    " not exist.",
)
_REPLAY_ID: Final = param(
    "replay_id",
    "path",
    f"The `replay_id` the replay request answered; {follow_routes.REPLAY_ID_RULE}. A replay of"
    " another endpoint or workspace answers 404 like an unknown one.",
    {"type": "string", "pattern": REPLAY_ID_RE.pattern},
    examples={"replay": {"value": "rp_0f1e2d3c4b5a69788796a5b4c3d2e1f0"}},
)
#: The operations on one endpoint, which an answer naming the endpoint links to.
_ON_ONE: Final = (
    "getWebhookEndpoint",
    "updateWebhookEndpoint",
    "deleteWebhookEndpoint",
    "deactivateWebhookEndpoint",
    "activateWebhookEndpoint",
    "rotateWebhookEndpointSecret",
    "expirePreviousWebhookEndpointSecret",
    "listWebhookDeliveries",
    "replayWebhookEvents",
    "sendWebhookTest",
)


def webhook_failures(
    failure: str, bad_request: str | None, *more: Failure, not_found: bool = True, extra: str = ""
) -> tuple[Failure, ...]:
    """What a webhook route can answer besides success: its 400 (when it reads input), 401,
    404 (routes on one endpoint), its one catalogued 500, and ``more``."""
    return (
        *((Failure("invalid_request", bad_request),) if bad_request else ()),
        *KEY_CHECK,
        *((_NOT_FOUND,) if not_found else ()),
        Failure(
            failure,
            "The service is not configured for webhooks, or the endpoints could not be read"
            f" or written in time; {extra or 'nothing was changed.'}",
        ),
        *more,
    )


def _endpoint(description: str, model: Any = bodies.EndpointResponse) -> dict[str, Any]:
    """An answer naming one endpoint, linked to every operation on it."""
    to_it = {"endpoint_id": "$response.body#/data/id"}
    return {"200": linked(json_response(description, model), **dict.fromkeys(_ON_ONE, to_it))}


def _secret(status: str, description: str) -> dict[str, Any]:
    answer = _endpoint(f"{description} {_WITH_SECRET}", bodies.EndpointSecretResponse)["200"]
    return {status: no_store(answer, "carries a signing secret")}


def _change(op_id: str, summary: str, description: str, ok: Any, failure: str) -> Any:
    """An operation on one endpoint that reads no body."""
    failures = webhook_failures(failure, OPTIONAL_BODY)
    return operation(
        op_id, summary, description, failures, ok=ok, params=ON_ENDPOINT, body=EMPTY_BODY
    )


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


def endpoint_paths(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The routes on the workspace's endpoints and on one endpoint (``worker.api.webhooks``)."""
    url_rule = _url_rule(policy)
    body_400 = (
        "The body is missing, not JSON, not an object, has unknown fields or invalid values"
        " (an unknown event type, a `url` that is not allowed: the message names the reason),"
        f" or a field over its limit (`url` {limits.url_max_chars} characters, `description`"
        f" {limits.description_max_chars}, `event_types` {limits.event_types_max_items} entries:"
        " the message names the field and the limit)."
    )
    quota = Failure(
        ENDPOINT_QUOTA,
        "The workspace has `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
        f" {_ENDPOINT_QUOTA}): delete one before creating another. Nothing was created.",
    )
    listed = webhook_failures("list_webhook_endpoints_failed", None, not_found=False)
    kept = (
        f"A workspace's newest {KEPT_PER_WORKSPACE} replays are kept, each for"
        f" {KEPT_FOR_S / 3600:g} hours after its last change."
    )
    on_replay = ("EndpointId", _REPLAY_ID, "RequestId")
    replay_status = json_response("The replay.", ReplayStatusResponse)
    to_replay = {
        "endpoint_id": "$response.body#/data/endpoint_id",
        "replay_id": "$response.body#/data/replay_id",
    }
    replay_refused = Failure(
        TOO_MANY,
        "The workspace already has `WEBHOOK_REPLAYS_PER_WORKSPACE` replays (default"
        f" {_REPLAY_QUOTA}) in progress on this front-end, or the front-end has as many as it"
        " runs and queues (`WEBHOOK_REPLAY_MAX_RUNNING` + `WEBHOOK_REPLAY_MAX_QUEUED`); the"
        " message says which. Nothing was started; retry after `Retry-After` seconds.",
    )
    return {
        **path_item(
            routes.WEBHOOK_ENDPOINTS,
            post=operation(
                "createWebhookEndpoint",
                "Create a webhook endpoint",
                f"{url_rule} Absent or `null` `event_types` subscribes to every event type."
                " The answer is the only time the signing secret is shown (until a rotation)."
                " A workspace has at most `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
                f" {_ENDPOINT_QUOTA}; deleted ones do not count).",
                webhook_failures(
                    "create_webhook_endpoint_failed",
                    body_400,
                    quota,
                    not_found=False,
                    extra="nothing was created.",
                ),
                ok=_secret("201", "Created."),
                body=json_body(bodies.CreateEndpointBody, "The new endpoint."),
            ),
            get=operation(
                "listWebhookEndpoints",
                "List the workspace's webhook endpoints",
                "Oldest first; secrets are never listed.",
                listed,
                ok={"200": json_response("The endpoints.", bodies.EndpointListResponse)},
            ),
        ),
        **path_item(
            routes.WEBHOOK_ENDPOINT,
            get=operation(
                "getWebhookEndpoint",
                "A webhook endpoint",
                "Its signing secret is not shown.",
                webhook_failures("get_webhook_endpoint_failed", "Malformed `endpoint_id`."),
                ok=_endpoint("The endpoint."),
                params=ON_ENDPOINT,
            ),
            patch=operation(
                "updateWebhookEndpoint",
                "Change a webhook endpoint",
                f"Send at least one of `url`, `event_types`, `description`. {url_rule}"
                " `event_types: null` subscribes to every event type; `description: null`"
                " clears it.",
                webhook_failures(
                    "update_webhook_endpoint_failed",
                    "Malformed `endpoint_id`; or: " + body_400 + " An empty object.",
                ),
                ok=_endpoint("The endpoint."),
                params=ON_ENDPOINT,
                body=json_body(bodies.UpdateEndpointBody, "The fields to change."),
            ),
            delete=_change(
                "deleteWebhookEndpoint",
                "Delete a webhook endpoint",
                "Deliveries to it stop; its id answers 404 from then on.",
                {"204": {"description": "Deleted; no body.", "headers": dict(RID_HEADER)}},
                "delete_webhook_endpoint_failed",
            ),
        ),
        **path_item(
            routes.WEBHOOK_DEACTIVATE,
            post=_change(
                "deactivateWebhookEndpoint",
                "Stop deliveries to an endpoint",
                "`status` becomes `inactive`; events that occur meanwhile are not delivered"
                " (replay them after activating).",
                _endpoint("The endpoint."),
                "deactivate_webhook_endpoint_failed",
            ),
        ),
        **path_item(
            routes.WEBHOOK_ACTIVATE,
            post=_change(
                "activateWebhookEndpoint",
                "Resume deliveries to an endpoint",
                "`status` becomes `active`, also after the dispatcher disabled it.",
                _endpoint("The endpoint."),
                "update_webhook_endpoint_failed",
            ),
        ),
        **path_item(
            routes.WEBHOOK_ROTATE,
            post=_change(
                "rotateWebhookEndpointSecret",
                "Rotate the signing secret",
                "A new secret signs every delivery from now on; the previous one keeps signing"
                " beside it (two `v1,` signatures) for `WEBHOOK_SECRET_OVERLAP_S` (default 24"
                " h), so receivers can switch without losing a delivery. Any older secret"
                " stops signing: at most two ever sign. `expire-previous-secret` ends the"
                " overlap early.",
                _secret("200", "Rotated."),
                "update_webhook_endpoint_failed",
            ),
        ),
        **path_item(
            routes.WEBHOOK_EXPIRE_PREVIOUS,
            post=_change(
                "expirePreviousWebhookEndpointSecret",
                "Stop the previous signing secret now",
                "Ends a rotation's overlap early: from now on only the current secret signs"
                " (one `v1,` signature). Call it once receivers verify with the new secret, or"
                " right after rotating a leaked one. Answers the endpoint (without a secret);"
                " nothing changes when only the current secret signs already.",
                _endpoint("The endpoint."),
                "update_webhook_endpoint_failed",
            ),
        ),
        **path_item(
            routes.WEBHOOK_REPLAY,
            post=operation(
                "replayWebhookEvents",
                "Re-send the endpoint's events since a time",
                "Accepted at once; the events of the endpoint's types that occurred at or after"
                " `since` are delivered again in the background, with their original"
                " `webhook-id` (receivers de-duplicate on it).",
                webhook_failures(
                    "update_webhook_endpoint_failed",
                    "Malformed `endpoint_id`; a missing or invalid body (`since` not an RFC"
                    " 3339 date-time, unknown fields).",
                    replay_refused,
                ),
                ok={
                    "202": linked(
                        json_response("Accepted.", bodies.ReplayAcceptedResponse),
                        getWebhookReplay=to_replay,
                        cancelWebhookReplay=to_replay,
                    )
                },
                params=ON_ENDPOINT,
                body=json_body(bodies.ReplayBody, "Where to start."),
            ),
        ),
        **path_item(
            follow_routes.WEBHOOK_REPLAY_STATUS,
            get=operation(
                "getWebhookReplay",
                "A replay's state and counts",
                "The state (`queued`, `running`, `done`, `cancelled`, `failed`) and counts of a"
                " replay started by `POST .../replay`, from any front-end replica. " + kept,
                webhook_failures(
                    "get_webhook_endpoint_failed",
                    "Malformed `endpoint_id` or `replay_id`.",
                    _REPLAY_NOT_FOUND,
                    not_found=False,
                ),
                ok={"200": replay_status},
                params=on_replay,
            ),
        ),
        **path_item(
            follow_routes.WEBHOOK_REPLAY_CANCEL,
            post=operation(
                "cancelWebhookReplay",
                "Cancel a replay",
                "202: the cancellation is asked for; the replica running the replay stops it"
                " within about a second (`state` becomes `cancelled`; events already handed to"
                " the dispatcher are still delivered). 200: the replay had already ended, it is"
                " unchanged.",
                webhook_failures(
                    "update_webhook_endpoint_failed",
                    OPTIONAL_BODY.replace("`endpoint_id`", "`endpoint_id` or `replay_id`"),
                    _REPLAY_NOT_FOUND,
                    not_found=False,
                ),
                ok={
                    "200": json_response(
                        "The replay had already ended: unchanged.", ReplayStatusResponse
                    ),
                    "202": json_response("The cancellation is asked for.", ReplayStatusResponse),
                },
                params=on_replay,
            ),
        ),
    }
