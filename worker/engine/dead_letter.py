"""Handing a record to a dead-letter topic, the fault in its headers (docs/architecture.md,
"Failure handling"); what an operator reads back is ``worker.dlq``."""

from __future__ import annotations

from dataclasses import replace

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from worker.engine.faults import Fault, RecordRejected, dead_letter_headers
from worker.engine.outage import MAX_RECORD_BYTES, Sent, enqueue, record_size


async def dead_letter(
    producer: AIOKafkaProducer, topic: str, msg: ConsumerRecord[bytes, bytes], fault: Fault
) -> Sent:
    """Hand ``msg`` to the dead-letter ``topic`` with ``fault`` in its headers.

    The value is kept whole. Only a value that is itself over the record bound (a record that
    reached us over a larger broker limit) is left out, with a detail that says so: the
    ``dlq.source`` header still names it in its topic.
    """
    source = (msg.topic, msg.partition, msg.offset)
    room = MAX_RECORD_BYTES - record_size(msg.value, msg.key, None)
    headers = dead_letter_headers(msg.headers, fault, source, room=room)
    # A record with neither key nor value (or one whose bytes could not be read) is kept as an
    # empty value: the producer refuses a record with neither.
    value = b"" if msg.key is None and msg.value is None else msg.value
    try:
        return await enqueue(producer, topic, value, key=msg.key, headers=headers)
    except RecordRejected:
        size = len(msg.value or b"")
        left_out = replace(fault, detail=f"{fault.detail} (value of {size} bytes left out)")
        headers = dead_letter_headers(None, left_out, source, room=MAX_RECORD_BYTES)
        return await enqueue(
            producer, topic, None if msg.key else b"", key=msg.key, headers=headers
        )
