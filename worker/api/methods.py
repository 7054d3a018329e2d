"""Which methods a route takes, and the ``Allow`` header that says so (RFC 9110, 10.2.1).

A known path asked with a method it does not take answers 405 ``method_not_allowed`` (a
service extension) with ``Allow``; a plain ``OPTIONS`` answers 204 with ``Allow``; ``HEAD`` is
answered wherever ``GET`` is (``worker.api.middleware.FrontDoor``). The OpenAPI document states
each path's ``Allow`` with the same function, so the two cannot drift.
"""

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
