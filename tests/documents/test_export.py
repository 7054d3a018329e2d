"""schemas/ is generated from the code (``make schemas``); a change of a model, the catalogue
or the API without re-exporting fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.contract.messages import DecodeFailure, decode_command
from worker.documents.export import documents

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize("name", sorted(documents()))
def test_committed_schema_matches_the_code(name: str) -> None:
    path = SCHEMAS / name
    assert path.exists(), f"{name} missing: run `make schemas`"
    assert path.read_text(encoding="utf-8") == documents()[name], (
        f"schemas/{name} drifted from the code: run `make schemas` and review the diff"
    )


def test_no_stale_schema_files() -> None:
    assert {p.name for p in SCHEMAS.glob("*.json")} == set(documents())


def test_command_schema_is_a_discriminated_union_of_the_five_commands() -> None:
    schema = json.loads((SCHEMAS / "command.schema.json").read_text())
    assert schema["discriminator"]["propertyName"] == "type"
    assert set(schema["discriminator"]["mapping"]) == {
        "register_account",
        "observe_auth_state",
        "passkey_confirm",
        "deregister_account",
        "get_auth_state",
    }
    query = schema["$defs"]["GetAuthState"]
    assert set(query["required"]) == {"command_id", "request_id", "workspace_id", "account_id"}


def test_schema_required_fields_match_the_decoder() -> None:
    """A command missing a field the schema calls required is rejected by the decoder."""
    schema = json.loads((SCHEMAS / "command.schema.json").read_text())
    confirm = schema["$defs"]["PasskeyConfirm"]
    assert set(confirm["required"]) == {
        "command_id",
        "request_id",
        "workspace_id",
        "account_id",
        "issued_at",
    }
    full = {
        "type": "passkey_confirm",
        "command_id": "c",
        "request_id": "r",
        "workspace_id": "w",
        "account_id": "a",
        "issued_at": "2026-11-21T00:00:00Z",
    }
    for field in confirm["required"]:
        partial = {k: v for k, v in full.items() if k != field}
        assert isinstance(decode_command(b"a", json.dumps(partial).encode()), DecodeFailure)
