"""The loopback receiver of ``bench.http_clients`` and its certificates: its own process
(``python -m bench.http_receiver --certs DIR``; uvloop and httptools, so it is cheap and its
CPU is not the client's), three listeners -- plain, TLS, and mTLS (a client certificate
required) -- answering every request with the same ~100-byte JSON (``.../chunked``: in two
chunks). Certificates (a CA, the receiver's for 127.0.0.1, a client's) are made at start with
``cryptography``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import cast

import httptools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bench.common import REPO_ROOT, base_env
from worker.runtime import eventloop

__all__ = ["ANSWER", "ANSWER_BYTES", "Material", "make_material", "receiver"]

ANSWER = {"status": "delivered", "auth_status": "verified", "account": "acc_000000000001"}
ANSWER_BYTES = json.dumps(ANSWER).encode().ljust(100)  # ~100 bytes, trailing spaces are JSON


# -- certificates -----------------------------------------------------------------------


@dataclass(frozen=True)
class Material:
    """PEM files in one directory: a CA, the receiver's certificate (127.0.0.1), a client's."""

    ca: str
    server: tuple[str, str]
    client: tuple[str, str]

    def client_context(self, mtls: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        if mtls:
            context.load_cert_chain(*self.client)
        return context


def make_material(directory: Path) -> Material:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(name: str, usage: x509.ObjectIdentifier) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return str(cert_path), str(key_path)

    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return Material(
        str(ca_path),
        leaf("server", ExtendedKeyUsageOID.SERVER_AUTH),
        leaf("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    )


# -- the receiver (its own process) -----------------------------------------------------


class _Serve(asyncio.Protocol):
    """Answer every request with ``ANSWER_BYTES``; ``.../chunked`` in two chunks."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if self.url.endswith(b"/chunked"):
            half = len(ANSWER_BYTES) // 2
            first, second = ANSWER_BYTES[:half], ANSWER_BYTES[half:]
            self.transport.write(
                head + b"Transfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(first), first, len(second), second)
            )
        else:
            self.transport.write(
                head + b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER_BYTES), ANSWER_BYTES)
            )


async def serve(material: Material, max_s: float) -> None:
    """Three listeners on loopback; their ports as a JSON line; until stdin closes or ``max_s``."""
    loop = asyncio.get_running_loop()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*material.server)
    mtls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=material.ca)
    mtls.load_cert_chain(*material.server)
    mtls.verify_mode = ssl.CERT_REQUIRED
    servers = {
        mode: await loop.create_server(_Serve, "127.0.0.1", 0, ssl=context, backlog=512)
        for mode, context in (("plain", None), ("tls", tls), ("mtls", mtls))
    }
    ports = {mode: s.sockets[0].getsockname()[1] for mode, s in servers.items()}
    print(json.dumps(ports), flush=True)
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stdin_closed, max_s)
    for server in servers.values():
        server.close()


@contextlib.contextmanager
def receiver(material: Material, max_s: float) -> Iterator[dict[str, int]]:
    """The receiver process; yields its ports by mode."""
    argv = [
        sys.executable,
        "-m",
        "bench.http_receiver",
        "--certs",
        str(Path(material.ca).parent),
    ]
    argv += ["--serve-max-s", str(max_s)]
    proc = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=base_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ports: dict[str, int] = json.loads(proc.stdout.readline())
        yield ports
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def material_in(directory: Path) -> Material:
    """The material ``make_material`` wrote to ``directory``."""

    def pair(name: str) -> tuple[str, str]:
        return str(directory / f"{name}.pem"), str(directory / f"{name}.key")

    return Material(str(directory / "ca.pem"), pair("server"), pair("client"))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.http_receiver")
    p.add_argument("--certs", type=Path, required=True)
    p.add_argument("--serve-max-s", type=float, default=900.0)
    args = p.parse_args(argv)
    eventloop.run(serve(material_in(args.certs), args.serve_max_s), "uvloop")


if __name__ == "__main__":
    main(sys.argv[1:])
