"""The demo webhook receiver of ``make run``: verifies every delivery with the Standard
Webhooks reference library (``standardwebhooks``) and prints one readable line per delivery.

It shows a newcomer what an integrator's endpoint sees: the ``webhook-id`` (the same on every
retry), the event type, the account and its status change, whether the signature holds, and
(where ``jsonschema`` is installed: the dev tools) whether the body matches the published schema
of its type (``GET /v1/event-types``).
The secret comes from ``RECEIVER_SECRET`` (the stack creates the demo endpoint and passes it).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from devstack.settings import DevSettings
from worker.webhooks.event_types import EVENT_CATALOGUE


def describe(body: dict[str, Any]) -> str:
    """One line for one event: who changed from what to what, or which error."""
    data = body.get("data", {})
    account = data.get("account_id", "?")
    if body.get("type") == "account.auth_error":
        error = data.get("error", {})
        return f"{account} error {error.get('code')} ({data.get('http_status')})"
    return f"{account} v{data.get('version')} {data.get('previous_status')} -> {data.get('status')}"


def schema_check() -> Callable[[Any], str] | None:
    """A body's verdict against the published schema of its type (``schema ok`` or why not);
    ``None`` without ``jsonschema`` (``make run`` installs the runtime only)."""
    try:
        import jsonschema
    except ImportError:
        return None
    validators = {t.name: jsonschema.Draft202012Validator(t.body_schema()) for t in EVENT_CATALOGUE}

    def check(body: Any) -> str:
        kind = body.get("type") if isinstance(body, dict) else None
        validator = validators.get(kind) if isinstance(kind, str) else None
        if validator is None:
            return "OFF SCHEMA: no published event type"
        error = next(iter(validator.iter_errors(body)), None)
        return "schema ok" if error is None else f"OFF SCHEMA: {error.message}"

    return check


def build_receiver_app(secret: str | None, *, check_schemas: bool = True) -> web.Application:
    verifier = Webhook(secret) if secret else None
    checked = schema_check() if check_schemas else None

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
        schema = "" if checked is None else f" [{checked(body)}]"
        print(
            f"webhook {webhook_id} {body.get('type')}: {describe(body)}  [{verdict}]{schema}",
            flush=True,
        )
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/webhooks", receive)
    return app


async def serve_receiver(settings: DevSettings) -> None:
    """Run until cancelled (``python -m devstack receiver``)."""
    app = build_receiver_app(
        os.environ.get("RECEIVER_SECRET"), check_schemas=settings.receiver_schema_check
    )
    runner = web.AppRunner(app, access_log=None)
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
