"""The endpoint registry: workspaces never see each other's endpoints, the highest revision
wins whatever order the writer and the tail deliver records in, and deletions stick."""

from __future__ import annotations

from worker.contract.webhook_endpoints import (
    MAX_SIGNING_SECRETS,
    EndpointRecord,
    StoredSecret,
    new_endpoint_id,
)
from worker.webhooks.endpoints import EndpointRegistry


def record(
    endpoint_id: str, revision: int, *, workspace: str = "ws_a", **fields: object
) -> EndpointRecord:
    values: dict[str, object] = {
        "id": endpoint_id,
        "workspace_id": workspace,
        "url": "https://hooks.example.com/in",
        "created_at": "2026-11-23T00:00:00.000Z",
        "updated_at": "2026-11-23T00:00:00.000Z",
        "revision": revision,
    }
    values.update(fields)
    return EndpointRecord.model_validate(values)


def test_ids_follow_the_account_id_rule() -> None:
    import re

    from worker.contract.messages import ID_PATTERN

    assert re.fullmatch(ID_PATTERN, new_endpoint_id())
    assert new_endpoint_id() != new_endpoint_id()


def test_a_workspace_sees_only_its_endpoints() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_a", 1))
    registry.apply(record("ep_b", 1, workspace="ws_b"))
    assert registry.get("ws_a", "ep_a") is not None
    assert registry.get("ws_b", "ep_a") is None
    assert [r.id for r in registry.of_workspace("ws_a")] == ["ep_a"]
    assert [r.id for r in registry.subscribers("ws_b", "account.auth_error")] == ["ep_b"]


def test_older_revisions_never_win() -> None:
    registry = EndpointRegistry()
    assert registry.apply(record("ep_a", 2, description="new"))
    assert not registry.apply(record("ep_a", 1, description="old"))
    assert not registry.apply(record("ep_a", 2, description="same revision"))
    held = registry.get("ws_a", "ep_a")
    assert held is not None and held.description == "new"


def test_a_local_deletion_is_not_undone_by_an_older_record_replayed_later() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_a", 3))
    registry.delete("ep_a", revision=4)
    assert not registry.apply(record("ep_a", 3))
    assert registry.get("ws_a", "ep_a") is None
    assert registry.of_workspace("ws_a") == []
    registry.delete("ep_a")  # the tombstone, read from the topic


def test_subscribers_are_active_and_subscribed() -> None:
    registry = EndpointRegistry()
    registry.apply(record("ep_all", 1))
    registry.apply(record("ep_err", 1, event_types=["account.auth_error"]))
    registry.apply(record("ep_off", 1, status="inactive"))
    registry.apply(record("ep_gone", 1, status="disabled", disabled_reason="410"))
    assert {r.id for r in registry.subscribers("ws_a", "account.auth_status_changed")} == {"ep_all"}
    assert {r.id for r in registry.subscribers("ws_a", "account.auth_error")} == {
        "ep_all",
        "ep_err",
    }
    public = registry.of_workspace("ws_a")[0].public()
    assert "secrets" not in public and "revision" not in public


def secret(name: str, expires_at: float | None = None) -> StoredSecret:
    return StoredSecret(
        ciphertext=name, created_at="2026-11-23T00:00:00.000Z", expires_at=expires_at
    )


def test_at_most_the_current_and_the_previous_secret_sign() -> None:
    now = 1_000.0
    # the unbounded form an earlier version wrote: newest first, all inside their overlap
    many = record(
        "ep_a", 41, secrets=[secret("s0"), *(secret(f"s{i}", now + i) for i in range(1, 41))]
    )
    assert [s.ciphertext for s in many.live_secrets(now)] == ["s0", "s1"]
    trimmed = many.trimmed(now)
    assert [s.ciphertext for s in trimmed.secrets] == ["s0", "s1"]
    assert trimmed.revision == many.revision  # trimming is part of the next write, not one
    # a previous secret past its expiry neither signs nor is kept
    expired = record("ep_a", 2, secrets=[secret("s0"), secret("s1", now - 1)])
    assert [s.ciphertext for s in expired.live_secrets(now)] == ["s0"]
    assert [s.ciphertext for s in expired.trimmed(now).secrets] == ["s0"]
    bounded = record("ep_a", 2, secrets=[secret("s0"), secret("s1", now + 1)])
    assert bounded.trimmed(now) is bounded
    assert MAX_SIGNING_SECRETS == 2


def test_count_is_per_workspace_and_forgets_deleted_endpoints() -> None:
    registry = EndpointRegistry()
    for i in range(3):
        registry.apply(record(f"ep_{i}", 1))
    registry.apply(record("ep_b", 1, workspace="ws_b"))
    assert (registry.count("ws_a"), registry.count("ws_b"), registry.count("ws_c")) == (3, 1, 0)
    registry.delete("ep_0", revision=2)
    registry.delete("ep_1")
    assert registry.count("ws_a") == 1
