"""The rows of the error catalogue: the contract's (``ENTRIES``, in its order, conditions
verbatim) and the service's own extensions (``EXTENSIONS``, codes in a 90000 block), kept apart
(docs/api.md, "Errors" and "Service extensions"). Looked up through
``worker.contract.catalogue``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ENTRIES", "EXTENSIONS", "PROVIDER_DETAIL_CODES", "CatalogueEntry"]


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
    CatalogueEntry(
        "portal_session_invalid",
        90020,
        401,
        "The portal session token is malformed, expired, of another front-end's secret, or its"
        " API key has been disabled or deleted; open a new portal session.",
        extension=True,
    ),
    CatalogueEntry(
        "portal_scope_forbidden",
        90021,
        403,
        "A portal session may read endpoints, event types and deliveries, send tests, resend,"
        " rotate a secret and deactivate or activate an endpoint; this route needs an API key.",
        extension=True,
    ),
    CatalogueEntry(
        "create_portal_session_failed",
        90022,
        500,
        "Creating a portal session: the service has no portal secret configured.",
        extension=True,
    ),
)

PROVIDER_DETAIL_CODES: Final[frozenset[int]] = frozenset(
    e.numeric_code for e in ENTRIES if e.http_status is None
)
