"""Checks before a process starts: a configuration that cannot be meant (a laptop's defaults in
production, a credential that does not load) exits 2 rather than run against the wrong place."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Final
from urllib.parse import urlsplit

from worker.auth.provider.credentials import Credential, ProviderConfigError, client_tls
from worker.runtime.logs import get_logger
from worker.settings import Settings

__all__ = ["EXIT_REFUSED", "is_loopback", "problems", "refuse"]

log = get_logger(__name__)

#: Exit status of a process that refused its configuration (as for a usage error).
EXIT_REFUSED: Final = 2


def is_loopback(host: str) -> bool:
    """``localhost``, a ``.localhost`` name, a loopback or unspecified address."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _bootstrap_hosts(servers: str) -> Iterator[str]:
    for entry in servers.split(","):
        entry = entry.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        if entry.startswith("["):
            yield entry[1:].split("]", 1)[0]
        elif entry.count(":") == 1:
            yield entry.split(":", 1)[0]
        elif entry:
            yield entry


def _url_host(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def problems(settings: Settings, *, providers: bool = False) -> list[str]:
    """What stops ``settings`` from starting a process; ``providers`` for a worker, which
    calls them."""
    found: list[str] = []
    production = settings.environment == "production"
    if production:
        servers = settings.kafka_bootstrap_servers
        if not servers:
            found.append(
                "KAFKA_BOOTSTRAP_SERVERS is unset: the default 127.0.0.1:9092 is the dev "
                "stack's broker (set the cluster's address, or ENVIRONMENT=development)"
            )
        else:
            for host in _bootstrap_hosts(servers):
                if is_loopback(host):
                    found.append(
                        f"KAFKA_BOOTSTRAP_SERVERS names the loopback host {host!r} "
                        "(ENVIRONMENT=production)"
                    )
    if not providers:
        return found
    if production and not settings.provider_urls:
        found.append("PROVIDER_URLS is empty: every account would fail 30004 (no adapter)")
    for name, url in settings.provider_urls.items():
        url_host = _url_host(url)
        if url_host is None:
            found.append(f"PROVIDER_URLS[{name!r}] has no host")
        elif production and is_loopback(url_host):
            found.append(
                f"PROVIDER_URLS[{name!r}] points at the loopback host {url_host!r} (the dev "
                "simulator's address; ENVIRONMENT=production)"
            )
        connection = settings.provider_connection(name)
        try:
            Credential.for_provider(name, connection)
            client_tls(name, connection)
        except ProviderConfigError as exc:
            found.append(str(exc))
    return found


def refuse(settings: Settings, command: str, *, providers: bool = False) -> int | None:
    """``EXIT_REFUSED`` after logging every problem, or None when ``command`` may start."""
    found = problems(settings, providers=providers)
    if not found:
        return None
    log.error(
        "startup_refused",
        command=command,
        environment=settings.environment,
        problems=found,
    )
    return EXIT_REFUSED
