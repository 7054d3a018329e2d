"""The error catalogue: the contract's error rows (``ENTRIES``) and the service's own
extensions (``EXTENSIONS``, codes in a 90000 block), kept apart (docs/api.md, "Errors" and
"Service extensions"); ``ServiceError`` carries one. Messages come from here, so a replayed
reply is byte-identical."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, Literal

import attrs

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


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    """One row. ``http_status`` is None only for provider-detail refinements; ``extension``
    marks a row the service adds where the contract says nothing."""

    code: str
    numeric_code: int
    http_status: int | None
    condition: str
    extension: bool = False


def _table(http_status: int | None, *rows: tuple[str, int, str]) -> tuple[CatalogueEntry, ...]:
    return tuple(CatalogueEntry(code, num, http_status, cond) for code, num, cond in rows)


# The contract's catalogue, in its order, conditions verbatim. Its authentication rows
# (missing_api_key, invalid_api_key, cors_forbidden) are identical (code, numeric_code, status)
# to the 401/403 rows below, so they are not repeated; the catalogue's condition text is kept.
ENTRIES: Final[tuple[CatalogueEntry, ...]] = (
    *_table(
        400,
        (
            "invalid_request",
            10000,
            "Request body cannot be decoded or required fields are missing.",
        ),
        ("invalid_provider", 30000, "Provider name in the URL is missing or unsupported."),
        ("unsupported_action", 30005, "Account action is not recognised."),
        ("invalid_conversation_type", 37000, "`type` must be user, group, or channel."),
        (
            "unsupported_conversation_type",
            37001,
            "Provider does not support the operation for this conversation type.",
        ),
        (
            "unsupported_message_type",
            36000,
            "`message.type` is not supported by the selected provider.",
        ),
        (
            "unsupported_provider_auth_mode",
            20018,
            "`auth_mode` is not supported by the selected provider.",
        ),
        (
            "auth_mode_phone_required",
            20019,
            "The selected auth mode requires `provider_data.phone` at account creation.",
        ),
        (
            "invalid_reply_token",
            36006,
            "`reply_to.reply_token` is tampered with, encrypted with a different key, or"
            " unreadable. The token from `data.message.reply_token` must be passed back"
            " unchanged.",
        ),
        (
            "provider_invalid_request",
            30001,
            "The provider adapter rejected provider-specific request data as invalid.",
        ),
        ("create_api_key_failed", 11101, "API key creation request was rejected."),
        ("update_api_key_failed", 11102, "API key update request was rejected."),
        ("rotate_api_key_failed", 11103, "API key rotation request was rejected."),
        ("update_workspace_failed", 41001, "Workspace update was rejected."),
    ),
    *_table(
        401,
        ("missing_api_key", 11000, "The `X-Api-Key` request header is missing."),
        ("invalid_api_key", 11001, "The API key is not recognised or has been disabled."),
    ),
    *_table(
        403,
        (
            "cors_forbidden",
            11009,
            "CORS preflight origin, method or requested headers not allowed.",
        ),
    ),
    *_table(
        404,
        ("not_found", 10001, "The route does not exist."),
        ("conversation_not_found", 37002, "The conversation could not be found by the provider."),
        ("contact_not_found", 35000, "The contact could not be found under this account."),
        (
            "group_not_found",
            34004,
            "The group could not be found under this account. Legacy provider paths may retain"
            " their original HTTP status and code.",
        ),
    ),
    *_table(
        409,
        (
            "account_allocation_busy",
            20011,
            "Account allocation lock is held; retry after a short delay.",
        ),
        (
            "no_allocatable_server",
            20013,
            "No allocatable provider server in the requested region.",
        ),
        (
            "workspace_account_quota_exceeded",
            20014,
            "The workspace account quota is exhausted.",
        ),
        (
            "duplicate_provider_account",
            20015,
            "Another account in this workspace already uses the same provider identity.",
        ),
        (
            "account_already_authorized",
            20016,
            "The account is already authorised; the requested auth action is rejected.",
        ),
        (
            "account_binding_not_found",
            30006,
            "The account is not bound to an active provider server.",
        ),
        (
            "provider_account_mismatch",
            20017,
            "The requested provider identity does not match the account binding.",
        ),
        (
            "provider_not_ready",
            30009,
            "The provider runtime is not ready for this operation yet.",
        ),
    ),
    *_table(
        422,
        (
            "contact_not_found",
            35000,
            "`GET /contacts/info` when the target conversation does not exist. The message then"
            ' reads "Conversation not found".',
        ),
    ),
    *_table(
        500,
        # Accounts and authentication.
        ("list_accounts_failed", 20000, "Listing accounts."),
        ("get_account_failed", 20001, "Loading account details."),
        ("create_account_failed", 20002, "Creating the account."),
        ("update_account_failed", 20003, "Updating the account."),
        ("delete_account_failed", 20004, "Deleting the account."),
        ("get_session_failed", 20005, "Loading the authentication session."),
        ("get_auth_state_failed", 20006, "Loading authentication state."),
        ("run_action_failed", 20007, "Running an account action."),
        ("run_runtime_action_failed", 20008, "Running a runtime action."),
        ("run_session_action_failed", 20009, "Running a session action."),
        ("run_auth_action_failed", 20010, "Running an authentication action."),
        # Messages.
        ("send_message_failed", 36001, "Sending the message."),
        ("pin_message_failed", 36002, "Pinning or unpinning (server or upstream)."),
        ("revoke_message_failed", 36003, "Revoking the message (server or upstream)."),
        ("react_message_failed", 36004, "Reacting to the message (server or upstream)."),
        ("edit_message_failed", 36005, "Editing the message text (server or upstream)."),
        # Conversations.
        ("list_conversations_failed", 37003, "Listing conversations."),
        ("get_conversation_failed", 37004, "Loading the conversation."),
        ("list_conversation_members_failed", 37005, "Listing conversation members."),
        ("mark_conversation_read_failed", 37006, "Marking as read (server or upstream)."),
        ("mark_conversation_unread_failed", 37007, "Marking as unread (server or upstream)."),
        ("mute_conversation_failed", 37008, "Muting (server or upstream)."),
        ("unmute_conversation_failed", 37009, "Unmuting (server or upstream)."),
        ("pin_conversation_failed", 37010, "Pinning (server or upstream)."),
        ("unpin_conversation_failed", 37011, "Unpinning (server or upstream)."),
        (
            "list_conversation_labels_failed",
            37012,
            "Listing conversation labels (server or upstream).",
        ),
        ("upsert_label_failed", 37013, "Creating or updating a label (server or upstream)."),
        ("delete_label_failed", 37014, "Deleting a label (server or upstream)."),
        (
            "set_label_members_failed",
            37015,
            "Tagging or untagging conversations (server or upstream).",
        ),
        # Contacts.
        ("list_contacts_failed", 35001, "Listing contacts."),
        ("get_contact_failed", 35002, "Loading the contact."),
        ("create_contact_failed", 35003, "Adding the contact (server or channel)."),
        (
            "get_contact_membership_failed",
            35004,
            "Checking contact membership (server or channel).",
        ),
        ("block_contact_failed", 35005, "Blocking (server or upstream)."),
        ("unblock_contact_failed", 35006, "Unblocking (server or upstream)."),
        ("list_blocklist_failed", 35007, "Loading the blocklist (server or upstream)."),
        (
            "set_contact_note_failed",
            35008,
            "Setting or clearing the contact note (server or upstream).",
        ),
        # Groups.
        ("list_groups_failed", 34000, "Listing groups."),
        ("get_group_failed", 34001, "Loading the group."),
        ("create_group_failed", 34002, "Creating the group (server or upstream)."),
        ("leave_group_failed", 34003, "Leaving the group (server or upstream)."),
        ("update_group_members_failed", 34005, "Updating group members (server or upstream)."),
        (
            "update_group_info_failed",
            34006,
            "Updating name, description or avatar, including admin-permission rejections"
            " (server or upstream).",
        ),
        (
            "list_group_join_requests_failed",
            34007,
            "Listing pending join requests (server or upstream).",
        ),
        (
            "update_group_join_requests_failed",
            34008,
            "Approving or rejecting join requests (server or upstream).",
        ),
        (
            "set_group_join_approval_mode_failed",
            34009,
            "Toggling join approval mode (server or upstream).",
        ),
        (
            "get_group_invite_code_failed",
            34010,
            "Fetching the invite link or code (server or upstream).",
        ),
        # Webhook endpoints, workspace, API keys, regions.
        ("list_webhook_endpoints_failed", 40000, "Listing webhook endpoints."),
        ("create_webhook_endpoint_failed", 40001, "Creating the webhook endpoint."),
        ("get_webhook_endpoint_failed", 40002, "Loading the webhook endpoint."),
        ("update_webhook_endpoint_failed", 40003, "Updating the webhook endpoint."),
        ("deactivate_webhook_endpoint_failed", 40004, "Deactivating the webhook endpoint."),
        ("delete_webhook_endpoint_failed", 40005, "Deleting the webhook endpoint."),
        ("get_workspace_failed", 41000, "Loading the workspace."),
        ("list_api_keys_failed", 11100, "Listing API keys."),
        ("list_provider_regions_failed", 30011, "Listing provider regions."),
    ),
    *_table(
        501,
        (
            "unsupported_by_provider",
            30003,
            "The selected provider has not implemented this endpoint.",
        ),
    ),
    *_table(
        502,
        (
            "provider_adapter_not_found",
            30004,
            "The provider adapter is unavailable or not registered.",
        ),
        (
            "provider_unavailable",
            30002,
            "The provider or its upstream service is temporarily unavailable.",
        ),
    ),
    *_table(
        503,
        (
            "allocation_service_unavailable",
            20012,
            "The allocation lock service is unavailable; retry shortly.",
        ),
    ),
    *_table(
        None,
        ("provider_operation_failed", 30010, "Generic provider operation failure."),
        (
            "group_not_found",
            34004,
            "The group cannot be found. Legacy provider paths may retain their original HTTP"
            " status and code.",
        ),
        (
            "group_not_participant",
            34011,
            "The group may exist, but the current account is not a participant.",
        ),
    ),
)

# The service's own rows: answers the contract leaves "not shown" (rate limits, time-outs, a method
# the route does not take, the endpoint quota: a limit, not a fault, so not a 500).
EXTENSIONS: Final[tuple[CatalogueEntry, ...]] = (
    CatalogueEntry(
        "request_timeout",
        90001,
        408,
        "The request body did not arrive within the front-end's body time-out.",
        extension=True,
    ),
    CatalogueEntry(
        "rate_limited",
        90002,
        429,
        "The workspace sent more requests than its rate limit allows; retry after"
        " `Retry-After` seconds.",
        extension=True,
    ),
    CatalogueEntry(
        "method_not_allowed",
        90003,
        405,
        "The route exists but does not take this method; `Allow` lists the methods it takes.",
        extension=True,
    ),
    CatalogueEntry(
        "webhook_endpoint_quota_exceeded",
        90004,
        409,
        "The workspace has reached its quota of webhook endpoints; delete one before creating"
        " another.",
        extension=True,
    ),
)

PROVIDER_DETAIL_CODES: Final[frozenset[int]] = frozenset(
    e.numeric_code for e in ENTRIES if e.http_status is None
)


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
