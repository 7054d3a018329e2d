"""``bench.stack.Connection``, the load generators' HTTP/1.1 client: it reads an answer whole
and says whether the server is closing the connection after it (``Connection: close``, as the
front-end's refusals below the app do), so a caller opens a new one instead of sending on a
closed connection and counting its own mistake as the server's."""

from __future__ import annotations

import asyncio

import pytest

from bench.stack import Connection


async def serve_once(answer: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("headers", "closing"),
    [
        (b"connection: close\r\n", True),
        (b"Connection: Close\r\n", True),
        (b"connection: keep-alive\r\n", False),
        (b"", False),
    ],
)
async def test_an_answer_says_whether_the_server_closes_the_connection(
    headers: bytes, closing: bool
) -> None:
    body = b"Service Unavailable\n"
    answer = b"HTTP/1.1 503 Service Unavailable\r\n" + headers
    answer += b"content-length: %d\r\n\r\n" % len(body) + body
    server, port = await serve_once(answer)
    async with server:
        conn = await Connection.open(port)
        try:
            assert await conn.post("/v1/x", "key") == (503, body)
            assert conn.closing is closing
        finally:
            conn.close()
