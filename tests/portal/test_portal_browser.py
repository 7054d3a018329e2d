"""The portal page in a real browser: Debian's Chromium driven by Playwright (through
``executable_path``; as root it needs ``--no-sandbox``) against the whole dev stack on the
embedded broker (``make run``'s). Skipped, saying why, where Chromium or Playwright is missing
(.ci/run installs Chromium). ``make portal-screenshot`` reruns the first test with
``PORTAL_SCREENSHOT`` set to refresh docs/portal.png."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from devstack.keys import DEV_KEY
from tests.devstack.running_stack import RunningStack, running_stack
from worker.api.keyfile import create_key
from worker.api.keys import KeyEntry, hash_key
from worker.api.portal.tokens import PortalTokens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Tries of one request answered 429 before the test gives up on it.
RETRIES_ON_429 = 10

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.async_api import Browser, Page, Route, async_playwright
except ImportError:  # pragma: no cover - the dev lock installs it
    async_playwright = None  # type: ignore[assignment]

if CHROMIUM is None or async_playwright is None:
    pytest.skip(
        "the portal's browser tests need Chromium (apt-get install chromium; .ci/run does) and"
        " Playwright (requirements-dev.lock)",
        allow_module_level=True,
    )

SECRET = "portal-secret-of-the-browser-tests"
OTHER_KEY = "pk_portal-tests-other-workspace"
ENDPOINTS = "/v1/webhook-endpoints"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningStack]:
    keys = tmp_path_factory.mktemp("portal") / "api-keys.json"
    create_key(keys, "ws_demo", raw_key=DEV_KEY, key_id="key_dev_demo")
    create_key(keys, "ws_other", raw_key=OTHER_KEY, key_id="key_other")
    async with running_stack(
        "--demo-accounts", "2", API_KEYS_FILE=str(keys), API_PORTAL_SECRET=SECRET
    ) as running:
        await running.until_worker_ready()
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    assert async_playwright is not None and CHROMIUM is not None
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else []
        )
        yield launched
        await launched.close()


def portal_line(banner: str) -> str:
    line = next(x for x in banner.splitlines() if "webhook portal" in x)
    return line.split()[-1]


async def session_url(stack: RunningStack, key: str = DEV_KEY) -> str:
    async with httpx.AsyncClient(base_url=stack.api, timeout=10) as http:
        resp = await http.post("/v1/portal-sessions", headers={"X-Api-Key": key})
        assert resp.status_code == 201, resp.text
        url: str = resp.json()["data"]["url"]
        return urljoin(stack.api, url)  # relative unless API_PUBLIC_BASE_URL is set


async def open_portal(browser: Browser, url: str) -> tuple[Page, list[str]]:
    """The page at ``url`` once it has loaded, and every URL it requested."""
    page = await browser.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    await page.goto(url)
    await page.wait_for_selector("body[data-loaded='true']", timeout=20_000)
    return page, requested


async def api(stack: RunningStack, method: str, path: str, **kwargs: Any) -> Any:
    """The answer's body, as a client would get it: a 429 (the page open beside the test holds
    the workspace's one deliveries scan) is retried after its ``Retry-After``, a few times."""
    async with httpx.AsyncClient(base_url=stack.api, timeout=15) as http:
        for _ in range(RETRIES_ON_429):
            resp = await http.request(method, path, headers={"X-Api-Key": DEV_KEY}, **kwargs)
            if resp.status_code != 429:
                break
            await asyncio.sleep(float(resp.headers["retry-after"]))
        assert resp.status_code < 300, resp.text
        return resp.json() if resp.content else None


def warnings_of(stack: RunningStack, most: int = 40) -> str:
    """The stack's last ``most`` warning and error lines, to tell why a wait ran out."""
    lines = [x for x in stack.log().splitlines() if "warn" in x.lower() or "error" in x.lower()]
    return "\n".join(lines[-most:])


async def demo_endpoint(stack: RunningStack) -> dict[str, Any]:
    endpoints = (await api(stack, "GET", ENDPOINTS))["data"]
    demo: dict[str, Any] = next(e for e in endpoints if "demo receiver" in (e["description"] or ""))
    return demo


async def test_make_run_prints_a_portal_url_that_shows_the_endpoint_and_its_deliveries(
    stack: RunningStack, browser: Browser
) -> None:
    url = urljoin(stack.api, portal_line(stack.banner))
    assert url.startswith(f"{stack.api}/portal#token=pts1.")
    endpoint = await demo_endpoint(stack)
    # A flow: the confirm's status events are delivered to the demo receiver.
    await api(stack, "POST", "/v1/accounts/acc_demo_1/auth/passkey-confirm")
    deadline = time.monotonic() + 60
    while not (await api(stack, "GET", f"{ENDPOINTS}/{endpoint['id']}/deliveries"))["data"]:
        assert time.monotonic() < deadline, "no delivery reached the log"
        await _sleep(0.5)
    page, requested = await open_portal(browser, url)
    try:
        assert urlsplit(page.url).fragment == ""  # the token left the address bar
        row = page.locator(f"#endpoints tr[data-endpoint='{endpoint['id']}']")
        await row.wait_for()
        assert "demo receiver" in await row.inner_text()
        assert (await row.locator(".endpoint-state").inner_text()).startswith("active")
        deliveries = page.locator("#deliveries tbody tr")
        await deliveries.first.wait_for()
        text = await page.locator("#deliveries").inner_text()
        assert "acc_demo_1" in text and "account.auth_status_changed" in text
        assert await page.locator("#chart rect").count() >= 1  # this minute's bar
        shot = os.environ.get("PORTAL_SCREENSHOT")
        if shot:
            await page.set_viewport_size({"width": 1200, "height": 900})
            await page.screenshot(path=shot, full_page=True)
    finally:
        await page.close()
    origin = stack.api
    assert requested and all(u.startswith(origin + "/") for u in requested), requested


async def test_attacker_controlled_text_is_shown_as_text(
    stack: RunningStack, browser: Browser
) -> None:
    created = (
        await api(
            stack,
            "POST",
            ENDPOINTS,
            json={"url": "http://127.0.0.1:9/in?q=%3Cscript%3E", "description": HOSTILE},
        )
    )["data"]
    page, requested = await open_portal(browser, await session_url(stack))
    try:
        row = page.locator(f"#endpoints tr[data-endpoint='{created['id']}']")
        await row.wait_for()
        assert await row.locator(".endpoint-description").inner_text() == HOSTILE
        assert await page.evaluate("window.__pwned") is None
        assert await page.locator("#endpoints script, #endpoints img").count() == 0
    finally:
        await page.close()
        await api(stack, "DELETE", f"{ENDPOINTS}/{created['id']}")
    assert all(u.startswith(stack.api + "/") for u in requested), requested


async def test_a_receivers_answer_holding_markup_is_shown_as_text(
    stack: RunningStack, browser: Browser
) -> None:
    """A receiver controls its answer's body; the page shows the stored excerpt of it in a
    delivery's attempts as text, and runs none of it."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=500, text=HOSTILE, content_type="text/html")

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    created = (
        await api(
            stack,
            "POST",
            ENDPOINTS,
            json={"url": f"http://127.0.0.1:{port}/hook", "description": "answers with markup"},
        )
    )["data"]
    one = f"{ENDPOINTS}/{created['id']}"
    page: Page | None = None
    try:
        queued = (
            await api(
                stack, "POST", f"{one}/test", json={"event_type": "account.auth_status_changed"}
            )
        )["data"]
        deadline = time.monotonic() + 60
        while not (await api(stack, "GET", f"{one}/deliveries/{queued['delivery_id']}"))["data"][
            "attempts_detail"
        ]:
            assert time.monotonic() < deadline, (
                "the failing attempt never reached the log; the stack's last warnings:\n"
                + warnings_of(stack)
            )
            await _sleep(0.5)
        page, requested = await open_portal(browser, await session_url(stack))
        # The page opens on the first endpoint; choose this one once it has.
        await page.locator("#endpoints tr.selected").wait_for()
        row = page.locator(f"#endpoints tr[data-endpoint='{created['id']}']")
        await row.locator("button[data-action='deliveries']").click()
        await page.locator(f"#endpoints tr.selected[data-endpoint='{created['id']}']").wait_for()
        await page.locator("#deliveries button[data-action='attempts']").first.click()
        shown = page.locator("#attempts pre").filter(has_text="<script>")
        await shown.first.wait_for()
        assert HOSTILE in await shown.first.inner_text()
        assert await page.evaluate("window.__pwned") is None
        assert await page.locator("#detail script, #detail img").count() == 0
        assert all(u.startswith(stack.api + "/") for u in requested), requested
    finally:
        if page is not None:
            await page.close()
        await api(stack, "DELETE", one)
        await runner.cleanup()


async def test_expired_forged_and_other_workspace_sessions_are_refused(
    stack: RunningStack, browser: Browser
) -> None:
    endpoint = await demo_endpoint(stack)
    key = KeyEntry("ws_demo", "key_dev_demo", bytes.fromhex(hash_key(DEV_KEY)))
    expired = PortalTokens(SECRET, clock=lambda: time.time() - 7200).mint("ws_demo", key, 3600)
    forged = PortalTokens("not the service's secret").mint("ws_demo", key, 3600)
    for token in (expired.token, forged.token):
        page, _ = await open_portal(browser, f"{stack.api}/portal#token={token}")
        try:
            assert "not valid" in await page.locator("#notice").inner_text()
            assert await page.locator("#endpoints-section").is_hidden()
        finally:
            await page.close()
    # Another workspace's session sees none of ws_demo's endpoints, and cannot reach one.
    page, _ = await open_portal(browser, await session_url(stack, OTHER_KEY))
    try:
        assert await page.locator(f"tr[data-endpoint='{endpoint['id']}']").count() == 0
        assert "pts1." not in await page.content()  # the token is in no DOM node
    finally:
        await page.close()
    other = await session_url(stack, OTHER_KEY)
    token = other.partition("#token=")[2]
    async with httpx.AsyncClient(base_url=stack.api, timeout=10) as http:
        auth = {"Authorization": f"Bearer {token}"}
        resp = await http.get(f"{ENDPOINTS}/{endpoint['id']}", headers=auth)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
        resp = await http.post(f"{ENDPOINTS}/{endpoint['id']}/deactivate", headers=auth)
        assert resp.status_code == 404


async def test_deactivate_activate_and_rotate_from_the_page(
    stack: RunningStack, browser: Browser
) -> None:
    created = (
        await api(stack, "POST", ENDPOINTS, json={"url": "http://127.0.0.1:9/portal-actions"})
    )["data"]
    page, _ = await open_portal(browser, await session_url(stack))
    try:
        row = page.locator(f"#endpoints tr[data-endpoint='{created['id']}']")
        await row.locator("button[data-action='deactivate']").click()
        await row.locator("button[data-action='activate']").wait_for()
        assert (await row.locator(".endpoint-state").inner_text()).startswith("inactive")
        stored = (await api(stack, "GET", f"{ENDPOINTS}/{created['id']}"))["data"]
        assert stored["status"] == "inactive"
        await row.locator("button[data-action='activate']").click()
        await row.locator("button[data-action='deactivate']").wait_for()
        stored = (await api(stack, "GET", f"{ENDPOINTS}/{created['id']}"))["data"]
        assert stored["status"] == "active"
        await row.locator("button[data-action='rotate']").click()
        secret = page.locator("#new-secret")
        await secret.wait_for()
        assert (await secret.inner_text()).startswith("whsec_")
    finally:
        await page.close()
        await api(stack, "DELETE", f"{ENDPOINTS}/{created['id']}")


async def _route_exists(stack: RunningStack, method: str, path: str) -> bool:
    async with httpx.AsyncClient(base_url=stack.api, timeout=10) as http:
        resp = await http.options(path)
        return resp.status_code == 204 and method in resp.headers.get("allow", "")


async def test_test_send_arrives_and_a_delivery_is_resent_from_the_page(
    stack: RunningStack, browser: Browser
) -> None:
    endpoint = await demo_endpoint(stack)
    one = f"{ENDPOINTS}/{endpoint['id']}"
    if not await _route_exists(stack, "POST", f"{one}/test"):
        pytest.skip("POST .../webhook-endpoints/{id}/test is not served yet (issue 34)")
    page, _ = await open_portal(browser, await session_url(stack))
    try:
        await page.locator("#test-send").wait_for()
        before = len((await api(stack, "GET", f"{one}/deliveries"))["data"])
        await page.locator("#test-type").select_option("account.auth_status_changed")
        await page.locator("#test-button").click()
        # (a locator, not wait_for_function: the page's CSP refuses evaluated strings)
        await page.locator("#notice").filter(has_text="sent").wait_for()
        deadline = time.monotonic() + 60
        while len((await api(stack, "GET", f"{one}/deliveries"))["data"]) <= before:
            assert time.monotonic() < deadline, "the test send never reached the log"
            await _sleep(0.5)
        assert "test" in stack.log().lower()  # the demo receiver printed it
        if not await _route_exists(stack, "POST", f"{one}/deliveries/x/resend"):
            pytest.skip("POST .../deliveries/{id}/resend is not served yet (issue 34)")
        # a fresh session: the page drops its token from the URL, so a reload has none
        await page.close()
        page, _ = await open_portal(browser, await session_url(stack))
        await page.locator("#deliveries button[data-action='resend']").first.click()
        await page.locator("#notice").filter(has_text="queued again").wait_for()
    finally:
        await page.close()


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def test_a_late_answer_for_the_endpoint_left_behind_is_not_shown(
    stack: RunningStack, browser: Browser
) -> None:
    """The demo endpoint's deliveries answer 2 s late; the person chooses it, then at once an
    endpoint with no deliveries. The late answer must not fill the table under the second
    endpoint (before: it did, and an Attempts or Resend click on one of its rows asked the
    second endpoint for a delivery it never had: 404)."""
    demo = await demo_endpoint(stack)
    deadline = time.monotonic() + 60
    while not (await api(stack, "GET", f"{ENDPOINTS}/{demo['id']}/deliveries"))["data"]:
        assert time.monotonic() < deadline, "the demo endpoint never had a delivery"
        await _sleep(0.5)
    empty = (
        await api(
            stack,
            "POST",
            ENDPOINTS,
            json={"url": "http://127.0.0.1:9/never", "description": "never delivered to"},
        )
    )["data"]
    page, _ = await open_portal(browser, await session_url(stack))
    try:
        await page.locator("#endpoints tr.selected").wait_for()

        async def late(route: Route) -> None:
            await asyncio.sleep(2.0)
            await route.continue_()

        await page.route(f"**/v1/webhook-endpoints/{demo['id']}/deliveries", late)
        endpoints = page.locator("#endpoints")
        await endpoints.locator(
            f"tr[data-endpoint='{demo['id']}'] button[data-action='deliveries']"
        ).click()
        await endpoints.locator(
            f"tr[data-endpoint='{empty['id']}'] button[data-action='deliveries']"
        ).click()
        await endpoints.locator(f"tr.selected[data-endpoint='{empty['id']}']").wait_for()
        await _sleep(3.5)  # past the late answer
        assert await page.locator("#deliveries tbody tr").count() == 0
    finally:
        await page.close()


async def test_a_disabled_endpoint_shows_its_next_probe_and_the_last_probes_answer(
    stack: RunningStack, browser: Browser
) -> None:
    """The endpoint list as the API answers it for an endpoint the dispatcher disabled and
    probes (issue 49): the row says when the next probe goes and what the last one got."""
    created = (
        await api(stack, "POST", ENDPOINTS, json={"url": "http://127.0.0.1:9/portal-probes"})
    )["data"]
    recovery = {
        "disabled_at": 1795000000.0,
        "interval_s": 600.0,
        "next_probe_at": 1795000900.0,  # 2026-11-18T11:21:40Z
        "probes": 1,
        "last_probe": {"at": "2026-11-18T11:11:40.000Z", "status": 503, "error": "http_503"},
        "recovered_at": None,
    }

    async def disabled(route: Route) -> None:
        answer = await route.fetch()
        body = await answer.json()
        for e in body["data"]:
            if e["id"] == created["id"]:
                e.update(status="disabled", disabled_reason="failing for 5 days", recovery=recovery)
        await route.fulfill(response=answer, json=body)

    page = await browser.new_page()
    try:
        await page.route(f"**{ENDPOINTS}", disabled)
        await page.goto(await session_url(stack))
        await page.wait_for_selector("body[data-loaded='true']", timeout=20_000)
        probe = page.locator(f"#endpoints tr[data-endpoint='{created['id']}'] .endpoint-probe")
        await probe.wait_for()
        text = await probe.inner_text()
        assert "next probe 2026-11-18T11:21:40Z" in text
        assert "last probe 2026-11-18T11:11:40.000Z: 503" in text
    finally:
        await page.close()
        await api(stack, "DELETE", f"{ENDPOINTS}/{created['id']}")
