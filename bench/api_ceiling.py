"""The HTTP-only ceiling of the confirm route: what a POST costs with no Kafka behind it.

``python -m bench.api_ceiling --port P --keys-file F`` serves ``POST
/v1/accounts/{account_id}/auth/passkey-confirm`` on the front-end's server stack (uvicorn,
uvloop, httptools, Starlette) with the same checks a real POST runs before its Kafka round
trip (request id, API key through ``KeyStore``, account id, body) and answers the same
envelope (``{request_id, data}``, ``X-Request-Id``) at once. ``bench.stack_cost`` measures it
next to the front-end, so "front-end CPU per POST ÷ ceiling CPU per POST" is what the Kafka
round trip and the front-end's own layers add. Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.api.bodies import error_response, new_request_id, valid_id
from worker.api.keys import KeyStore
from worker.api.reading import check_body
from worker.api.routes import PASSKEY_CONFIRM, check_account_id
from worker.contract.catalogue import ServiceError
from worker.runtime import eventloop


class RequestId:
    """The front-end's request-id rule and response header, as one pure ASGI layer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        caller = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                caller = value.decode("latin-1")
        rid = caller if caller and valid_id(caller) else new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        raw = rid.encode("latin-1")

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", raw)]
            await send(message)

        await self.app(scope, receive, stamped)


def ceiling_app(keys: KeyStore) -> ASGIApp:
    """The confirm route answering ``confirmed`` without any Kafka round trip."""

    async def confirm(request: Request) -> Response:
        rid: str = request.state.request_id
        raw = request.headers.get("x-api-key")
        workspace = keys.resolve(raw.strip()) if raw and raw.strip() else None
        try:
            if workspace is None:
                raise ServiceError.of("invalid_api_key")
            account_id: str = request.path_params["account_id"]
            check_account_id(account_id)
            await check_body(request)
        except ServiceError as exc:
            return error_response(rid, exc)
        return JSONResponse(
            {
                "request_id": rid,
                "data": {
                    "account_id": account_id,
                    "status": "active",
                    "auth_status": "confirmed",
                },
            }
        )

    return RequestId(Starlette(routes=[Route(PASSKEY_CONFIRM, confirm, methods=["POST"])]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--keys-file", type=Path, required=True)
    args = parser.parse_args()
    config = uvicorn.Config(
        ceiling_app(KeyStore.from_file(args.keys_file)),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop="none",
        http="httptools",
    )
    eventloop.run(uvicorn.Server(config).serve(), "uvloop")


if __name__ == "__main__":
    main()
