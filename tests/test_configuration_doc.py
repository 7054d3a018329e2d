"""docs/configuration.md names every variable the settings object reads, so an operator never
has to read ``worker/settings.py`` to find one."""

from __future__ import annotations

import re
from pathlib import Path

from worker.settings import Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
#: Fields read as a family of variables, and the name their row documents them by.
FAMILIES = {"TOPICS": "`TOPIC_COMMANDS` … `TOPIC_DLQ`", "PROVIDERS": "`PROVIDER_<NAME>_"}


def documented(env: str, doc: str) -> bool:
    """``env`` has a row: by its own name, or abbreviated after the row's first name
    (``KAFKA_SASL_MECHANISM`` / ``_USERNAME`` documents ``KAFKA_SASL_USERNAME``)."""
    if f"`{env}`" in doc:
        return True
    for row in (line for line in doc.splitlines() if line.startswith("| `")):
        head = re.match(r"\| `([A-Z0-9_]+)`", row)
        if head is None:
            continue
        parts = head.group(1).split("_")
        for suffix in re.findall(r"`(_[A-Z0-9_]+)`", row):
            if any("_".join(parts[:-k]) + suffix == env for k in range(1, len(parts))):
                return True
    return False


def test_every_setting_has_a_row() -> None:
    doc = DOC.read_text()
    missing = []
    for name in Settings.model_fields:
        env = name.upper()
        if env in FAMILIES:
            assert FAMILIES[env] in doc, env
        elif not documented(env, doc):
            missing.append(env)
    assert missing == []


def test_the_check_sees_a_missing_row() -> None:
    assert not documented("KAFKA_SASL_NONSENSE", "| `KAFKA_SASL_MECHANISM` / `_USERNAME` | x |")
    assert documented("KAFKA_SASL_USERNAME", "| `KAFKA_SASL_MECHANISM` / `_USERNAME` | x |")
