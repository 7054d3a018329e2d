"""The dev stack's well-known API key: workspace ``ws_demo``, key ``dev-key-ws-demo``.

It lives here, outside the product package, so no production process can accept it unless an
operator writes its hash into their own keys file. Never use it outside a laptop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from worker.api.keyfile import create_key

__all__ = ["DEV_KEY", "DEV_WORKSPACE", "dev_keys_file"]

DEV_WORKSPACE: Final = "ws_demo"
DEV_KEY: Final = "dev-key-ws-demo"


def dev_keys_file(path: Path) -> Path:
    """Write a fresh keys file holding only the hash of the dev key."""
    path.unlink(missing_ok=True)
    create_key(path, DEV_WORKSPACE, raw_key=DEV_KEY, key_id="key_dev_demo")
    return path
