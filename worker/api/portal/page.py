"""The portal page (``GET /portal``) and its static files, read once from the package and served
under a strict Content-Security-Policy (docs/api.md, "The portal")."""

from __future__ import annotations

from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["CSP", "PAGE_FILES", "page_routes"]

CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self';"
    " connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none';"
    " frame-ancestors 'none'"
)
#: Every path the page is made of, with its file in the package and its media type.
PAGE_FILES: Final = {
    "/portal": ("index.html", "text/html; charset=utf-8"),
    "/portal/portal.js": ("portal.js", "text/javascript; charset=utf-8"),
    "/portal/portal.css": ("portal.css", "text/css; charset=utf-8"),
}
_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _read(name: str) -> bytes:
    return resources.files("worker.api.portal").joinpath("static", name).read_bytes()


def page_routes() -> list[Route]:
    """One GET route per file of the page, each answering the file read at start-up."""
    routes = []
    for path, (name, media_type) in PAGE_FILES.items():
        content = _read(name)

        async def serve(
            _: Request, content: bytes = content, media_type: str = media_type
        ) -> Response:
            return Response(content, media_type=media_type, headers=_HEADERS)

        routes.append(Route(path, serve, methods=["GET"]))
    return routes
