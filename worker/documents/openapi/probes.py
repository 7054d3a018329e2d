"""The OpenAPI table of the probes the public port answers (no API key)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from worker.api.bodies import ApiHealth
from worker.documents.openapi.parts import json_response
from worker.runtime.probes import PublicReadiness


def _probe(
    operation_id: str, summary: str, model: type[BaseModel], ok: str, failed: str
) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": json_response(ok, model),
                "503": json_response(failed, model),
            },
        }
    }


def probe_paths() -> dict[str, Any]:
    """``GET /healthz`` and ``GET /readyz``."""
    return {
        "/healthz": _probe(
            "healthz",
            "Liveness: the process and its Kafka readers run",
            ApiHealth,
            "Alive.",
            "A Kafka reader died.",
        ),
        "/readyz": _probe(
            "readyz",
            "Readiness: reply consumer positioned and webhook registry caught up",
            PublicReadiness,
            "Ready.",
            "Not ready (why is on the operator's side door).",
        ),
    }
