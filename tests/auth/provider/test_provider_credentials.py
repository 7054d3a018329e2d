"""Provider credentials, proven by the simulator that enforces them: a provider configured
with a token (``PROVIDER_<NAME>_TOKEN[_FILE]``, bearer or API-key header) sends it on every
call, a missing or wrong one gives the catalogued provider error, and the token never reaches
a log line, a repr or an error message."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from pydantic import SecretStr

from devstack.simulator import ProviderSimulator, in_process_provider, running_simulator
from tests.harness import bus, confirm_cmd, register_cmd, running_worker
from worker.auth.provider import ProviderError, build_http_client, build_registry
from worker.auth.provider.credentials import Credential, ProviderConfigError
from worker.settings import ProviderConnection, Settings

TOKEN = "tok_" + uuid.uuid4().hex  # unique: found in a log only if it leaked there
OPERATION_FAILED = ("provider_unavailable", 30010, 502)


def triple(exc: ProviderError) -> tuple[str, int, int]:
    return (exc.error.code, exc.error.numeric_code, exc.error.http_status)


def ref() -> str:
    return f"acct-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def bearer_sim() -> AsyncIterator[tuple[ProviderSimulator, str]]:
    sim = ProviderSimulator(
        latency_ms=0, jitter_ms=0, authorize_delay_s=0, token=SecretStr(TOKEN), rng=random.Random(1)
    )
    async with running_simulator(sim) as url:
        yield sim, url


def settings_for(url: str, **connection: Any) -> Settings:
    return Settings(
        provider_urls={"simulator": url},
        providers={"simulator": ProviderConnection(**connection)},
        provider_backoff_base_s=0.001,
        provider_backoff_max_s=0.002,
    )


async def confirm_then_poll(settings: Settings, account_ref: str) -> list[str]:
    """Confirm once, then poll the auth state until it settles; the statuses seen."""
    async with build_http_client(settings) as client:
        registry = build_registry(settings, client)
        adapter = registry["simulator"]
        seen = [(await adapter.confirm_passkey(account_ref, idempotency_key=ref())).status]
        for _ in range(20):
            seen.append((await adapter.get_auth_state(account_ref)).status)
            if seen[-1] == "authorized":
                break
        await registry.aclose()
    return seen


async def test_a_bearer_token_is_sent_on_every_call(
    bearer_sim: tuple[ProviderSimulator, str],
) -> None:
    sim, url = bearer_sim
    seen = await confirm_then_poll(settings_for(url, token=SecretStr(TOKEN)), ref())
    assert seen[0] == "passkey_confirmation_sent"
    assert seen[-1] == "authorized"
    stats = sim.stats()
    assert stats["unauthorized_calls"] == 0
    assert stats["total_calls"] == len(seen)  # confirm and every poll got through


async def test_an_api_key_header_from_a_file(tmp_path: Path) -> None:
    sim = ProviderSimulator(
        latency_ms=0,
        jitter_ms=0,
        authorize_delay_s=0,
        token=SecretStr(TOKEN),
        auth_header="X-Api-Key",
    )
    token_file = tmp_path / "provider.token"
    token_file.write_text(TOKEN + "\n")  # a trailing newline, as `echo` and editors leave it
    async with running_simulator(sim) as url:
        settings = settings_for(url, token_file=token_file, auth_header="X-Api-Key")
        seen = await confirm_then_poll(settings, ref())
        assert seen[-1] == "authorized"
        # the same token as a bearer in Authorization is not what this provider takes
        with pytest.raises(ProviderError) as caught:
            await confirm_then_poll(settings_for(url, token=SecretStr(TOKEN)), ref())
    assert triple(caught.value) == OPERATION_FAILED
    assert sim.stats()["unauthorized_calls"] == 1


@pytest.mark.parametrize("connection", [{}, {"token": SecretStr("tok_wrong")}])
async def test_a_missing_or_wrong_token_is_the_catalogued_provider_error(
    bearer_sim: tuple[ProviderSimulator, str], connection: dict[str, Any]
) -> None:
    sim, url = bearer_sim
    with pytest.raises(ProviderError) as caught:
        await confirm_then_poll(settings_for(url, **connection), ref())
    assert triple(caught.value) == OPERATION_FAILED
    assert not caught.value.transient  # credentials do not fix themselves: no retry storm
    stats = sim.stats()
    assert stats["unauthorized_calls"] == 1
    assert stats["confirm_effects"] == {}  # refused before any effect


async def test_the_token_never_reaches_logs_reprs_or_errors(
    bearer_sim: tuple[ProviderSimulator, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attacker's view: every log record at DEBUG (ours and aiohttp's), every repr
    and every error message of a failing call and of refused configurations."""
    sim, url = bearer_sim
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("PROVIDER_SIMULATOR_TOKEN", TOKEN)
    monkeypatch.setenv("PROVIDER_URLS", f'{{"simulator": "{url}"}}')
    texts: list[str] = []
    with structlog.testing.capture_logs() as events:
        settings = Settings(provider_max_attempts=2)
        assert settings.provider_connection("simulator").has_credential
        texts += [repr(settings), str(settings), settings.model_dump_json()]
        sim_down = settings.model_copy(
            update={"provider_urls": {"simulator": "http://127.0.0.1:9"}}
        )
        for failing in (sim_down, settings):
            async with build_http_client(failing) as client:
                registry = build_registry(failing, client)
                adapter = registry["simulator"]
                texts += [repr(registry), repr(adapter), repr(adapter._credential)]  # type: ignore[attr-defined]
                with pytest.raises(ProviderError) as caught:
                    await adapter.confirm_passkey("sim-unavailable-x", idempotency_key=ref())
                texts += [str(caught.value), repr(caught.value), repr(caught.value.__cause__)]
                await registry.aclose()
        # refused configurations name the setting, never the value
        for bad, problem in (
            ({"token": SecretStr(TOKEN), "token_file": tmp_path / "t"}, "not both"),
            ({"token": SecretStr(TOKEN), "auth_header": "bad header"}, "header name"),
            ({"token": SecretStr(TOKEN), "auth_header": "Idempotency-Key"}, "the adapter sets"),
        ):
            with pytest.raises(ValueError, match=problem) as refused:
                ProviderConnection(**bad)
            texts.append(str(refused.value))
        monkeypatch.setenv("PROVIDER_SIMULATOR_TOKEN_FILE", str(tmp_path / "t"))
        with pytest.raises(ValueError, match=r"PROVIDER_SIMULATOR_\*: .*not both") as refused:
            Settings()
        texts.append(str(refused.value))
        with pytest.raises(ProviderConfigError) as unusable:
            Credential("simulator", "Authorization", "Bearer", secret=SecretStr(TOKEN + "\r\nX: y"))
        texts.append(str(unusable.value))
    assert sim.stats()["total_calls"] >= 2
    logged = "\n".join([*texts, *map(repr, events), caplog.text])
    assert TOKEN not in logged
    assert "SecretStr('**********')" in texts[0]


def test_a_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    now = [100.0]
    path = tmp_path / "token"
    path.write_text("first\n")
    credential = Credential(
        "acme", "Authorization", "Bearer", file=path, recheck_s=5.0, clock=lambda: now[0]
    )
    assert credential.headers() == {"Authorization": "Bearer first"}
    path.write_text("second-longer\n")
    assert credential.headers() == {"Authorization": "Bearer first"}  # not checked yet
    now[0] += 5.0
    assert credential.headers() == {"Authorization": "Bearer second-longer"}
    with structlog.testing.capture_logs() as events:
        path.write_text("")  # a half-written rotation: keep the last good token
        now[0] += 5.0
        assert credential.headers() == {"Authorization": "Bearer second-longer"}
        path.unlink()
        now[0] += 5.0
        assert credential.headers() == {"Authorization": "Bearer second-longer"}
    assert [e["event"] for e in events] == ["provider_credential_reload_failed"]
    assert "second-longer" not in repr(events) + repr(credential)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        ("", "is empty"),
        ("   \n", "is empty"),
        ("tok\nX-Injected: 1", "not a valid header value"),
        ("tök", "not ASCII"),
        ("t" * 9000, "not a valid header value"),
    ],
)
def test_an_unusable_token_file_is_refused_naming_the_variable(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    connection = ProviderConnection(token_file=path)
    with pytest.raises(ProviderConfigError) as refused:
        Credential.for_provider("acme-eu", connection)
    message = str(refused.value)
    assert problem in message
    assert "PROVIDER_ACME_EU_TOKEN_FILE" in message
    if content and content.strip():
        assert content.strip()[:20] not in message


def test_connections_are_read_from_per_provider_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(
        "PROVIDER_URLS", '{"acme-eu": "https://acme.example", "beta": "https://beta.example"}'
    )
    monkeypatch.setenv("PROVIDER_ACME_EU_TOKEN_FILE", str(tmp_path / "acme.token"))
    monkeypatch.setenv("PROVIDER_ACME_EU_AUTH_HEADER", "X-Api-Key")
    monkeypatch.setenv("PROVIDER_ACME_EU_TIMEOUT_S", "2.5")
    monkeypatch.setenv("PROVIDER_BETA_TOKEN", TOKEN)
    monkeypatch.setenv("TOKEN", "not-for-anyone")  # no prefix: read by nobody
    settings = Settings()
    acme, beta = settings.provider_connection("acme-eu"), settings.provider_connection("beta")
    assert (acme.token_file, acme.auth_header, acme.scheme, acme.timeout_s) == (
        tmp_path / "acme.token",
        "X-Api-Key",
        "",
        2.5,
    )
    assert acme.needs_own_client and not beta.needs_own_client
    assert beta.token is not None and beta.token.get_secret_value() == TOKEN
    assert beta.scheme == "Bearer"
    assert ProviderConnection().token is None  # built in code, it reads no variable
    monkeypatch.setenv("PROVIDER_URLS", '{"a-b": "https://a.example", "a.b": "https://b.example"}')
    with pytest.raises(ValueError, match="share the variables PROVIDER_A_B_"):
        Settings()


async def test_the_in_process_provider_enforces_the_token_too() -> None:
    sim = ProviderSimulator(latency_ms=0, jitter_ms=0, token=SecretStr(TOKEN))
    with_token = in_process_provider(
        sim, credential=Credential("simulator", "Authorization", "Bearer", secret=SecretStr(TOKEN))
    )
    assert (await with_token.get_auth_state("r1")).status == "passkey_confirmation"
    with pytest.raises(ProviderError) as caught:
        await in_process_provider(sim).get_auth_state("r1")
    assert triple(caught.value) == OPERATION_FAILED
    assert sim.stats()["unauthorized_calls"] == 1


@pytest.mark.integration
async def test_a_worker_sends_its_token_on_confirm_and_every_poll(
    make_settings: Any, tmp_path: Path
) -> None:
    """The whole path: settings → registry → worker on the real broker → simulator that
    requires the token; the flow reaches authorized through the follow-up polls."""
    sim = ProviderSimulator(
        latency_ms=1, jitter_ms=0, authorize_delay_s=0.3, token=SecretStr(TOKEN)
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    async with running_simulator(sim) as url:
        settings = make_settings(
            provider_urls={"simulator": url},
            providers={"simulator": ProviderConnection(token_file=token_file)},
        )
        async with bus(settings) as b, running_worker(settings):
            account = f"acc-{uuid.uuid4().hex[:10]}"
            register = register_cmd(account, ref())
            await b.send(register)
            confirm = confirm_cmd(account)
            await b.send(confirm)
            assert (await b.reply_to(confirm.command_id))["http_status"] == 200
            await b.wait_for(lambda: bool(b.status_events(account_id=account, status="authorized")))
    stats = sim.stats()
    assert stats["unauthorized_calls"] == 0
    assert stats["confirm_effects"] == {confirm.command_id: 1}
    assert stats["state_calls"] >= 1  # the follow-up polls carried it too


async def test_httpx_answers_are_checked_the_same_way(
    bearer_sim: tuple[ProviderSimulator, str],
) -> None:
    """Sanity of the simulator itself: a raw request without the token is a 401."""
    _, url = bearer_sim
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"{url}/v1/accounts/x/auth-state")
        good = await client.get(
            f"{url}/v1/accounts/x/auth-state", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "unauthorized"
    assert good.status_code == 200
