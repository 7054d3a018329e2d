"""The workspace account quota (issue "Tenant budgets", row 7): a ``register_account`` for a
new account past the workspace's share of ``WORKER_ACCOUNTS_PER_WORKSPACE`` on its partition
answers 409 ``workspace_account_quota_exceeded`` (20014) and stores nothing; re-registering a
live account never does. Before, nothing counted accounts and the catalogued code was never
raised. The quota is enforced per partition (the worker's state is partitioned by account)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from tests.harness import bus, register_cmd, running_worker
from worker.auth.flow import Headcount, Policy, decide, partition_quota
from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, DeregisterAccount, RegisterAccount

NOW = 1_800_000_000.0
QUOTA = Policy(providers=frozenset({"simulator"}), accounts_per_workspace=2)


def _register(account_id: str, workspace_id: str = "ws_a") -> RegisterAccount:
    return RegisterAccount(
        command_id=f"reg-{uuid.uuid4().hex[:8]}",
        workspace_id=workspace_id,
        account_id=account_id,
        provider="simulator",
        provider_account_ref=f"ref-{account_id}",
        status="passkey_confirmation",
    )


def _record(account_id: str, workspace_id: str = "ws_a", **kw: Any) -> AccountRecord:
    base = AccountRecord(
        account_id=account_id,
        workspace_id=workspace_id,
        status="passkey_confirmation",
        auth_status="passkey_confirmation",
        version=1,
        updated_at=NOW - 10,
    )
    return replace(base, **kw)


# --- the decision (pure) ----------------------------------------------------------------------


def test_a_new_account_past_the_workspaces_share_is_refused_with_409_and_nothing_stored() -> None:
    full = Headcount(live=2, partitions=1)
    decision = decide(None, _register("acc_3"), now=NOW, policy=QUOTA, headcount=full)
    assert decision.verdict == "error"
    assert decision.record is None, "nothing written"
    assert decision.error is not None
    assert decision.error.code == "workspace_account_quota_exceeded"
    assert (decision.error.http_status, decision.error.numeric_code) == (409, 20014)
    assert decision.error_event is not None
    assert decision.error_event.http_status == 409
    assert decision.error_event.workspace_id == "ws_a"
    assert decision.status_event is None


def test_under_the_share_a_new_account_is_registered() -> None:
    decision = decide(
        None, _register("acc_2"), now=NOW, policy=QUOTA, headcount=Headcount(1, partitions=1)
    )
    assert decision.verdict == "ok"
    assert decision.record is not None and decision.record.account_id == "acc_2"


def test_re_registering_a_live_account_is_never_refused() -> None:
    full = Headcount(live=2, partitions=1)
    decision = decide(_record("acc_1"), _register("acc_1"), now=NOW, policy=QUOTA, headcount=full)
    assert decision.verdict == "ok"


def test_a_deregistered_account_registered_again_counts_as_new() -> None:
    gone = _record("acc_1", deregistered=True)
    full = Headcount(live=2, partitions=1)
    decision = decide(gone, _register("acc_1"), now=NOW, policy=QUOTA, headcount=full)
    assert decision.error is not None
    assert decision.error.code == "workspace_account_quota_exceeded"


def test_without_a_quota_or_a_count_nothing_is_refused() -> None:
    full = Headcount(live=10**9, partitions=1)
    no_quota = Policy(providers=frozenset({"simulator"}))
    assert decide(None, _register("a"), now=NOW, policy=no_quota, headcount=full).verdict == "ok"
    assert decide(None, _register("a"), now=NOW, policy=QUOTA).verdict == "ok"


def test_the_share_per_partition_has_headroom_for_uneven_keys_and_never_passes_the_quota() -> None:
    assert partition_quota(1_000_000, 1) == 1_000_000
    assert partition_quota(2, 1) == 2
    assert partition_quota(1_000_000, 12) == 84_493  # 83,334 mean + 4 standard deviations
    assert partition_quota(10, 12) == 9
    assert partition_quota(1, 12) == 1
    for quota in (1, 7, 100, 5000, 1_000_000):
        for partitions in (1, 2, 3, 12, 64):
            share = partition_quota(quota, partitions)
            assert -(-quota // partitions) <= share <= quota


# --- the count (the worker's store) -----------------------------------------------------------


def test_the_store_counts_live_accounts_per_workspace_and_partition_boundedly() -> None:
    store = StateStore()
    store.put(0, _record("a1"))
    store.put(0, _record("a2"))
    store.put(0, _record("b1", "ws_b"))
    store.put(1, _record("a3"))
    assert store.workspace_accounts(0, "ws_a") == 2
    assert store.workspace_accounts(1, "ws_a") == 1
    store.put(0, _record("a1", version=2))  # a new version of a live account: still one
    assert store.workspace_accounts(0, "ws_a") == 2
    store.put(0, _record("a2", deregistered=True))
    assert store.workspace_accounts(0, "ws_a") == 1
    store.put(0, _record("a2", "ws_b"))  # registered again, by another workspace
    assert store.workspace_accounts(0, "ws_b") == 2
    store.put(0, _record("a1", deregistered=True))
    assert store.live_accounts == {0: {"ws_b": 2}, 1: {"ws_a": 1}}, "no entry at zero"
    # a restore replaces the partition; a revocation forgets it
    store.load(0, {"x": _record("x", "ws_c"), "y": _record("y", "ws_c", deregistered=True)})
    assert store.live_accounts == {0: {"ws_c": 1}, 1: {"ws_a": 1}}
    store.drop(1)
    assert store.live_accounts == {0: {"ws_c": 1}}
    # a new account being published counts from its decision on, until it is stored
    with store.joining(0, "ws_c"):
        assert store.workspace_accounts(0, "ws_c") == 2
        with store.joining(0, "ws_c"):  # two side by side (one lane per account)
            assert store.workspace_accounts(0, "ws_c") == 3
        assert store.workspace_accounts(0, "ws_c") == 2
    assert store.workspace_accounts(0, "ws_c") == 1
    assert store.joining_accounts == {}


# --- through the worker, on a real broker -----------------------------------------------------


@pytest.mark.integration
async def test_the_worker_refuses_a_new_account_past_the_workspace_quota(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(
        provider_urls={"simulator": simulator}, partitions=1, worker_accounts_per_workspace=2
    )
    async with bus(settings) as b, running_worker(settings):
        for acc in ("acc_1", "acc_2"):
            await b.send(register_cmd(acc, f"sim-ok-{acc}"))
        over = register_cmd("acc_3", "sim-ok-acc_3")
        await b.send(over)
        await b.wait_for(lambda: bool(b.errors(command_id=over.command_id)))
        [event] = b.errors(command_id=over.command_id)
        assert (event["http_status"], event["error"]["code"]) == (
            409,
            "workspace_account_quota_exceeded",
        )
        other = register_cmd("acc_b", "sim-ok-acc_b", workspace_id="ws_b")
        again = register_cmd("acc_1", "sim-ok-acc_1")
        await b.send(other)
        await b.send(again)
        state = settings.topics.state

        def stored(key: bytes) -> int:
            return [k for k, _, _ in b.raw.get(state, [])].count(key)

        await b.wait_for(lambda: stored(b"acc_1") == 2)
        await b.wait_for(lambda: bool(b.status_events(command_id=other.command_id)))
        assert b.errors(command_id=again.command_id) == []
        # a deregistration frees a place
        await b.send(
            DeregisterAccount(command_id="dereg-acc_2", workspace_id="ws_a", account_id="acc_2")
        )
        await b.wait_for(lambda: stored(b"acc_2") == 2)  # lanes run side by side: stored first
        retry = register_cmd("acc_3", "sim-ok-acc_3")
        await b.send(retry)
        await b.wait_for(lambda: bool(b.status_events(command_id=retry.command_id)))
        assert b.errors(command_id=retry.command_id) == []
