"""The demo webhook receiver of ``make run``: verifies every delivery with the Standard
Webhooks reference library (``standardwebhooks``) and prints one readable line per delivery.

It shows a newcomer what an integrator's endpoint sees: the ``webhook-id`` (the same on every
retry), the event type, the account and its status change, and whether the signature holds.
The secret comes from ``RECEIVER_SECRET`` (the stack creates the demo endpoint and passes it).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from devstack.settings import DevSettings


def describe(body: dict[str, Any]) -> str:
    """One line for one event: who changed from what to what, or which error."""
    data = body.get("data", {})
    account = data.get("account_id", "?")
    if body.get("type") == "account.auth_error":
        error = data.get("error", {})
        return f"{account} error {error.get('code')} ({data.get('http_status')})"
    return f"{account} v{data.get('version')} {data.get('previous_status')} -> {data.get('status')}"


def build_receiver_app(secret: str | None) -> web.Application:
    verifier = Webhook(secret) if secret else None

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()
        webhook_id = request.headers.get("webhook-id", "?")
        try:
            body = json.loads(raw)
        except ValueError:
            print(f"webhook {webhook_id} rejected: the body is not JSON", flush=True)
            return web.Response(status=400)
        if verifier is None:
            verdict = "unverified (no RECEIVER_SECRET)"
        else:
            try:
                verifier.verify(raw, dict(request.headers))
                verdict = "signature ok"
            except WebhookVerificationError as exc:
                print(f"webhook {webhook_id} rejected: {exc}", flush=True)
                return web.Response(status=401)
        print(f"webhook {webhook_id} {body.get('type')}: {describe(body)}  [{verdict}]", flush=True)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/webhooks", receive)
    return app


async def serve_receiver(settings: DevSettings) -> None:
    """Run until cancelled (``python -m devstack receiver``)."""
    runner = web.AppRunner(build_receiver_app(os.environ.get("RECEIVER_SECRET")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.receiver_host, settings.receiver_port)
    await site.start()
    print(
        f"webhook receiver on http://{settings.receiver_host}:{settings.receiver_port}/webhooks",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
