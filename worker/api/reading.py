"""What every route reads of a request (its id, a bounded body, its JSON, the account-id rule's
wording), below the routes and the subpackages so that none of them imports a composition root."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.requests import Request

from worker.contract.catalogue import ServiceError
from worker.contract.messages import valid_id

MAX_BODY_BYTES: Final = 64 * 1024
ACCOUNT_ID_RULE: Final = (
    "account_id must be 1-128 characters: a letter or digit, then letters, digits,"
    " '.', '_', ':', '@' or '-'"
)


def invalid_path(rule: str) -> ServiceError:
    """The 400 of a malformed path parameter, naming the ``rule`` it breaks."""
    return ServiceError.of("invalid_request", f"Invalid path parameter: {rule}.")


def invalid_query(rule: str) -> ServiceError:
    """The 400 of a malformed query parameter, naming the ``rule`` it breaks."""
    return ServiceError.of("invalid_request", f"Invalid query parameter: {rule}.")


def path_id(request: Request, name: str) -> str:
    """The path parameter ``name`` in the identifier format (400 naming the rule otherwise)."""
    value: str = request.path_params[name]
    if not valid_id(value):
        raise invalid_path(ACCOUNT_ID_RULE.replace("account_id", name, 1))
    return value


def request_id_of(request: Request) -> str:
    """The id ``FrontDoor`` chose for this request."""
    rid: str = request.scope["state"]["request_id"]
    return rid


async def read_body(request: Request) -> bytes:
    """The raw body; 400 when larger than ``MAX_BODY_BYTES``."""
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ServiceError.of(
                "invalid_request", f"The request body exceeds {MAX_BODY_BYTES} bytes."
            )
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> Any:
    """``raw`` as JSON; 400 when it is not."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise ServiceError.of(
            "invalid_request", "The request body cannot be decoded as JSON."
        ) from None


async def check_body(request: Request) -> bytes:
    """The raw body (for an ``Idempotency-Key``'s comparison): none at all, or any JSON object
    (ignored); whitespace alone is not JSON."""
    raw = await read_body(request)
    if raw and not isinstance(decode_json(raw), dict):
        raise ServiceError.of("invalid_request", "The request body must be a JSON object or empty.")
    return raw
