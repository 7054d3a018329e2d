"""The error catalogue: the contract's rows in its order, conditions verbatim, and the service's own
in a 90000 block (docs/api.md, "Errors"). Messages come from here, so a reply re-sent for a
redelivered command is byte-identical."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
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


def _rows(table: str, *, extension: bool = False) -> tuple[CatalogueEntry, ...]:
    """Rows of ``table``: one per line, ``status code numeric_code condition`` (status ``-``
    for a provider-detail refinement); an indented line continues the condition above."""
    rows: list[list[str]] = []
    for line in table.strip("\n").splitlines():
        if line.startswith(" "):
            rows[-1][3] += " " + line.strip()
        else:
            rows.append(line.split(" ", 3))
    return tuple(
        CatalogueEntry(code, int(num), None if status == "-" else int(status), cond, extension)
        for status, code, num, cond in rows
    )


# The contract's catalogue, in its order, conditions verbatim. Its authentication rows
# (missing_api_key, invalid_api_key, cors_forbidden) are identical (code, numeric_code, status)
# to the 401/403 rows below, so they are not repeated; the catalogue's condition text is kept.
ENTRIES: Final[tuple[CatalogueEntry, ...]] = _rows(
    """
400 invalid_request 10000 Request body cannot be decoded or required fields are missing.
400 invalid_provider 30000 Provider name in the URL is missing or unsupported.
400 unsupported_action 30005 Account action is not recognised.
400 invalid_conversation_type 37000 `type` must be user, group, or channel.
400 unsupported_conversation_type 37001 Provider does not support the operation for this
    conversation type.
400 unsupported_message_type 36000 `message.type` is not supported by the selected provider.
400 unsupported_provider_auth_mode 20018 `auth_mode` is not supported by the selected provider.
400 auth_mode_phone_required 20019 The selected auth mode requires `provider_data.phone` at account
    creation.
400 invalid_reply_token 36006 `reply_to.reply_token` is tampered with, encrypted with a different
    key, or unreadable. The token from `data.message.reply_token` must be passed back unchanged.
400 provider_invalid_request 30001 The provider adapter rejected provider-specific request data as
    invalid.
400 create_api_key_failed 11101 API key creation request was rejected.
400 update_api_key_failed 11102 API key update request was rejected.
400 rotate_api_key_failed 11103 API key rotation request was rejected.
400 update_workspace_failed 41001 Workspace update was rejected.
401 missing_api_key 11000 The `X-Api-Key` request header is missing.
401 invalid_api_key 11001 The API key is not recognised or has been disabled.
403 cors_forbidden 11009 CORS preflight origin, method or requested headers not allowed.
404 not_found 10001 The route does not exist.
404 conversation_not_found 37002 The conversation could not be found by the provider.
404 contact_not_found 35000 The contact could not be found under this account.
404 group_not_found 34004 The group could not be found under this account. Legacy provider paths
    may retain their original HTTP status and code.
409 account_allocation_busy 20011 Account allocation lock is held; retry after a short delay.
409 no_allocatable_server 20013 No allocatable provider server in the requested region.
409 workspace_account_quota_exceeded 20014 The workspace account quota is exhausted.
409 duplicate_provider_account 20015 Another account in this workspace already uses the same
    provider identity.
409 account_already_authorized 20016 The account is already authorised; the requested auth action
    is rejected.
409 account_binding_not_found 30006 The account is not bound to an active provider server.
409 provider_account_mismatch 20017 The requested provider identity does not match the account
    binding.
409 provider_not_ready 30009 The provider runtime is not ready for this operation yet.
422 contact_not_found 35000 `GET /contacts/info` when the target conversation does not exist. The
    message then reads "Conversation not found".
500 list_accounts_failed 20000 Listing accounts.
500 get_account_failed 20001 Loading account details.
500 create_account_failed 20002 Creating the account.
500 update_account_failed 20003 Updating the account.
500 delete_account_failed 20004 Deleting the account.
500 get_session_failed 20005 Loading the authentication session.
500 get_auth_state_failed 20006 Loading authentication state.
500 run_action_failed 20007 Running an account action.
500 run_runtime_action_failed 20008 Running a runtime action.
500 run_session_action_failed 20009 Running a session action.
500 run_auth_action_failed 20010 Running an authentication action.
500 send_message_failed 36001 Sending the message.
500 pin_message_failed 36002 Pinning or unpinning (server or upstream).
500 revoke_message_failed 36003 Revoking the message (server or upstream).
500 react_message_failed 36004 Reacting to the message (server or upstream).
500 edit_message_failed 36005 Editing the message text (server or upstream).
500 list_conversations_failed 37003 Listing conversations.
500 get_conversation_failed 37004 Loading the conversation.
500 list_conversation_members_failed 37005 Listing conversation members.
500 mark_conversation_read_failed 37006 Marking as read (server or upstream).
500 mark_conversation_unread_failed 37007 Marking as unread (server or upstream).
500 mute_conversation_failed 37008 Muting (server or upstream).
500 unmute_conversation_failed 37009 Unmuting (server or upstream).
500 pin_conversation_failed 37010 Pinning (server or upstream).
500 unpin_conversation_failed 37011 Unpinning (server or upstream).
500 list_conversation_labels_failed 37012 Listing conversation labels (server or upstream).
500 upsert_label_failed 37013 Creating or updating a label (server or upstream).
500 delete_label_failed 37014 Deleting a label (server or upstream).
500 set_label_members_failed 37015 Tagging or untagging conversations (server or upstream).
500 list_contacts_failed 35001 Listing contacts.
500 get_contact_failed 35002 Loading the contact.
500 create_contact_failed 35003 Adding the contact (server or channel).
500 get_contact_membership_failed 35004 Checking contact membership (server or channel).
500 block_contact_failed 35005 Blocking (server or upstream).
500 unblock_contact_failed 35006 Unblocking (server or upstream).
500 list_blocklist_failed 35007 Loading the blocklist (server or upstream).
500 set_contact_note_failed 35008 Setting or clearing the contact note (server or upstream).
500 list_groups_failed 34000 Listing groups.
500 get_group_failed 34001 Loading the group.
500 create_group_failed 34002 Creating the group (server or upstream).
500 leave_group_failed 34003 Leaving the group (server or upstream).
500 update_group_members_failed 34005 Updating group members (server or upstream).
500 update_group_info_failed 34006 Updating name, description or avatar, including admin-permission
    rejections (server or upstream).
500 list_group_join_requests_failed 34007 Listing pending join requests (server or upstream).
500 update_group_join_requests_failed 34008 Approving or rejecting join requests (server or
    upstream).
500 set_group_join_approval_mode_failed 34009 Toggling join approval mode (server or upstream).
500 get_group_invite_code_failed 34010 Fetching the invite link or code (server or upstream).
500 list_webhook_endpoints_failed 40000 Listing webhook endpoints.
500 create_webhook_endpoint_failed 40001 Creating the webhook endpoint.
500 get_webhook_endpoint_failed 40002 Loading the webhook endpoint.
500 update_webhook_endpoint_failed 40003 Updating the webhook endpoint.
500 deactivate_webhook_endpoint_failed 40004 Deactivating the webhook endpoint.
500 delete_webhook_endpoint_failed 40005 Deleting the webhook endpoint.
500 get_workspace_failed 41000 Loading the workspace.
500 list_api_keys_failed 11100 Listing API keys.
500 list_provider_regions_failed 30011 Listing provider regions.
501 unsupported_by_provider 30003 The selected provider has not implemented this endpoint.
502 provider_adapter_not_found 30004 The provider adapter is unavailable or not registered.
502 provider_unavailable 30002 The provider or its upstream service is temporarily unavailable.
503 allocation_service_unavailable 20012 The allocation lock service is unavailable; retry shortly.
- provider_operation_failed 30010 Generic provider operation failure.
- group_not_found 34004 The group cannot be found. Legacy provider paths may retain their original
    HTTP status and code.
- group_not_participant 34011 The group may exist, but the current account is not a participant.
"""
)

# The service's own rows: answers the contract leaves "not shown" (rate limits, time-outs, a
# method the route does not take, the endpoint quota: a limit, not a fault, so not a 500). The
# idempotent confirms' (docs/api.md, "Idempotent confirms") are numbered from 90031.
EXTENSIONS: Final[tuple[CatalogueEntry, ...]] = _rows(
    """
408 request_timeout 90001 The request body did not arrive within the front-end's body time-out.
429 rate_limited 90002 The workspace sent more requests than its rate limit allows; retry after
    `Retry-After` seconds.
405 method_not_allowed 90003 The route exists but does not take this method; `Allow` lists the
    methods it takes.
409 webhook_endpoint_quota_exceeded 90004 The workspace has reached its quota of webhook endpoints;
    delete one before creating another.
400 event_history_window_exceeded 90010 `since` is older than the account event history's window (7
    days); ask from a later time.
401 portal_session_invalid 90020 The portal session token is malformed, expired, of another
    front-end's secret, or its API key has been disabled or deleted; open a new portal session.
403 portal_scope_forbidden 90021 A portal session may read endpoints, event types and deliveries,
    send tests, resend, rotate a secret and deactivate or activate an endpoint; this route needs an
    API key.
500 create_portal_session_failed 90022 Creating a portal session: the service has no portal secret
    configured.
409 idempotency_key_reused 90031 The `Idempotency-Key` was used within the last 24 hours with
    another request (another account or another body); nothing was sent. Use a new key for a new
    request.
409 idempotency_key_in_progress 90032 A request with this `Idempotency-Key` is still being
    answered; nothing was sent. Retry after `Retry-After` seconds to get its answer.
429 idempotency_keys_exhausted 90033 The workspace holds as many `Idempotency-Key`s of the last 24
    hours as it may; nothing was sent. Retry after `Retry-After` seconds, or send the request
    without a key.
""",
    extension=True,
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
    """The row for ``code``: at ``http_status`` (``None``: the provider-detail row), else the
    row with the lowest real HTTP status, else its provider-detail row."""
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


@attrs.frozen(auto_exc=False)
class ServiceError(Exception):
    """A catalogued failure: the contract's error object plus its HTTP status, validated against
    the catalogue on construction and compared by value (``auto_exc=False``: not by identity).
    A value and a raisable exception, so ``attrs.frozen``: a frozen dataclass exception breaks
    when ``contextlib`` or ``add_note`` set ``__traceback__``/``__notes__``; attrs lets them by."""

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
        """The catalogued error for ``code`` (at ``http_status`` when it has several);
        provider-detail-only rows have no status of their own: they are applied with ``refine``."""
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
        """A copy whose numeric code is a provider detail; status, code and message are kept."""
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
