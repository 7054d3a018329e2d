"""The dev stack's well-known key: only its hash is written, and the front-end's key store
resolves it to the demo workspace."""

from __future__ import annotations

from pathlib import Path

from devstack.keys import DEV_KEY, DEV_WORKSPACE, dev_keys_file
from worker.api.keys import KeyStore


def test_dev_keys_file(tmp_path: Path) -> None:
    path = dev_keys_file(tmp_path / "dev" / "keys.json")
    assert path == tmp_path / "dev" / "keys.json"
    assert DEV_KEY not in path.read_text()
    store = KeyStore.from_file(path)
    assert store.resolve(DEV_KEY) == DEV_WORKSPACE == "ws_demo"
    assert DEV_KEY == "dev-key-ws-demo"
