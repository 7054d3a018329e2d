"""Each route's methods and ``Allow`` header (RFC 9110, 10.2.1): one copy for ``FrontDoor``'s
405s and ``OPTIONS`` answers and for the OpenAPI document, so the two cannot drift."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["METHOD_ORDER", "allow_value", "takes"]

METHOD_ORDER: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def takes(methods: Iterable[str]) -> frozenset[str]:
    """The methods a route with handlers for ``methods`` answers: those, ``HEAD`` wherever
    ``GET`` is (a GET without its body), and ``OPTIONS`` (the front door's)."""
    taken = {method.upper() for method in methods} | {"OPTIONS"}
    if "GET" in taken:
        taken.add("HEAD")
    return frozenset(taken)


def allow_value(methods: Iterable[str]) -> str:
    """``Allow`` of a route with handlers for ``methods``, in a fixed order."""
    taken = takes(methods)
    return ", ".join([m for m in METHOD_ORDER if m in taken] + sorted(taken - set(METHOD_ORDER)))
