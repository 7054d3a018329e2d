"""What a replay asks of the dispatcher when the registry lacks its endpoint: a catch-up read
of the registry's tail only when the registry has never read that endpoint id; one it holds for
another workspace, or saw deleted, is final at once (and the registry's memory of deleted ids is
bounded)."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from tests.webhooks.support import status_event
from tests.webhooks.test_endpoints import record
from worker.contract.delivery_log import Replay
from worker.contract.webhook_endpoints import PENDING, EndpointRecord
from worker.dispatcher.instrumentation import Incoming
from worker.dispatcher.intake import Intake
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.replay_scan import recovery_replay_id

STATUS = "auth.status"
REPLAYS = "webhook.replays"


def replay_message(
    endpoint_id: str, *, workspace: str = "ws_a", replay_id: str = "rpl_1"
) -> ConsumerRecord[bytes, bytes]:
    event = status_event("acc_1", 1, workspace=workspace)
    value = Replay(
        replay_id=replay_id,
        endpoint_id=endpoint_id,
        workspace_id=workspace,
        source="status",
        event=event.model_dump_json(),
    ).model_dump_json()
    return ConsumerRecord(REPLAYS, 0, 7, 0, 0, b"acc_1", value.encode(), None, 5, len(value), [])


class CatchUp:
    """The registry's tail read to the end: counts its calls, and applies what the topic held
    that the registry had not read yet."""

    def __init__(self, registry: EndpointRegistry, *behind: object) -> None:
        self.registry = registry
        self.behind = list(behind)
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        for held in self.behind:
            self.registry.apply(held)  # type: ignore[arg-type]
        self.behind.clear()
        return True


def intake(registry: EndpointRegistry, catch_up: CatchUp) -> Intake:
    return Intake(registry, STATUS, REPLAYS, catch_up)


async def test_a_replay_for_an_endpoint_not_read_yet_waits_for_the_registry_and_is_sent() -> None:
    registry = EndpointRegistry()
    catch_up = CatchUp(registry, record("ep_new", 1))
    read = await intake(registry, catch_up).read_current(replay_message("ep_new"))
    assert catch_up.calls == 1
    assert isinstance(read, Incoming) and [t.id for t in read.targets] == ["ep_new"]


async def test_a_replay_for_a_deleted_endpoint_goes_nowhere_without_a_catch_up_read() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_old", 1))
    registry.delete("ep_old")  # its tombstone, read from the topic
    catch_up = CatchUp(registry)
    reader = intake(registry, catch_up)
    for _ in range(3):
        read = await reader.read_current(replay_message("ep_old"))
        assert isinstance(read, Incoming) and read.targets == ()
    assert catch_up.calls == 0


async def test_a_replay_naming_another_workspaces_endpoint_goes_nowhere_at_once() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_theirs", 1, workspace="ws_b"))
    catch_up = CatchUp(registry)
    read = await intake(registry, catch_up).read_current(replay_message("ep_theirs"))
    assert isinstance(read, Incoming) and read.targets == ()
    assert catch_up.calls == 0


async def test_an_unknown_endpoint_still_missing_after_the_catch_up_goes_nowhere() -> None:
    registry = EndpointRegistry()
    catch_up = CatchUp(registry)
    reader = intake(registry, catch_up)
    read = await reader.read_current(replay_message("ep_never"))
    assert isinstance(read, Incoming) and read.targets == ()
    await reader.read_current(replay_message("ep_never"))
    assert catch_up.calls == 2, "an id never read is not remembered as gone"


def test_the_registry_remembers_a_bounded_number_of_deleted_ids_oldest_forgotten_first() -> None:
    registry = EndpointRegistry(gone_remembered=3)
    for n in range(10):
        registry.apply(record(f"ep_{n}", 1))
        registry.delete(f"ep_{n}")
    assert [registry.known(f"ep_{n}") for n in range(10)] == [False] * 7 + [True] * 3


def test_an_endpoint_recreated_under_a_deleted_id_is_held_again() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_a", 1))
    registry.delete("ep_a")
    assert registry.apply(record("ep_a", 2))
    assert registry.get("ws_a", "ep_a") is not None and registry.known("ep_a")
    registry.delete("ep_a")
    assert registry.get("ws_a", "ep_a") is None and registry.known("ep_a")


def test_a_tombstone_whose_key_is_no_endpoint_id_is_not_remembered() -> None:
    registry = EndpointRegistry(gone_remembered=3)
    registry.delete("ep_kept")
    for key in ("x" * 1_000_000, "", "ep\nnewline", "../ep"):
        registry.delete(key)
        assert not registry.known(key)
    assert registry.known("ep_kept"), "the junk keys pushed out nothing"


DISABLED_AT = 1_795_000_000.0


def disabled(endpoint_id: str, revision: int) -> EndpointRecord:
    return record(
        endpoint_id,
        revision,
        status="disabled",
        disabled_reason="failing",
        recovery={"disabled_at": DISABLED_AT, "interval_s": 300.0},
    )


async def test_a_recovery_replay_read_while_the_registry_still_holds_the_disable_reads_on() -> None:
    """Another member's registry can lag the write that re-enabled the endpoint; the recovery's
    replay, queued after that write, makes it read to the end rather than fail the missed
    event as "endpoint disabled"."""
    registry = EndpointRegistry()
    registry.apply(disabled("ep_back", 1))
    rid = recovery_replay_id("ep_back", DISABLED_AT)
    enabled = record("ep_back", 2, recovery={"disabled_at": DISABLED_AT, "interval_s": 300.0})
    catch_up = CatchUp(registry, enabled)
    read = await intake(registry, catch_up).read_current(replay_message("ep_back", replay_id=rid))
    assert catch_up.calls == 1
    assert isinstance(read, Incoming) and [t.status for t in read.targets] == ["active"]


async def test_a_replay_of_an_endpoint_really_disabled_costs_no_catch_up_read() -> None:
    """An owner's replay to a disabled endpoint, or a recovery's of an earlier disable (the
    endpoint failed again since), is no sign of a stale view: it goes as the registry says."""
    registry = EndpointRegistry()
    registry.apply(disabled("ep_down", 1))
    catch_up = CatchUp(registry)
    reader = intake(registry, catch_up)
    earlier = recovery_replay_id("ep_down", DISABLED_AT - 3600)
    for rid in ("rp_" + "0" * 32, earlier):
        read = await reader.read_current(replay_message("ep_down", replay_id=rid))
        assert isinstance(read, Incoming) and [t.status for t in read.targets] == ["disabled"]
    assert catch_up.calls == 0


async def test_a_send_read_while_the_registry_holds_its_endpoint_still_pending_reads_on() -> None:
    """A test send right after a create: the front-end took it in once it read the activation,
    this member's registry may still hold the pending record; reading to the end finds the
    endpoint active rather than failing the send as "endpoint inactive" (it did, 2 of 12 tries
    through the dev stack)."""
    registry = EndpointRegistry()
    registry.apply(record("ep_fresh", 1, status="inactive", disabled_reason=PENDING))
    catch_up = CatchUp(registry, record("ep_fresh", 2))
    read = await intake(registry, catch_up).read_current(replay_message("ep_fresh"))
    assert catch_up.calls == 1
    assert isinstance(read, Incoming) and [t.status for t in read.targets] == ["active"]


async def test_a_send_to_an_endpoint_its_owner_deactivated_costs_no_catch_up_read() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_off", 1, status="inactive"))
    catch_up = CatchUp(registry)
    read = await intake(registry, catch_up).read_current(replay_message("ep_off"))
    assert isinstance(read, Incoming) and [t.status for t in read.targets] == ["inactive"]
    assert catch_up.calls == 0
