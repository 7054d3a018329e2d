"""Export ``schemas/`` and the generated pages of ``docs/`` from the code that defines them
(``python -m worker schemas``); the drift tests compare the committed files with these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.contract.catalogue import export as export_catalogue
from worker.contract.messages import json_schemas
from worker.documents.asyncapi.document import asyncapi_document
from worker.documents.flowchart import flow_page
from worker.documents.openapi.document import openapi_document
from worker.webhooks.event_types import catalogue_document


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def documents() -> dict[str, str]:
    """File name → exact file content, for every generated schema document."""
    docs = {name: _dump(schema) for name, schema in json_schemas().items()}
    docs["error-catalogue.json"] = _dump(export_catalogue())
    docs["asyncapi.json"] = _dump(asyncapi_document())
    docs["event-types.json"] = _dump(catalogue_document())
    docs["openapi.json"] = _dump(openapi_document())
    return docs


def pages() -> dict[str, str]:
    """File name → exact content of the generated pages of ``docs/`` (the flow diagram)."""
    return {"flow.md": flow_page()}


def write_all(out: Path, docs: Path | None = None) -> list[Path]:
    """Write ``documents()`` to ``out`` and ``pages()`` to ``docs`` (default: ``out``'s
    sibling ``docs/``, which is the repository's for the default ``schemas/``)."""
    docs = docs if docs is not None else out.parent / "docs"
    written = []
    for directory, files in ((out, documents()), (docs, pages())):
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = directory / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
