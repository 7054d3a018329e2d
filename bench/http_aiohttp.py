"""aiohttp as the product configured it until ``worker.runtime.http1`` replaced it: the
reference contenders of ``bench.http_clients`` (bench/README.md, "HTTP clients"), kept so
the comparison can be run again. The webhook sender's session (``sender_session``, with a
resolver that vets every address as the product's did) and attempt (``sender_post``), and
the provider client's session and request (``provider_session``, ``provider_request``), each
as it was, minus the error mapping (a failure raises)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Mapping

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from worker.auth.provider.answer import ACCEPT_ENCODING, ProviderAnswer, decoded_body
from worker.webhooks.lookup import Lookup, system_lookup
from worker.webhooks.targets import TargetPolicy, resolve_target, validate_url

__all__ = [
    "AiohttpVettingResolver",
    "provider_request",
    "provider_session",
    "sender_post",
    "sender_session",
]

USER_AGENT = "passkey-auth-worker-webhooks"


class AiohttpVettingResolver(AbstractResolver):
    """An aiohttp resolver that returns only addresses the policy accepts (one lookup)."""

    def __init__(self, policy: TargetPolicy, lookup: Lookup = system_lookup) -> None:
        self._policy = policy
        self._lookup = lookup

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results: list[ResolveResult] = []
        for ip in await resolve_target(host, port, self._policy, self._lookup):
            ip_family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            if family not in (socket.AF_UNSPEC, ip_family):
                continue
            results.append(
                ResolveResult(
                    hostname=host,
                    host=str(ip),
                    port=port,
                    family=ip_family,
                    proto=0,
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        if not results:
            raise OSError(f"no address of the requested family for {host!r}")
        return results

    async def close(self) -> None:
        """Nothing to release."""


def sender_session(
    policy: TargetPolicy,
    *,
    max_connections: int,
    max_connections_per_host: int,
    ssl_context: ssl.SSLContext | None,
) -> aiohttp.ClientSession:
    """The webhook sender's session as ``open_session`` built it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            resolver=AiohttpVettingResolver(policy),
            limit=max_connections,
            limit_per_host=max_connections_per_host,
            ssl=ssl_context if ssl_context is not None else True,
        ),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        headers={"User-Agent": USER_AGENT},
    )


async def sender_post(
    session: aiohttp.ClientSession,
    policy: TargetPolicy,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    cap: int,
) -> tuple[int, bytes]:
    """One attempt as ``Sender.post`` made it: the URL vetted, a time-out for the whole
    attempt, at most ``cap`` bytes of the body read (then the connection dropped)."""
    target = validate_url(url, policy)
    async with (
        asyncio.timeout(timeout_s),
        session.post(
            target,
            data=body,
            headers=dict(headers),
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            read_bufsize=max(cap, 1024),
        ) as answer,
    ):
        chunks: list[bytes] = []
        size = 0
        while size < cap:
            chunk = await answer.content.read(cap - size)
            if not chunk:
                return answer.status, b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        if not answer.content.at_eof() and await answer.content.read(1):
            answer.close()
        return answer.status, b"".join(chunks)


def provider_session(
    *,
    timeout_s: float,
    max_connections: int,
    user_agent: str,
    tls: ssl.SSLContext | None,
) -> aiohttp.ClientSession:
    """The provider client's session as ``AiohttpClient`` opened it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=max_connections, limit_per_host=0, ssl=True if tls is None else tls
        ),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        ),
        headers={"User-Agent": user_agent, "Accept-Encoding": ACCEPT_ENCODING},
        auto_decompress=False,
    )


async def provider_request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: dict[str, str],
    cap: int,
) -> ProviderAnswer:
    """One request as ``AiohttpClient.request`` made it (capped, decoded, a ``ProviderAnswer``)."""
    async with session.request(method, url, headers=headers, allow_redirects=False) as answer:
        kept: list[bytes] = []
        size = 0
        truncated = False
        async for chunk in answer.content.iter_any():
            kept.append(chunk)
            size += len(chunk)
            if size > cap:
                truncated = True
                break
        raw = b"".join(kept)[:cap]
        if truncated:
            answer.close()
        coding = answer.headers.get("Content-Encoding")
        body = decoded_body(raw, truncated=truncated, coding=coding, cap=cap)
        return ProviderAnswer(answer.status, body, answer.headers)
