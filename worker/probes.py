"""The worker's HTTP side door: ``/metrics``, ``/healthz`` (the loop's own heartbeat) and
``/readyz`` (group joined and every owned partition restored)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_probe_app(
    registry: CollectorRegistry,
    *,
    last_beat: Callable[[], float],
    ready: Callable[[], bool],
    stale_after_s: float = 15.0,
) -> Starlette:
    """``last_beat`` returns the loop's last ``time.monotonic()`` heartbeat."""

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        age = time.monotonic() - last_beat()
        ok = age < stale_after_s
        return JSONResponse(
            {"status": "ok" if ok else "stalled", "heartbeat_age_s": round(age, 3)},
            status_code=200 if ok else 503,
        )

    async def readyz(_: Request) -> Response:
        ok = ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
        ]
    )
