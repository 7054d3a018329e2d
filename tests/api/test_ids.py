"""The front-end's random ids (``worker.api.ids``): ``uuid4``'s forms, never repeated, not
shared with a forked child."""

from __future__ import annotations

import os
import re
import uuid

from worker.api.ids import new_command_id, new_request_id

REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")


def test_command_ids_are_uuid4_strings_and_request_ids_uuid4_hex() -> None:
    seen: set[str] = set()
    for _ in range(5_000):  # more than one buffer of random bytes
        command_id = new_command_id()
        parsed = uuid.UUID(command_id)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == command_id
        request_id = new_request_id()
        assert REQUEST_ID.fullmatch(request_id)
        assert uuid.UUID(request_id[4:]).version == 4
        seen.update((command_id, request_id[4:].replace("-", "")))
    assert len(seen) == 10_000


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    new_command_id()  # the parent's buffer is filled
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out without running the test teardown
        try:
            os.write(write_end, new_command_id().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        child = os.read(read_end, 64).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    parent = new_command_id()
    assert uuid.UUID(child).version == 4
    assert child != parent
