"""Which webhook URLs and addresses the dispatcher may reach: the SSRF defence, for the API's
check (no DNS) and for delivery (every resolved address vetted). Refusals carry a stable
``url_*`` / ``target_*`` reason for the API and the metrics (docs/architecture.md, "Webhook
fan-out"). Delivery's lookups themselves, bounded per workspace, are
``worker.webhooks.lookup``'s."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from yarl import URL

from worker.settings import Settings
from worker.webhooks.lookup import Lookup, system_lookup

__all__ = [
    "ALWAYS_BLOCKED",
    "MAX_URL_LENGTH",
    "BlockedTarget",
    "IPAddress",
    "TargetPolicy",
    "address_category",
    "address_rejection",
    "check_address",
    "resolve_target",
    "url_rejection",
    "validate_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_URL_LENGTH: Final = 2048
# Categories that no policy flag lifts: nothing there accepts a TCP connection.
ALWAYS_BLOCKED: Final = frozenset({"unspecified", "multicast", "broadcast"})

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# Checked in order; the first match names the category. Anything else that
# ``ipaddress`` does not call global ends as "reserved".
_V4_RANGES: Final[tuple[tuple[_V4, str], ...]] = (
    (_V4("0.0.0.0/8"), "unspecified"),  # "this network"; 0.0.0.0 reaches the local host
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("100.64.0.0/10"), "shared"),  # carrier-grade NAT (RFC 6598)
    (_V4("169.254.0.0/16"), "link_local"),  # includes 169.254.169.254, the metadata service
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
    (_V4("192.0.0.0/24"), "reserved"),  # IETF protocol assignments
    (_V4("192.0.2.0/24"), "reserved"),  # documentation (TEST-NET-1..3)
    (_V4("198.51.100.0/24"), "reserved"),
    (_V4("203.0.113.0/24"), "reserved"),
    (_V4("198.18.0.0/15"), "reserved"),  # benchmarking
    (_V4("192.88.99.0/24"), "reserved"),  # deprecated 6to4 relay anycast
)
_V6_RANGES: Final[tuple[tuple[_V6, str], ...]] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fe80::/10"), "link_local"),
    (_V6("fec0::/10"), "private"),  # deprecated site-local
    (_V6("fc00::/7"), "unique_local"),
    (_V6("ff00::/8"), "multicast"),
    (_V6("64:ff9b:1::/48"), "private"),  # NAT64 for local use (RFC 8215)
    (_V6("100::/64"), "reserved"),  # discard-only
    (_V6("2001:db8::/32"), "reserved"),  # documentation
    (_V6("3fff::/20"), "reserved"),  # documentation (RFC 9637)
)
_NAT64: Final = _V6("64:ff9b::/96")
_V4_COMPATIBLE: Final = _V6("::/96")
_GLOBAL_UNICAST: Final = _V6("2000::/3")  # everything else is unallocated or special

# A DNS label: letters, digits, hyphens (underscores occur in real names); IDNs arrive as
# punycode from yarl.
_LABEL: Final = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
# What WHATWG parsers and inet_aton read as an IPv4 number: 127.1, 0x7f.1, 2130706433, 0177...
_NUMERIC_LABEL: Final = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """What delivery may reach. The defaults are the production ones."""

    allow_http: bool = False  # WEBHOOK_ALLOW_HTTP
    allow_private: bool = False  # WEBHOOK_ALLOW_PRIVATE_TARGETS

    @classmethod
    def of(cls, settings: Settings) -> TargetPolicy:
        """The policy the settings name: the front-end's check and the dispatcher's delivery."""
        return cls(settings.webhook_allow_http, settings.webhook_allow_private_targets)


class BlockedTarget(Exception):
    """A URL or address that the policy refuses; ``reason`` is a catalogue-style code.

    The message holds the reason only: URLs may carry integrators' tokens in their query.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def address_category(ip: IPAddress) -> str | None:
    """The special-purpose category of ``ip``, or None for a public (global unicast) address.

    IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) are
    judged by the embedded address too, so ``::ffff:127.0.0.1`` is loopback.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        for net, name in _V4_RANGES:
            if ip in net:
                return name
        return None if ip.is_global else "reserved"

    ip = ipaddress.IPv6Address(int(ip))  # drop any %scope: it never makes an address public
    for net6, name6 in _V6_RANGES:
        if ip in net6:
            return name6
    if (mapped := ip.ipv4_mapped) is not None:
        return address_category(mapped)
    if ip in _V4_COMPATIBLE:  # deprecated ::a.b.c.d, never routed as such
        return address_category(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)) or "reserved"
    if ip in _NAT64:  # translated to the embedded IPv4 address by a NAT64 gateway
        return address_category(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if (sixtofour := ip.sixtofour) is not None and (inner := address_category(sixtofour)):
        return inner
    if ip.teredo is not None:
        for endpoint in ip.teredo:  # (server, client), the client already de-obfuscated
            if inner := address_category(endpoint):
                return inner
    return None if ip in _GLOBAL_UNICAST and ip.is_global else "reserved"


def address_rejection(ip: IPAddress, policy: TargetPolicy) -> str | None:
    """``target_<category>`` when the policy refuses ``ip``, else None."""
    category = address_category(ip)
    if category is None or (policy.allow_private and category not in ALWAYS_BLOCKED):
        return None
    return f"target_{category}"


def check_address(ip: IPAddress, policy: TargetPolicy) -> None:
    """Raise ``BlockedTarget`` when the policy refuses ``ip``."""
    if reason := address_rejection(ip, policy):
        raise BlockedTarget(reason)


def _parse_address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _host_rejection(host: str, policy: TargetPolicy) -> str | None:
    """Checks on the host alone (no DNS): a literal address is judged here and now."""
    if "%" in host:  # an IPv6 zone id: only meaningful on the local link
        return "url_host_invalid"
    if ":" in host:
        ip = _parse_address(host)
        return "url_host_invalid" if ip is None else address_rejection(ip, policy)
    name = host.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return "url_host_invalid"
    if _NUMERIC_LABEL.match(labels[-1]):
        # A numeric last label makes the host an IPv4 number to every parser; only the
        # canonical dotted quad is accepted, so that we judge the address that is dialled.
        ip = _parse_address(name)
        if ip is None or str(ip) != name:
            return "url_host_invalid"
        return address_rejection(ip, policy)
    if labels[-1] == "localhost" and not policy.allow_private:  # RFC 6761: always loopback
        return "target_loopback"
    return None


def validate_url(url: str, policy: TargetPolicy) -> URL:
    """The parsed URL when its form is acceptable, else ``BlockedTarget``.

    Absolute ``https`` (``http`` only with ``allow_http``), a host, no user or password
    (credentials would be stored and logged as part of the URL), a port in range. A literal
    address or ``localhost`` is judged at once; other names are judged on delivery, by their
    addresses. The result is what the sender dials: it hands the HTTP client the parts parsed
    here, so no second parser can disagree about the host.
    """
    if len(url) > MAX_URL_LENGTH:
        raise BlockedTarget("url_too_long")
    try:
        parsed = URL(url)
        host = parsed.raw_host
        port = parsed.port
    except (ValueError, TypeError):
        raise BlockedTarget("url_invalid") from None
    if parsed.scheme not in ("https", "http"):
        raise BlockedTarget("url_scheme_not_allowed")
    if parsed.scheme == "http" and not policy.allow_http:
        raise BlockedTarget("url_scheme_not_allowed")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise BlockedTarget("url_credentials_not_allowed")
    if not host:
        raise BlockedTarget("url_host_missing")
    if port is None or not 0 < port < 65536:
        raise BlockedTarget("url_port_invalid")
    if reason := _host_rejection(host, policy):
        raise BlockedTarget(reason)
    return parsed


def url_rejection(url: str, policy: TargetPolicy) -> str | None:
    """The reason ``validate_url`` would refuse ``url``, or None: the API's create/update check."""
    try:
        validate_url(url, policy)
    except BlockedTarget as exc:
        return exc.reason
    return None


async def resolve_target(
    host: str, port: int, policy: TargetPolicy, lookup: Lookup = system_lookup
) -> list[IPAddress]:
    """The addresses ``host`` resolves to, after one lookup, if the policy accepts EVERY one;
    a literal address is judged as it is, with no lookup.

    All must pass, not just one: which of several addresses a client dials is not ours to
    choose (happy eyeballs, retries), and a name that mixes public and private addresses is
    an attack or a misconfiguration. An empty answer is an ``OSError`` (a DNS failure).
    """
    if (literal := _parse_address(host)) is not None:
        check_address(literal, policy)
        return [literal]
    addresses: list[IPAddress] = []
    for text in await lookup(host, port):
        ip = _parse_address(text)
        if ip is None:
            raise BlockedTarget("target_unparseable_address")
        check_address(ip, policy)
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise OSError(f"no address found for {host!r}")
    return addresses
