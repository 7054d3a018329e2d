"""``GET /v1/event-types``: the event catalogue, authenticated and rate-counted like every route;
built once, since only the ``request_id`` differs between workspaces' answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.bodies import DataResponse
from worker.api.reading import request_id_of
from worker.webhooks.event_types import catalogue_document

EVENT_TYPES_PATH: Final = "/v1/event-types"


class EnvelopeHeader(BaseModel):
    """One header of every delivery."""

    model_config = ConfigDict(frozen=True)

    description: str
    example: str


class Envelope(BaseModel):
    """What every delivery carries around its body (Standard Webhooks)."""

    model_config = ConfigDict(frozen=True)

    specification: str
    method: str
    headers: dict[str, EnvelopeHeader]
    example_secret: str = Field(
        description="The secret the example signature is made with: to check a verifier "
        "against the examples, never a real one."
    )


class EventTypeEntry(BaseModel):
    """One event type: its name (the body's `type`, what an endpoint subscribes to), what it
    means, the JSON Schema (2020-12) of the whole body and an example body."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    name: str
    description: str
    json_schema: dict[str, Any] = Field(alias="schema", serialization_alias="schema")
    example: dict[str, Any]


class EventCatalogue(BaseModel):
    """Every event type sent to webhook endpoints, and the envelope around each."""

    model_config = ConfigDict(frozen=True)

    envelope: Envelope
    event_types: list[EventTypeEntry]


class EventTypesResponse(DataResponse[EventCatalogue]):
    """Success: the event catalogue."""


def _data_json() -> str:
    """The catalogue's JSON, checked against the published model once."""
    data = EventCatalogue.model_validate(catalogue_document())
    return json.dumps(
        data.model_dump(mode="json", by_alias=True), ensure_ascii=False, separators=(",", ":")
    )


def event_type_routes(admitted_workspace: Callable[[Request], str]) -> list[Route]:
    """The catalogue's route; ``admitted_workspace`` is ``ApiRoutes.admitted_workspace`` (the
    key's workspace, once its rate admits the request)."""
    data = _data_json()

    async def event_types(request: Request) -> Response:
        admitted_workspace(request)
        request_id = json.dumps(request_id_of(request))
        body = f'{{"request_id":{request_id},"data":{data}}}'
        return Response(body.encode("utf-8"), media_type=JSONResponse.media_type)

    return [Route(EVENT_TYPES_PATH, event_types, methods=["GET"])]


__all__ = [
    "EVENT_TYPES_PATH",
    "EventCatalogue",
    "EventTypeEntry",
    "EventTypesResponse",
    "event_type_routes",
]
