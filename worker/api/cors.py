"""The front-end's CORS policy, the one copy the middleware and the OpenAPI document use. The key is
meant for servers, so by default every preflight is refused (docs/api.md, "CORS")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

CORS_METHODS: Final = ("GET", "POST", "PATCH", "DELETE")
CORS_HEADERS: Final = ("X-Api-Key", "Content-Type", "X-Request-Id", "Idempotency-Key")
CORS_MAX_AGE_S: Final = 600
ALLOW_METHODS: Final = ", ".join(CORS_METHODS)
"""``Access-Control-Allow-Methods`` of an allowed preflight."""
ALLOW_HEADERS: Final = ", ".join(CORS_HEADERS)
"""``Access-Control-Allow-Headers`` of an allowed preflight."""
EXPOSE_HEADERS: Final = "X-Request-Id, Retry-After, Idempotent-Replayed"
"""``Access-Control-Expose-Headers`` of an actual request from an allowed origin (a 429's
``Retry-After`` is not a CORS-safelisted response header)."""


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Allowlisted origins (exact match; ``*`` allows any), fixed methods and headers."""

    origins: frozenset[str]

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def preflight_refusal(
        self, origin: str, method: str, requested_headers: str | None
    ) -> str | None:
        """Why a preflight is refused, or ``None`` when it is allowed."""
        if not self.origin_allowed(origin):
            return f"Origin {origin[:200]!r} is not allowed."
        if method not in CORS_METHODS:
            return f"Method {method[:40]!r} is not allowed; allowed: {ALLOW_METHODS}."
        allowed = {h.lower() for h in CORS_HEADERS}
        requested = [h.strip().lower() for h in (requested_headers or "").split(",")]
        refused = sorted({h for h in requested if h and h not in allowed})
        if refused:
            return (
                f"Request headers {', '.join(refused)[:200]} are not allowed;"
                f" allowed: {ALLOW_HEADERS}."
            )
        return None

    @staticmethod
    def preflight_headers(origin: str) -> dict[str, str]:
        """The headers of an allowed preflight's 204."""
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
        }
