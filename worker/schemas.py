"""Export everything in ``schemas/`` from the code that defines it; the drift tests compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.catalogue import export as export_catalogue
from worker.messages import json_schemas


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def documents() -> dict[str, str]:
    """File name → exact file content, for every generated schema document."""
    docs = {name: _dump(schema) for name, schema in json_schemas().items()}
    docs["error-catalogue.json"] = _dump(export_catalogue())
    try:
        from worker.api.openapi import openapi_document
    except ImportError:  # the front-end is optional for the worker's own schemas
        pass
    else:
        docs["openapi.json"] = _dump(openapi_document())
    return docs


def write_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in documents().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
