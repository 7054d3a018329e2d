"""The error catalogue against the seed contract, its exported JSON, and its API.

The seed is parsed rather than re-typed here, so a row missing, changed or invented in
``worker.contract.catalogue`` (or in the committed schemas/error-catalogue.json) fails a test. The
service's extensions (answers the seed leaves "not shown") are checked apart: marked, after the
seed's rows, and never a seed code or numeric code.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs.exceptions import FrozenInstanceError

from worker.contract.catalogue import (
    ENTRIES,
    EXTENSIONS,
    PROVIDER_DETAIL_CODES,
    CatalogueEntry,
    ServiceError,
    by_numeric,
    entry,
    export,
)
from worker.documents.export import write_all

REPO = Path(__file__).resolve().parents[2]
SEED_DIR = Path(__file__).resolve().parents[3] / "shared" / "seed"
CATALOGUE_JSON = REPO / "schemas" / "error-catalogue.json"

Row = tuple[str, int, int | None, str]

_SECTION = re.compile(r"^## (\d+)\. ")
_STATUS_HEADING = re.compile(r"^### (\d{3}) [A-Z]")
_TABLE_ROW = re.compile(r"^\| (\w+) \| (\d{5}) \| (.+) \|$")
_AUTH_ROW = re.compile(r"HTTP (\d{3}), code `(\w+)`, numeric_code (\d{5})")


def _section(lines: list[str], number: int) -> list[str]:
    """The lines of seed section ``number`` (up to the next ``## N.`` heading)."""
    starts = [i for i, line in enumerate(lines) if _SECTION.match(line)]
    for pos, start in enumerate(starts):
        m = _SECTION.match(lines[start])
        if m is not None and int(m.group(1)) == number:
            end = starts[pos + 1] if pos + 1 < len(starts) else len(lines)
            return lines[start + 1 : end]
    raise AssertionError(f"seed has no section {number}")


def _parse_errors(lines: list[str]) -> list[Row]:
    """§7 table rows, status taken from the enclosing ``###`` heading (500 sub-tables share
    the 500 heading; the provider-detail table has no status)."""
    rows: list[Row] = []
    status: int | None = None
    in_table = False
    for line in lines:
        if line.startswith("### "):
            m = _STATUS_HEADING.match(line)
            if m is not None:
                status = int(m.group(1))
            elif line.strip() == "### Provider-detail numeric codes":
                status = None
            else:
                raise AssertionError(f"unrecognised §7 heading: {line!r}")
            in_table = True
            continue
        m = _TABLE_ROW.match(line)
        if m is not None:
            assert in_table, f"table row before any status heading: {line!r}"
            rows.append((m.group(1), int(m.group(2)), status, m.group(3)))
        elif line.startswith("|") and not line.startswith(("| code |", "|---")):
            raise AssertionError(f"unparsed §7 table line: {line!r}")
    return rows


def _parse_auth(lines: list[str]) -> list[Row]:
    """§5 rows written as prose: ``| Missing header | HTTP 401, code `x`, numeric_code N. |``."""
    rows: list[Row] = []
    for line in lines:
        m = _AUTH_ROW.search(line)
        if m is not None:
            detail = line.strip().strip("|").split("|", 1)[1].strip()
            rows.append((m.group(2), int(m.group(3)), int(m.group(1)), detail))
    return rows


@pytest.fixture(scope="module")
def seed_rows() -> list[Row]:
    """Every catalogue row the seed defines: §7 in order, then any §5 row §7 lacks."""
    if not SEED_DIR.is_dir():
        pytest.skip(f"seed directory {SEED_DIR} not found (shared/ must sit beside the repo)")
    seeds = sorted(SEED_DIR.glob("*.txt"))
    if not seeds:
        pytest.skip(f"no *.txt seed contract in {SEED_DIR}")
    assert len(seeds) == 1, f"expected exactly one seed contract in {SEED_DIR}, found {seeds}"
    lines = seeds[0].read_text(encoding="utf-8").splitlines()
    errors = _parse_errors(_section(lines, 7))
    auth = _parse_auth(_section(lines, 5))
    assert errors, "parsed no §7 error rows: the seed format changed"
    assert auth, "parsed no §5 authentication rows: the seed format changed"
    known = {(code, num, status) for code, num, status, _ in errors}
    return errors + [r for r in auth if (r[0], r[1], r[2]) not in known]


def _rows(entries: tuple[CatalogueEntry, ...]) -> list[Row]:
    return [(e.code, e.numeric_code, e.http_status, e.condition) for e in entries]


# ---------------------------------------------------------------------------------------------
# Seed fidelity and drift
# ---------------------------------------------------------------------------------------------


def test_entries_equal_seed_rows(seed_rows: list[Row]) -> None:
    actual = _rows(ENTRIES)
    assert [r for r in seed_rows if r not in actual] == [], "missing or changed rows"
    assert [r for r in actual if r not in seed_rows] == [], "invented or changed rows"
    assert actual == seed_rows, "same rows, different order"


def test_committed_json_equals_seed_rows(seed_rows: list[Row]) -> None:
    """Every row not marked as an extension is a seed row, exactly: no extra key, seed order."""
    data = json.loads(CATALOGUE_JSON.read_text(encoding="utf-8"))
    assert isinstance(data, list)
    seed = [d for d in data if d.get("extension") is not True]
    assert all(list(d) == ["code", "numeric_code", "http_status", "condition"] for d in seed)
    actual = [(d["code"], d["numeric_code"], d["http_status"], d["condition"]) for d in seed]
    assert actual == seed_rows


def test_extensions_are_not_seed_rows(seed_rows: list[Row]) -> None:
    seed_codes = {code for code, _, _, _ in seed_rows}
    seed_numbers = {num for _, num, _, _ in seed_rows}
    for e in EXTENSIONS:
        assert e.extension
        assert e.code not in seed_codes
        assert e.numeric_code not in seed_numbers


def test_seed_statuses_and_auth_rows(seed_rows: list[Row]) -> None:
    statuses = {status for _, _, status, _ in seed_rows}
    assert statuses == {400, 401, 403, 404, 409, 422, 500, 501, 502, 503, None}
    triples = {(e.code, e.numeric_code, e.http_status) for e in ENTRIES}
    assert {
        ("missing_api_key", 11000, 401),
        ("invalid_api_key", 11001, 401),
        ("cors_forbidden", 11009, 403),
    } <= triples


def test_committed_json_matches_export() -> None:
    assert json.loads(CATALOGUE_JSON.read_text(encoding="utf-8")) == export()


def test_the_written_catalogue_is_byte_identical_to_committed(tmp_path: Path) -> None:
    write_all(tmp_path / "nested" / "schemas")
    text = (tmp_path / "nested" / "schemas" / "error-catalogue.json").read_text(encoding="utf-8")
    assert text.endswith("]\n")
    assert text.startswith('[\n  {\n    "code": ')
    assert text == CATALOGUE_JSON.read_text(encoding="utf-8")


def test_export_shape() -> None:
    rows = export()
    assert len(rows) == len(ENTRIES) + len(EXTENSIONS)
    for row in rows[: len(ENTRIES)]:
        assert list(row) == ["code", "numeric_code", "http_status", "condition"]
    for row in rows[len(ENTRIES) :]:
        assert list(row) == ["code", "numeric_code", "http_status", "condition", "extension"]
        assert row["extension"] is True
    for row in rows:
        assert isinstance(row["numeric_code"], int)
        assert 10000 <= row["numeric_code"] <= 99999
        assert row["http_status"] is None or isinstance(row["http_status"], int)


# ---------------------------------------------------------------------------------------------
# Lookups
# ---------------------------------------------------------------------------------------------


def test_code_status_pairs_are_unique() -> None:
    pairs = [(e.code, e.http_status) for e in (*ENTRIES, *EXTENSIONS)]
    assert len(pairs) == len(set(pairs))


def test_extension_rows() -> None:
    """The front door's refusals: 408 (a body too slow), 429 (a workspace's rate limit), 405
    (a method the route does not take), 409 (the endpoint quota) and 400 (an event history
    asked from before its window), in a 90000 block, as real rows ``ServiceError.of``
    builds."""
    assert [(e.code, e.numeric_code, e.http_status) for e in EXTENSIONS] == [
        ("request_timeout", 90001, 408),
        ("rate_limited", 90002, 429),
        ("method_not_allowed", 90003, 405),
        ("webhook_endpoint_quota_exceeded", 90004, 409),
        ("event_history_window_exceeded", 90010, 400),
        ("portal_session_invalid", 90020, 401),
        ("portal_scope_forbidden", 90021, 403),
        ("create_portal_session_failed", 90022, 500),
        ("idempotency_key_reused", 90031, 409),
        ("idempotency_key_in_progress", 90032, 409),
        ("idempotency_keys_exhausted", 90033, 429),
    ]
    assert not any(e.extension for e in ENTRIES)
    assert {e.numeric_code for e in EXTENSIONS}.isdisjoint(e.numeric_code for e in ENTRIES)
    for e in EXTENSIONS:
        assert entry(e.code) is e
        assert by_numeric(e.numeric_code) == (e,)
        err = ServiceError.of(e.code)
        assert (err.numeric_code, err.http_status) == (e.numeric_code, e.http_status)
        assert "`" not in err.message


def test_provider_detail_codes() -> None:
    assert frozenset({30010, 34004, 34011}) == PROVIDER_DETAIL_CODES


def test_entry_single_row() -> None:
    e = entry("missing_api_key")
    assert (e.code, e.numeric_code, e.http_status) == ("missing_api_key", 11000, 401)
    assert entry("missing_api_key", 401) is e


def test_entry_code_under_two_statuses() -> None:
    assert entry("contact_not_found").http_status == 404
    assert entry("contact_not_found", 404).numeric_code == 35000
    assert entry("contact_not_found", 422).numeric_code == 35000
    assert entry("contact_not_found", 422).condition.startswith("`GET /contacts/info`")
    assert entry("group_not_found").http_status == 404
    detail = entry("group_not_found", None)
    assert (detail.numeric_code, detail.http_status) == (34004, None)
    assert detail.condition.startswith("The group cannot be found.")


def test_entry_provider_detail_only_code() -> None:
    e = entry("group_not_participant")
    assert (e.numeric_code, e.http_status) == (34011, None)
    assert entry("provider_operation_failed", None).numeric_code == 30010


def test_entry_unknown_code() -> None:
    with pytest.raises(KeyError, match="unknown error code 'no_such_code'"):
        entry("no_such_code")


def test_entry_wrong_status() -> None:
    with pytest.raises(KeyError, match=r"no row for HTTP status 500; catalogued: 404, 422"):
        entry("contact_not_found", 500)
    with pytest.raises(KeyError, match=r"catalogued: 404, provider-detail"):
        entry("group_not_found", 409)
    with pytest.raises(KeyError, match="no row for HTTP status None"):
        entry("not_found", None)


def test_by_numeric() -> None:
    assert [e.http_status for e in by_numeric(35000)] == [404, 422]
    assert [e.http_status for e in by_numeric(34004)] == [404, None]
    assert by_numeric(20016) == (entry("account_already_authorized"),)
    assert by_numeric(99999) == ()


# ---------------------------------------------------------------------------------------------
# ServiceError
# ---------------------------------------------------------------------------------------------


def test_of_every_status_row() -> None:
    for e in ENTRIES:
        if e.http_status is None:
            continue
        err = ServiceError.of(e.code, http_status=e.http_status)
        assert (err.code, err.numeric_code, err.http_status) == (
            e.code,
            e.numeric_code,
            e.http_status,
        )
        assert err.message
        assert "`" not in err.message


def test_of_default_messages() -> None:
    assert (
        ServiceError.of("missing_api_key").message == "The 'X-Api-Key' request header is missing."
    )
    assert (
        ServiceError.of("list_accounts_failed").message
        == "An internal error occurred while listing accounts."
    )
    assert ServiceError.of("contact_not_found", http_status=422).message == "Conversation not found"
    assert (
        ServiceError.of("group_not_found").message
        == "The group could not be found under this account."
    )


def test_of_custom_message_and_status_choice() -> None:
    err = ServiceError.of("contact_not_found", "nope", http_status=404)
    assert (err.http_status, err.message) == (404, "nope")
    assert ServiceError.of("contact_not_found").http_status == 404


def test_of_errors() -> None:
    with pytest.raises(KeyError, match="unknown error code"):
        ServiceError.of("no_such_code")
    with pytest.raises(KeyError, match="no row for HTTP status 409"):
        ServiceError.of("not_found", http_status=409)
    with pytest.raises(ValueError, match="provider-detail code"):
        ServiceError.of("group_not_participant")
    with pytest.raises(ValueError, match="provider-detail code"):
        ServiceError.of("provider_operation_failed")


def test_body_is_the_seed_error_object() -> None:
    assert ServiceError.of("provider_not_ready").body() == {
        "code": "provider_not_ready",
        "numeric_code": 30009,
        "message": "The provider runtime is not ready for this operation yet.",
    }


def test_refine_keeps_status_code_and_message() -> None:
    err = ServiceError.of("get_group_failed")
    refined = err.refine(34011)
    assert (refined.code, refined.http_status, refined.message) == (
        err.code,
        err.http_status,
        err.message,
    )
    assert refined.numeric_code == 34011
    assert err.numeric_code == 34001, "refine must not mutate the original"
    assert refined.refine(30010).numeric_code == 30010
    assert ServiceError.of("group_not_found").refine(34004) == ServiceError.of("group_not_found")


def test_refine_rejects_non_provider_codes() -> None:
    err = ServiceError.of("provider_unavailable")
    for bad in (30002, 35000, 99999):
        with pytest.raises(ValueError, match="not a provider-detail numeric code"):
            err.refine(bad)


def test_direct_construction_is_validated() -> None:
    ok = ServiceError(code="not_found", numeric_code=10001, http_status=404, message="m")
    assert ok == ServiceError.of("not_found", "m")
    assert ServiceError("not_found", 30010, 404, "m").numeric_code == 30010
    with pytest.raises(KeyError):
        ServiceError(code="invented", numeric_code=10001, http_status=404, message="m")
    with pytest.raises(KeyError):
        ServiceError(code="not_found", numeric_code=10001, http_status=418, message="m")
    with pytest.raises(ValueError, match="neither"):
        ServiceError(code="not_found", numeric_code=10000, http_status=404, message="m")


def test_service_error_is_frozen_value() -> None:
    err = ServiceError.of("not_found")
    with pytest.raises(FrozenInstanceError):
        err.message = "changed"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        err.anything = 1  # type: ignore[attr-defined]
    assert err == ServiceError.of("not_found")
    assert hash(err) == hash(ServiceError.of("not_found"))
    assert err != err.refine(30010)
    assert str(err) == "not_found (10001, HTTP 404): The route does not exist."


def test_service_error_raises_and_is_caught() -> None:
    with pytest.raises(ServiceError) as info:
        raise ServiceError.of("provider_unavailable")
    assert info.value.http_status == 502


def test_service_error_survives_stdlib_exception_handling() -> None:
    """contextlib assigns ``__traceback__``; add_note sets ``__notes__``; chaining sets
    ``__cause__``. A plain frozen dataclass exception turns each into a TypeError."""

    @contextlib.contextmanager
    def passthrough() -> Iterator[None]:
        yield

    def fail() -> None:
        with passthrough():
            try:
                raise KeyError("inner")
            except KeyError as exc:
                err = ServiceError.of("run_auth_action_failed")
                err.add_note("while confirming")
                raise err from exc

    with pytest.raises(ServiceError) as info:
        fail()
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.__notes__ == ["while confirming"]


def test_service_error_pickles_and_copies() -> None:
    err = ServiceError.of("group_not_found", "gone").refine(34011)
    assert pickle.loads(pickle.dumps(err)) == err
    assert copy.copy(err) == err
    assert copy.deepcopy(err) == err
