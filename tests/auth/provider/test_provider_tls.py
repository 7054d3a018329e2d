"""Per-provider TLS: a loopback HTTPS server that requires a client certificate (a CA, server
and client certificates generated here with ``cryptography``) accepts the adapter configured
with ``PROVIDER_<NAME>_CLIENT_CERT_FILE``/``_CLIENT_KEY_FILE``/``_CA_FILE``, and refuses it
without; certificates that cannot be loaded stop the start with the variable named."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import SecretStr

from worker.auth.provider import ProviderError, build_http_client, build_registry
from worker.auth.provider.credentials import ProviderConfigError, client_tls
from worker.settings import ProviderConnection, Settings

TOKEN = "tok-mtls-provider"
MAX_HEAD = 16 * 1024


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    encrypted_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *blobs: bytes) -> Path:
    path.write_bytes(b"".join(blobs))
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("test provider CA", ca_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue("127.0.0.1", server_key, (ca.subject, ca_key), server=True)
    client = _issue("passkey-worker", client_key, (ca.subject, ca_key))
    pem = serialization.Encoding.PEM
    return Pki(
        ca=_write(d / "ca.pem", ca.public_bytes(pem)),
        server_cert=_write(d / "server.pem", server.public_bytes(pem)),
        server_key=_write(d / "server.key", _pem_key(server_key)),
        client_cert=_write(d / "client.pem", client.public_bytes(pem)),
        client_key=_write(d / "client.key", _pem_key(client_key)),
        encrypted_key=_write(d / "client-encrypted.key", _pem_key(client_key, b"pass")),
    )


@dataclass
class Seen:
    """What the TLS server saw of each request it answered."""

    client_cns: list[str] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)


@contextlib.asynccontextmanager
async def mtls_server(pki: Pki) -> AsyncIterator[tuple[str, Seen]]:
    """HTTPS on a free loopback port that requires a client certificate of the test CA and
    answers every request with an authorized auth state (one request per connection)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if len(head) > MAX_HEAD:
                return
            peer = writer.get_extra_info("peercert") or {}
            cns = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
            seen.client_cns.extend(cns)
            headers = dict(
                line.split(": ", 1)
                for line in head.decode("latin-1").split("\r\n")[1:]
                if ": " in line
            )
            seen.authorization.append(
                next((v for k, v in headers.items() if k.lower() == "authorization"), None)
            )
            body = json.dumps({"status": "authorized", "auth_status": "authorized"}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context, limit=MAX_HEAD)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


def settings_for(url: str, connection: ProviderConnection) -> Settings:
    return Settings(
        provider_urls={"acme": url},
        providers={"acme": connection},
        provider_max_attempts=1,
    )


async def auth_state(settings: Settings) -> str:
    async with build_http_client(settings) as shared:
        registry = build_registry(settings, shared)
        try:
            return (await registry["acme"].get_auth_state("acct-1")).status
        finally:
            await registry.aclose()


async def test_the_configured_client_certificate_is_accepted(pki: Pki) -> None:
    async with mtls_server(pki) as (url, seen):
        connection = ProviderConnection(
            token=SecretStr(TOKEN),
            client_cert_file=pki.client_cert,
            client_key_file=pki.client_key,
            ca_file=pki.ca,
            timeout_s=3.0,
        )
        assert await auth_state(settings_for(url, connection)) == "authorized"
    assert seen.client_cns == ["passkey-worker"]
    assert seen.authorization == [f"Bearer {TOKEN}"]  # the credential rides the mTLS client


async def test_a_certificate_and_key_in_one_file(pki: Pki, tmp_path: Path) -> None:
    both = _write(
        tmp_path / "client-both.pem", pki.client_cert.read_bytes(), pki.client_key.read_bytes()
    )
    async with mtls_server(pki) as (url, seen):
        connection = ProviderConnection(client_cert_file=both, ca_file=pki.ca)
        assert await auth_state(settings_for(url, connection)) == "authorized"
    assert seen.client_cns == ["passkey-worker"]


@pytest.mark.parametrize("with_ca", [True, False])
async def test_without_the_certificate_or_the_ca_the_call_fails_catalogued(
    pki: Pki, with_ca: bool
) -> None:
    """No client certificate: the server refuses the handshake. No CA bundle: the worker does
    not trust the server. Either way 502 provider_unavailable, and no request was answered."""
    async with mtls_server(pki) as (url, seen):
        connection = (
            ProviderConnection(ca_file=pki.ca, timeout_s=3.0)
            if with_ca
            else (
                ProviderConnection(
                    client_cert_file=pki.client_cert, client_key_file=pki.client_key, timeout_s=3.0
                )
            )
        )
        with pytest.raises(ProviderError) as caught:
            await auth_state(settings_for(url, connection))
    assert (caught.value.error.code, caught.value.error.http_status) == (
        "provider_unavailable",
        502,
    )
    assert seen.authorization == []


async def test_per_provider_timeouts_get_a_client_of_their_own() -> None:
    settings = Settings(
        provider_urls={"fast": "https://fast.example", "plain": "https://plain.example"},
        providers={"fast": ProviderConnection(timeout_s=1.5, connect_timeout_s=0.5)},
        provider_timeout_s=5.0,
    )
    async with build_http_client(settings) as shared:
        registry = build_registry(settings, shared)
        fast = registry["fast"]._client  # type: ignore[attr-defined]
        assert registry["plain"]._client is shared  # type: ignore[attr-defined]
        assert fast is not shared
        assert (fast.timeout_s, fast.connect_timeout_s) == (1.5, 0.5)
        assert (shared.timeout_s, shared.connect_timeout_s) == (5.0, 5.0)
        await registry.aclose()
        assert fast.is_closed and not shared.is_closed


@pytest.mark.parametrize(
    ("files", "variable", "problem"),
    [
        (
            lambda p: {"client_cert_file": p.ca.parent / "missing.pem"},
            "CLIENT_CERT_FILE",
            "missing.pem",
        ),
        (lambda p: {"client_cert_file": p.client_cert}, "CLIENT_CERT_FILE", "cannot load"),
        (
            lambda p: {"client_cert_file": p.client_cert, "client_key_file": p.encrypted_key},
            "CLIENT_KEY_FILE",
            "encrypted",
        ),
        (lambda p: {"ca_file": p.client_key}, "CA_FILE", "cannot load"),
    ],
)
def test_unusable_tls_files_are_refused_naming_the_variable(
    pki: Pki, files: object, variable: str, problem: str
) -> None:
    connection = ProviderConnection(**files(pki))  # type: ignore[operator]
    with pytest.raises(ProviderConfigError) as refused:
        client_tls("acme", connection)
    assert f"PROVIDER_ACME_{variable}" in str(refused.value)
    assert problem in str(refused.value)
    assert "BEGIN" not in str(refused.value)


def test_no_tls_settings_no_context() -> None:
    assert client_tls("acme", ProviderConnection(token=SecretStr("x"))) is None
