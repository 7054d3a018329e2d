"""A record aiokafka cannot parse: a header key that is not UTF-8, as another Kafka client may
write one. aiokafka's producer only writes ``str`` header keys, so a child process writes it
with the pure-Python record builder (``AIOKAFKA_NO_EXTENSIONS``), which encodes a key through
the key's own ``encode``."""

from __future__ import annotations

import asyncio
import os
import sys

_WRITER = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

class NotUtf8(str):
    def encode(self, *args, **kwargs):
        return b"\\xff\\xfe"

async def main(bootstrap, topic, partition, key):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            topic, b"{}", key=key.encode(), partition=int(partition),
            headers=[(NotUtf8("h"), b"1")],
        )
    finally:
        await producer.stop()

asyncio.run(main(*sys.argv[1:]))
"""


async def produce_unparsable(bootstrap: str, topic: str, partition: int, key: str) -> None:
    """Append one record that aiokafka's consumer cannot parse to ``topic``/``partition``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _WRITER,
        bootstrap,
        topic,
        str(partition),
        key,
        env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
    )
    assert await proc.wait() == 0
