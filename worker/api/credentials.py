"""A request's API key and ``Authorization: Bearer`` credential, read from its raw ASGI headers
without building Starlette's ``Headers`` for every request."""

from __future__ import annotations

from starlette.requests import Request


def header(request: Request, name: bytes) -> str | None:
    """The first value of the (lower-case) header ``name``, as ``request.headers.get`` gives
    it, without building the ``Headers`` of the request."""
    for key, value in request.scope["headers"]:
        if key == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return None


def bearer_credential(request: Request) -> str | None:
    """The credential of an ``Authorization: Bearer`` header, else ``None``."""
    raw = header(request, b"authorization")
    if raw is None:
        return None
    scheme, _, credential = raw.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return None
    return credential.strip()
