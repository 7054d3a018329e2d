"""Every webhook body the suite's receivers see, validated against the published schema of its
type: ``schemas/event-types.json``, the committed file that ``GET /v1/event-types`` serves
(tests/documents checks the two are the code's). ``observe`` is called by the receiving test
helpers (``tests.webhooks.support.Receiver``); a body that does not match is kept in
``VIOLATIONS`` and fails the test that received it (``tests/conftest.py``,
``published_webhook_schemas``), and ``OBSERVED`` counts what was checked, per type."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Final

import jsonschema

PUBLISHED: Final = Path(__file__).resolve().parents[2] / "schemas" / "event-types.json"

_VALIDATORS: Final[dict[str, Any]] = {}
#: Bodies checked, by their ``type``.
OBSERVED: Final[Counter[str]] = Counter()
#: ``(type, first error)`` of every body that did not match its published schema.
VIOLATIONS: Final[list[tuple[str, str]]] = []


def validators() -> dict[str, Any]:
    """One Draft 2020-12 validator per published event type, read once."""
    if not _VALIDATORS:
        catalogue = json.loads(PUBLISHED.read_text(encoding="utf-8"))
        for entry in catalogue["event_types"]:
            schema = entry["schema"]
            jsonschema.Draft202012Validator.check_schema(schema)
            _VALIDATORS[entry["name"]] = jsonschema.Draft202012Validator(schema)
    return _VALIDATORS


def errors_of(body: Any) -> list[str]:
    """Why ``body`` is not a published event (empty: it is one)."""
    kind = body.get("type") if isinstance(body, dict) else None
    validator = validators().get(kind) if isinstance(kind, str) else None
    if validator is None:
        return [f"no published event type {kind!r}"]
    return [error.message for error in validator.iter_errors(body)]


def observe(body: Any) -> None:
    """Check one received body; a mismatch is recorded, never raised (a receiver answers)."""
    kind = str(body.get("type")) if isinstance(body, dict) else "?"
    OBSERVED[kind] += 1
    errors = errors_of(body)
    if errors:
        VIOLATIONS.append((kind, errors[0]))
