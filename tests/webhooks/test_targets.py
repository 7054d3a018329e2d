"""The SSRF policy: which addresses are public, which URLs the API accepts, and that a name is
judged by every address it resolves to."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from worker.webhooks.lookup import Lookup
from worker.webhooks.targets import (
    BlockedTarget,
    TargetPolicy,
    address_category,
    address_rejection,
    check_address,
    resolve_target,
    url_rejection,
    validate_url,
)

DEFAULT = TargetPolicy()
PRIVATE_OK = TargetPolicy(allow_private=True)
HTTP_OK = TargetPolicy(allow_http=True)
LAX = TargetPolicy(allow_http=True, allow_private=True)

# (address, category) — None is a public address that delivery may reach.
ADDRESSES: list[tuple[str, str | None]] = [
    # IPv4 public
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("93.184.216.34", None),
    ("172.15.255.255", None),  # just below 172.16/12
    ("172.32.0.0", None),  # just above it
    ("100.63.255.255", None),  # just below 100.64/10
    ("100.128.0.0", None),  # just above it
    ("192.169.0.1", None),
    # IPv4 special
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "shared"),
    ("100.127.255.255", "shared"),
    ("169.254.169.254", "link_local"),
    ("169.254.0.1", "link_local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("192.0.0.8", "reserved"),
    ("192.0.2.1", "reserved"),
    ("198.51.100.7", "reserved"),
    ("203.0.113.9", "reserved"),
    ("198.18.0.1", "reserved"),
    ("192.88.99.1", "reserved"),
    # IPv6 public
    ("2001:4860:4860::8888", None),
    ("2606:4700:4700::1111", None),
    ("2a00:1450:4001:80b::200e", None),
    # IPv6 special
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("fe80::1", "link_local"),
    ("fe80::1%eth0", "link_local"),
    ("febf:ffff::1", "link_local"),
    ("fec0::1", "private"),
    ("fc00::1", "unique_local"),
    ("fd12:3456:789a::1", "unique_local"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("100::1", "reserved"),
    ("2001:db8::1", "reserved"),
    ("3fff::1", "reserved"),
    ("4000::1", "reserved"),  # outside global unicast 2000::/3
    ("64:ff9b:1::a00:1", "private"),
    # IPv4-mapped: judged by the embedded address
    ("::ffff:8.8.8.8", None),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:7f00:1", "loopback"),
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "link_local"),
    ("::ffff:100.64.0.1", "shared"),
    ("::ffff:0.0.0.0", "unspecified"),
    ("::ffff:255.255.255.255", "broadcast"),
    # IPv4-compatible (deprecated): embedded category, else reserved
    ("::127.0.0.1", "loopback"),
    ("::10.0.0.1", "private"),
    ("::8.8.8.8", "reserved"),
    # NAT64 well-known prefix: the embedded address decides
    ("64:ff9b::8.8.8.8", None),
    ("64:ff9b::127.0.0.1", "loopback"),
    ("64:ff9b::192.168.0.1", "private"),
    # 6to4: the embedded address decides when it is special
    ("2002:c0a8:0101::1", "private"),  # 192.168.1.1
    ("2002:7f00:0001::1", "loopback"),
    ("2002:a9fe:a9fe::1", "link_local"),  # 169.254.169.254
    # Teredo: client (obfuscated in the address) or server special → that category
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # client 127.0.0.1
    ("2001:0:0a00:0001:8000:63bf:3fff:fdd2", "private"),  # server 10.0.0.1
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "reserved"),  # public ends; 2001::/23 still
]


@pytest.mark.parametrize(("text", "category"), ADDRESSES)
def test_address_category(text: str, category: str | None) -> None:
    assert address_category(ipaddress.ip_address(text)) == category


@pytest.mark.parametrize(("text", "category"), ADDRESSES)
def test_default_policy_blocks_every_special_address(text: str, category: str | None) -> None:
    ip = ipaddress.ip_address(text)
    expected = None if category is None else f"target_{category}"
    assert address_rejection(ip, DEFAULT) == expected
    if expected is None:
        check_address(ip, DEFAULT)
    else:
        with pytest.raises(BlockedTarget) as caught:
            check_address(ip, DEFAULT)
        assert caught.value.reason == expected


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("10.0.0.1", True),
        ("fd00::1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("192.0.2.1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("224.0.0.1", False),
        ("ff02::1", False),
        ("255.255.255.255", False),
        ("::ffff:0.0.0.0", False),
    ],
)
def test_allow_private_lifts_all_but_the_undialable(text: str, allowed: bool) -> None:
    rejection = address_rejection(ipaddress.ip_address(text), PRIVATE_OK)
    assert (rejection is None) is allowed


# (url, policy, reason) — None means accepted.
URLS: list[tuple[str, TargetPolicy, str | None]] = [
    ("https://hooks.example.com/in", DEFAULT, None),
    ("https://hooks.example.com:8443/in?token=abc#frag", DEFAULT, None),
    ("HTTPS://Hooks.Example.COM./in", DEFAULT, None),
    ("https://bücher.example/hook", DEFAULT, None),
    ("https://8.8.8.8/hook", DEFAULT, None),
    ("https://[2001:4860:4860::8888]/hook", DEFAULT, None),
    ("https://under_score.example.com/", DEFAULT, None),
    ("http://hooks.example.com/in", DEFAULT, "url_scheme_not_allowed"),
    ("http://hooks.example.com/in", HTTP_OK, None),
    ("ftp://hooks.example.com/in", LAX, "url_scheme_not_allowed"),
    ("file:///etc/passwd", LAX, "url_scheme_not_allowed"),
    ("gopher://127.0.0.1:6379/_x", LAX, "url_scheme_not_allowed"),
    ("javascript:alert(1)", LAX, "url_scheme_not_allowed"),
    ("//hooks.example.com/in", DEFAULT, "url_scheme_not_allowed"),
    ("/relative/path", DEFAULT, "url_scheme_not_allowed"),
    ("", DEFAULT, "url_scheme_not_allowed"),
    ("https:///no-host", DEFAULT, "url_host_missing"),
    ("https://user:pw@hooks.example.com/", DEFAULT, "url_credentials_not_allowed"),
    ("https://user@hooks.example.com/", DEFAULT, "url_credentials_not_allowed"),
    ("https://:pw@hooks.example.com/", DEFAULT, "url_credentials_not_allowed"),
    ("https://hooks.example.com:0/", DEFAULT, "url_port_invalid"),
    ("https://hooks.example.com:99999/", DEFAULT, "url_invalid"),
    ("https://hooks.example.com:abc/", DEFAULT, "url_invalid"),
    ("https://[::1/", DEFAULT, "url_invalid"),
    ("https://a b.example/", DEFAULT, "url_host_invalid"),
    ("https://-bad-.example/", DEFAULT, "url_host_invalid"),
    ("https://a..b/", DEFAULT, "url_host_invalid"),
    ("https://" + "a" * 64 + ".example/", DEFAULT, "url_host_invalid"),
    ("https://[fe80::1%25eth0]/", PRIVATE_OK, "url_host_invalid"),
    ("https://hooks.example.com/" + "a" * 2100, DEFAULT, "url_too_long"),
    # literal addresses are judged at once
    ("https://127.0.0.1/", DEFAULT, "target_loopback"),
    ("https://127.0.0.1./", DEFAULT, "target_loopback"),
    ("https://10.0.0.5:8080/", DEFAULT, "target_private"),
    ("https://169.254.169.254/latest/meta-data/", DEFAULT, "target_link_local"),
    ("https://[::1]/", DEFAULT, "target_loopback"),
    ("https://[::ffff:127.0.0.1]/", DEFAULT, "target_loopback"),
    ("https://[::ffff:a9fe:a9fe]/", DEFAULT, "target_link_local"),
    ("https://[fd00::1]/", DEFAULT, "target_unique_local"),
    ("https://0.0.0.0/", DEFAULT, "target_unspecified"),
    ("https://0.0.0.0/", LAX, "target_unspecified"),
    ("http://127.0.0.1:8080/", LAX, None),
    ("http://127.0.0.1:8080/", HTTP_OK, "target_loopback"),
    ("https://127.0.0.1:8080/", PRIVATE_OK, None),
    # numeric hosts that are IPv4 to some parser, but not canonical: refused outright
    ("https://2130706433/", DEFAULT, "url_host_invalid"),
    ("https://127.1/", DEFAULT, "url_host_invalid"),
    ("https://0x7f.0.0.1/", DEFAULT, "url_host_invalid"),
    ("https://0x7f000001/", DEFAULT, "url_host_invalid"),
    ("https://0177.0.0.1/", DEFAULT, "url_host_invalid"),
    ("https://127.000.000.001/", DEFAULT, "url_host_invalid"),
    ("https://8.8.8.8.8/", DEFAULT, "url_host_invalid"),
    ("https://1.2.3.4.5/", LAX, "url_host_invalid"),
    ("https://2130706433/", LAX, "url_host_invalid"),
    ("https://example.123/", DEFAULT, "url_host_invalid"),
    ("https://123.example/", DEFAULT, None),  # a numeric label elsewhere is fine
    # names that are loopback by definition (RFC 6761)
    ("https://localhost/", DEFAULT, "target_loopback"),
    ("https://LOCALHOST./", DEFAULT, "target_loopback"),
    ("https://api.localhost:8443/", DEFAULT, "target_loopback"),
    ("http://localhost:8080/", LAX, None),
]


@pytest.mark.parametrize(("url", "policy", "reason"), URLS)
def test_url_rejection(url: str, policy: TargetPolicy, reason: str | None) -> None:
    assert url_rejection(url, policy) == reason


@pytest.mark.parametrize(("url", "policy", "reason"), [u for u in URLS if u[2] is not None])
def test_validate_url_raises_blocked_target(url: str, policy: TargetPolicy, reason: str) -> None:
    with pytest.raises(BlockedTarget) as caught:
        validate_url(url, policy)
    assert caught.value.reason == reason
    assert str(caught.value) == reason


def test_validate_url_returns_the_parsed_url() -> None:
    parsed = validate_url("https://Bücher.Example:8443/a/b?q=1", DEFAULT)
    assert parsed.scheme == "https"
    assert parsed.raw_host == "xn--bcher-kva.example"
    assert parsed.port == 8443
    assert parsed.raw_path_qs == "/a/b?q=1"


def test_rejection_message_never_repeats_the_url() -> None:
    url = "https://user:hunter2@hooks.example.com/in?token=s3cret"
    with pytest.raises(BlockedTarget) as caught:
        validate_url(url, DEFAULT)
    assert "hunter2" not in repr(caught.value)
    assert "s3cret" not in repr(caught.value)


def _answers(*rounds: Sequence[str]) -> tuple[list[str], Lookup]:
    calls: list[str] = []
    pending = list(rounds)

    async def lookup(host: str, port: int) -> Sequence[str]:
        calls.append(f"{host}:{port}")
        return pending.pop(0)

    return calls, lookup


async def test_resolve_target_returns_every_vetted_address_once() -> None:
    calls, lookup = _answers(["8.8.8.8", "2001:4860:4860::8888", "8.8.8.8"])
    addresses = await resolve_target("hooks.example.com", 443, DEFAULT, lookup)
    assert addresses == [
        ipaddress.ip_address("8.8.8.8"),
        ipaddress.ip_address("2001:4860:4860::8888"),
    ]
    assert calls == ["hooks.example.com:443"]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (["8.8.8.8", "10.0.0.1"], "target_private"),  # one bad address spoils the name
        (["127.0.0.1"], "target_loopback"),
        (["2001:4860:4860::8888", "::ffff:169.254.169.254"], "target_link_local"),
        (["fd00::1"], "target_unique_local"),
        (["not-an-address"], "target_unparseable_address"),
    ],
)
async def test_resolve_target_refuses_a_name_with_any_blocked_address(
    answer: list[str], reason: str
) -> None:
    _, lookup = _answers(answer)
    with pytest.raises(BlockedTarget) as caught:
        await resolve_target("hooks.example.com", 443, DEFAULT, lookup)
    assert caught.value.reason == reason


async def test_resolve_target_with_no_address_is_a_dns_failure() -> None:
    _, lookup = _answers([])
    with pytest.raises(OSError, match="no address"):
        await resolve_target("hooks.example.com", 443, DEFAULT, lookup)


async def test_resolve_target_private_allowed_by_policy() -> None:
    _, lookup = _answers(["127.0.0.1", "::1"])
    addresses = await resolve_target("localhost", 80, PRIVATE_OK, lookup)
    assert [str(a) for a in addresses] == ["127.0.0.1", "::1"]
