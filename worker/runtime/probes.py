"""``/metrics``, ``/healthz`` and ``/readyz``: one implementation for every process's side door;
each process supplies its checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ProbeCheck = Callable[[], tuple[bool, BaseModel]]
"""Whether the probe passes, and the body it answers with."""


class Probes:
    """The three probe handlers over a registry and two checks."""

    def __init__(
        self, registry: CollectorRegistry, *, health: ProbeCheck, readiness: ProbeCheck
    ) -> None:
        self.registry = registry
        self._health = health
        self._readiness = readiness

    def routes(self) -> list[Route]:
        """The side door's ``GET`` routes, ``/readyz`` with its details (Starlette adds
        ``HEAD`` to them; the front-end takes it off)."""
        return [
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]

    def health_routes(self) -> list[Route]:
        """``/healthz`` and ``/readyz`` for a public port: readiness is ``{"ready": ...}``
        alone, since which dependency is down (the broker, a reader) is the operator's to know,
        on the side door, not every caller's."""
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.public_readyz, methods=["GET"]),
        ]

    async def metrics(self, _: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, _: Request) -> Response:
        return _answer(*self._health())

    async def readyz(self, _: Request) -> Response:
        return _answer(*self._readiness())

    async def public_readyz(self, _: Request) -> Response:
        ok, _details = self._readiness()
        return _answer(ok, PublicReadiness(ready=ok))


def _answer(ok: bool, body: BaseModel) -> Response:
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ok else 503)


class PublicReadiness(BaseModel):
    """``/readyz`` on a public port, ready or not, nothing of why (a worker: joined, restored)."""

    ready: bool


class WorkerHealth(BaseModel):
    """``/healthz`` of a worker: the consume loop's heartbeat and its age."""

    status: Literal["ok", "stalled"]
    heartbeat_age_s: float


def build_probe_app(
    registry: CollectorRegistry,
    *,
    last_beat: Callable[[], float],
    ready: Callable[[], bool],
    stale_after_s: float = 15.0,
) -> Starlette:
    """The worker's side door. ``last_beat`` returns the loop's last ``time.monotonic()``
    heartbeat; ``/healthz`` fails once it is ``stale_after_s`` old."""

    def health() -> tuple[bool, BaseModel]:
        age = time.monotonic() - last_beat()
        ok = age < stale_after_s
        return ok, WorkerHealth(status="ok" if ok else "stalled", heartbeat_age_s=round(age, 3))

    def readiness() -> tuple[bool, BaseModel]:
        ok = ready()
        return ok, PublicReadiness(ready=ok)

    return Starlette(routes=Probes(registry, health=health, readiness=readiness).routes())
