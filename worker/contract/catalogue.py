"""The error catalogue: its rows (``worker.contract.error_rows``: the contract's, and the
service's own extensions in a 90000 block, kept apart; docs/api.md, "Errors" and "Service
extensions"), looked up by code and status or by numeric code; ``ServiceError`` carries one.
Messages come from here, so a replayed reply is byte-identical."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Final, Literal

import attrs

from worker.contract.error_rows import (
    ENTRIES,
    EXTENSIONS,
    PROVIDER_DETAIL_CODES,
    CatalogueEntry,
)

__all__ = [
    "ENTRIES",
    "EXTENSIONS",
    "PROVIDER_DETAIL_CODES",
    "CatalogueEntry",
    "ServiceError",
    "by_numeric",
    "entry",
    "export",
    "write_catalogue_json",
]


def _sort_key(e: CatalogueEntry) -> tuple[bool, int]:
    # Real statuses first (lowest first), the provider-detail row last.
    return (e.http_status is None, e.http_status or 0)


def _index() -> tuple[dict[str, tuple[CatalogueEntry, ...]], dict[int, tuple[CatalogueEntry, ...]]]:
    by_code: dict[str, list[CatalogueEntry]] = {}
    by_num: dict[int, list[CatalogueEntry]] = {}
    for e in (*ENTRIES, *EXTENSIONS):
        rows = by_code.setdefault(e.code, [])
        if any(r.http_status == e.http_status for r in rows):
            raise RuntimeError(f"catalogue lists {e.code!r} twice under {e.http_status}")
        rows.append(e)
        by_num.setdefault(e.numeric_code, []).append(e)
    return (
        {code: tuple(sorted(rows, key=_sort_key)) for code, rows in by_code.items()},
        {num: tuple(rows) for num, rows in by_num.items()},
    )


_BY_CODE, _BY_NUMERIC = _index()


class _Unset(Enum):
    """Sentinel type: ``entry()`` must tell "no status given" from "the None (detail) row"."""

    UNSET = "unset"


def entry(
    code: str, http_status: int | Literal[_Unset.UNSET] | None = _Unset.UNSET
) -> CatalogueEntry:
    """The row for ``code``.

    ``http_status`` picks among a code's rows (``None`` selects the provider-detail row).
    Without it, the row with the lowest real HTTP status wins, so ``entry("group_not_found")``
    is the 404 row; a code that exists only as a provider detail returns that row.
    """
    rows = _BY_CODE.get(code)
    if rows is None:
        raise KeyError(f"unknown error code {code!r}: not in the error catalogue")
    if http_status is _Unset.UNSET:
        return rows[0]
    for row in rows:
        if row.http_status == http_status:
            return row
    listed = ", ".join(
        "provider-detail" if r.http_status is None else str(r.http_status) for r in rows
    )
    raise KeyError(
        f"error code {code!r} has no row for HTTP status {http_status}; catalogued: {listed}"
    )


def by_numeric(numeric_code: int) -> tuple[CatalogueEntry, ...]:
    """All rows with ``numeric_code`` (several for 35000 and 34004; empty when unknown)."""
    return _BY_NUMERIC.get(numeric_code, ())


# Where a condition is contract commentary rather than caller-facing text, the message is
# stated here. The 422 text is the contract's own wording ('The message then reads ...').
_MESSAGE_OVERRIDES: Final[dict[tuple[str, int], str]] = {
    ("contact_not_found", 422): "Conversation not found",
    ("group_not_found", 404): "The group could not be found under this account.",
}


def _default_message(row: CatalogueEntry) -> str:
    """A human sentence for ``row``: no markdown, and 500 conditions (which name only the
    operation, e.g. "Listing accounts.") turned into a statement of what went wrong."""
    assert row.http_status is not None
    override = _MESSAGE_OVERRIDES.get((row.code, row.http_status))
    if override is not None:
        return override
    text = row.condition.replace("`", "'")
    if row.http_status == 500:
        return f"An internal error occurred while {text[0].lower()}{text[1:]}"
    return text


# auto_exc=False: attrs would otherwise compare and hash exceptions by identity; a
# ServiceError is a value (decisions and replays compare them).
@attrs.frozen(auto_exc=False)
class ServiceError(Exception):
    """A catalogued failure: the contract's error object plus its HTTP status.

    Construction validates against the catalogue, so an instance can only carry a real
    (code, status) row and either that row's numeric code or a provider-detail refinement.
    Equality and hashing are by value, which keeps decisions and replays comparable.

    It is both a value and a raisable exception, so it is an ``attrs.frozen`` class rather than
    a frozen dataclass: a frozen dataclass exception breaks as soon as the interpreter's own
    Python code touches exception state (``contextlib`` assigns ``__traceback__``, ``add_note``
    sets ``__notes__``), while attrs (>= 24.3) lets exactly those attributes through.
    """

    code: str
    numeric_code: int
    http_status: int
    message: str

    def __attrs_post_init__(self) -> None:
        row = entry(self.code, self.http_status)
        if self.numeric_code != row.numeric_code and self.numeric_code not in PROVIDER_DETAIL_CODES:
            raise ValueError(
                f"numeric_code {self.numeric_code} is neither {self.code!r}'s own"
                f" ({row.numeric_code}) nor a provider-detail code {sorted(PROVIDER_DETAIL_CODES)}"
            )

    @classmethod
    def of(
        cls, code: str, message: str | None = None, *, http_status: int | None = None
    ) -> ServiceError:
        """The catalogued error for ``code`` (at ``http_status`` when the code has several).

        Raises KeyError for unknown codes and ValueError for provider-detail-only rows, which
        have no HTTP status of their own and are applied with ``refine``.
        """
        row = entry(code) if http_status is None else entry(code, http_status)
        if row.http_status is None:
            raise ValueError(
                f"{code!r} is a provider-detail code with no HTTP status of its own; use"
                f" .refine({row.numeric_code}) on the error it refines"
            )
        return cls(
            code=row.code,
            numeric_code=row.numeric_code,
            http_status=row.http_status,
            message=_default_message(row) if message is None else message,
        )

    def refine(self, numeric_code: int) -> ServiceError:
        """A copy whose numeric code is a provider detail; status, code and message are kept
        (the numeric code refines the cause without changing the HTTP status)."""
        if numeric_code not in PROVIDER_DETAIL_CODES:
            raise ValueError(
                f"{numeric_code} is not a provider-detail numeric code"
                f" {sorted(PROVIDER_DETAIL_CODES)}"
            )
        return type(self)(
            code=self.code,
            numeric_code=numeric_code,
            http_status=self.http_status,
            message=self.message,
        )

    def body(self) -> dict[str, object]:
        """The contract's error object (without ``request_id``, which the envelope carries)."""
        return {"code": self.code, "numeric_code": self.numeric_code, "message": self.message}

    def __str__(self) -> str:
        # BaseException.__str__ would print ``args``, which keyword construction leaves empty.
        return f"{self.code} ({self.numeric_code}, HTTP {self.http_status}): {self.message}"

    def __reduce__(self) -> tuple[type[ServiceError], tuple[str, int, int, str]]:
        # BaseException pickles/copies via ``args``; rebuild from the fields instead.
        return (type(self), (self.code, self.numeric_code, self.http_status, self.message))


def export() -> list[dict[str, object]]:
    """The catalogue as JSON-ready rows (what schemas/error-catalogue.json holds): the
    contract's rows in its order, exactly as it has them, then the extensions, each with
    ``"extension": true``."""
    rows: list[dict[str, object]] = []
    for e in (*ENTRIES, *EXTENSIONS):
        row: dict[str, object] = {
            "code": e.code,
            "numeric_code": e.numeric_code,
            "http_status": e.http_status,
            "condition": e.condition,
        }
        if e.extension:
            row["extension"] = True
        rows.append(row)
    return rows


def write_catalogue_json(path: Path) -> None:
    """Write ``export()`` as stable, diff-friendly JSON (indent 2, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(export(), indent=2, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
