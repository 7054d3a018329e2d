"""What the public port tells a caller without an API key about the deployment behind it:
readiness without its reasons, and an API document that reads the same whichever way the
deployment's settings are set (the operator's side door keeps the details)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import running_api

pytestmark = pytest.mark.integration


async def test_readyz_on_the_public_port_says_ready_and_nothing_of_the_broker(
    api_settings: ApiSettings,
) -> None:
    """Public ``/readyz`` is ``{"ready": true}`` alone; the side door's names its checks."""
    async with running_api(api_settings()) as api, httpx.AsyncClient() as http:
        public = await http.get(f"{api.url}/readyz")
        assert public.status_code == 200
        assert public.json() == {"ready": True}
        side = await http.get(f"{api.metrics_url}/readyz")
        assert side.status_code == 200
        assert side.json()["kafka"] is True and side.json()["ready"] is True


async def test_the_api_document_does_not_tell_whether_private_targets_are_allowed(
    api_settings: ApiSettings,
) -> None:
    """``/openapi.json`` served with ``WEBHOOK_ALLOW_PRIVATE_TARGETS`` on and off: the same
    document, byte for byte."""
    documents = []
    for allowed in (True, False):
        settings = api_settings(webhook_allow_private_targets=allowed)
        async with running_api(settings) as api, httpx.AsyncClient() as http:
            answer = await http.get(f"{api.url}/openapi.json")
            assert answer.status_code == 200
            documents.append(answer.content)
    assert documents[0] == documents[1]
