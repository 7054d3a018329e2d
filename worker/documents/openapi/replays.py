"""The OpenAPI table of the replay route: re-send an endpoint's events since a time."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks.bodies import ReplayAcceptedResponse, ReplayBody
from worker.api.webhooks.quotas import TOO_MANY
from worker.api.webhooks.routes import WEBHOOK_REPLAY
from worker.documents.openapi.follow import replay_links
from worker.documents.openapi.parts import Failure, json_body, json_response, preflight
from worker.documents.openapi.webhook_parts import webhook_failures, webhook_operation
from worker.settings import Settings

_REPLAY_QUOTA: Final = Settings.model_fields["webhook_replays_per_workspace"].default


def replay_paths() -> dict[str, Any]:
    """``POST .../replay``."""
    return {
        WEBHOOK_REPLAY: {
            "post": webhook_operation(
                "replayWebhookEvents",
                "Re-send the endpoint's events since a time",
                "Accepted at once; the events of the endpoint's types that occurred at or after"
                " `since` are delivered again in the background, with their original"
                " `webhook-id` (receivers de-duplicate on it).",
                one_endpoint=True,
                ok_status="202",
                ok=replay_links(json_response("Accepted.", ReplayAcceptedResponse)),
                failures=(
                    *webhook_failures(
                        "update_webhook_endpoint_failed",
                        bad_request="Malformed `endpoint_id`; a missing or invalid body (`since`"
                        " not an RFC 3339 date-time, unknown fields).",
                    ),
                    Failure(
                        TOO_MANY,
                        "The workspace already has `WEBHOOK_REPLAYS_PER_WORKSPACE` replays"
                        f" (default {_REPLAY_QUOTA}) in progress on this front-end, or the"
                        " front-end has as many as it runs and queues"
                        " (`WEBHOOK_REPLAY_MAX_RUNNING` + `WEBHOOK_REPLAY_MAX_QUEUED`); the"
                        " message says which. Nothing was started; retry after `Retry-After`"
                        " seconds.",
                    ),
                ),
                body=json_body(ReplayBody, "Where to start.", required=True),
            ),
            "options": preflight("preflightReplayWebhookEvents", "endpoint_id"),
        },
    }
