"""The wire contract: every record the system reads or writes, as pydantic v2 models exported to
``schemas/``; ``decode_command`` never raises, so a poison record cannot crash the consume loop."""

from __future__ import annotations

import re
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import core_schema, from_json

from worker.contract.compact_ids import CompactId, compact_id, expand_id
from worker.contract.shared_timestamps import RecordTimestamp, SharedTimestamp
from worker.contract.shared_timestamps import rfc3339 as rfc3339  # where it was

SCHEMA_VERSION: Literal[1] = 1
MAX_RECORD_BYTES = 64 * 1024
"""Commands are small; anything larger is hostile or broken and goes to the DLQ undecoded."""

# Identifiers: printable, bounded, no whitespace or path separators. The front-end applies the
# same rule to the path parameter so an id accepted over HTTP is always accepted here.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
STATUS_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"

Identifier = Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]
StatusValue = Annotated[str, Field(pattern=STATUS_PATTERN, max_length=64)]
ShortText = Annotated[str, Field(min_length=1, max_length=256)]
# Low-cardinality strings of the in-memory store (statuses, workspace and provider names,
# codes) are interned on decode: a restored partition then shares one copy of each.
Interned = Annotated[str, AfterValidator(sys.intern)]

# Event ids are UUIDv5 under this namespace, derived from the cause, so a replay re-sends the
# same id and consumers can drop duplicates.
EVENT_NAMESPACE = uuid.UUID("6f1c3b0e-2a52-4c1e-9d43-7b8f4b8f0d11")


def event_id(*parts: object) -> str:
    """Deterministic event id from its cause (e.g. ``"status", account_id, version``)."""
    return str(uuid.uuid5(EVENT_NAMESPACE, ":".join(str(p) for p in parts)))


class TopicRecord(BaseModel):
    """A record the product keeps on a topic of its own: frozen, fields it does not know (a
    newer writer's) ignored, named by its ``type`` (a literal in each subclass), version 1."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str
    schema_version: Literal[1] = 1


class Strict(BaseModel):
    """A body the product defines whole: frozen, and no field it does not list."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, str_max_length=4096)

    schema_version: Literal[1] = SCHEMA_VERSION


# --------------------------------------------------------------------------------------------
# Commands on auth.commands
# --------------------------------------------------------------------------------------------


class RegisterAccount(_Message):
    """An account enters (or re-enters) the flow; written by the account service."""

    type: Literal["register_account"] = "register_account"
    command_id: Identifier
    workspace_id: Identifier
    account_id: Identifier
    provider: Identifier | None = None
    provider_account_ref: Identifier | None = None
    status: StatusValue


class ObserveAuthState(_Message):
    """What the provider reports about the account (webhook ingester or the worker's polling)."""

    type: Literal["observe_auth_state"] = "observe_auth_state"
    command_id: Identifier
    account_id: Identifier
    status: StatusValue
    auth_status: StatusValue
    source: ShortText = "provider"


class PasskeyConfirm(_Message):
    """The caller confirms the pending Passkey challenge; produced by the API front-end."""

    type: Literal["passkey_confirm"] = "passkey_confirm"
    command_id: Identifier
    request_id: Identifier
    workspace_id: Identifier
    account_id: Identifier
    issued_at: datetime
    deadline: datetime | None = None


class DeregisterAccount(_Message):
    """The account leaves the flow; later commands for it answer 404."""

    type: Literal["deregister_account"] = "deregister_account"
    command_id: Identifier
    workspace_id: Identifier
    account_id: Identifier


#: The longest a query may ask to be parked (``GetAuthState.wait_ms``): 30 s; its time-out may
#: come ``SLACK_SHARE`` of it late (docs/architecture.md, "Long-polls").
MAX_WAIT_MS = 30_000
SLACK_SHARE = 0.1


class GetAuthState(_Message):
    """A query, produced by the API front-end for ``GET /v1/accounts/{account_id}/auth``: the
    owner of the account's partition answers it from its store with one reply (the same
    ``reply-partition`` header as a confirm), and writes nothing else. Behind a confirm of the
    same account in the partition, it sees that confirm's outcome (read-your-writes).

    A long-poll (``wait_ms`` > 0) is answered once the account's version passes
    ``after_version`` (at once if it already has; the version it holds now when absent), or
    after ``wait_ms`` with the state as it is then; the owner parks it without holding the
    record (docs/architecture.md, "Long-polls"). Both fields are optional: a worker older than
    them ignores them (``extra="ignore"``) and answers at once."""

    type: Literal["get_auth_state"] = "get_auth_state"
    command_id: Identifier
    request_id: Identifier
    workspace_id: Identifier
    account_id: Identifier
    after_version: int | None = Field(
        default=None,
        ge=0,
        description="Answer once the account's version is above this (absent: the version it "
        "has when the query is handled). Only with wait_ms.",
    )
    wait_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_WAIT_MS,
        description="A long-poll: wait up to this long for the version to pass after_version, "
        "then answer with the state as it is. Absent or 0: answer at once.",
    )


Command = Annotated[
    RegisterAccount | ObserveAuthState | PasskeyConfirm | DeregisterAccount | GetAuthState,
    Field(discriminator="type"),
]
#: The commands a caller waits on, which carry its ``request_id``.
Requested = PasskeyConfirm | GetAuthState


def request_id_of(command: Command) -> str | None:
    """The caller's request id of a command that has one (a confirm, a query), else None."""
    return command.request_id if isinstance(command, Requested) else None


def workspace_id_of(command: Command) -> str | None:
    """The workspace a command comes from; None for the provider's observation, which names
    none (it is the system's own)."""
    return None if isinstance(command, ObserveAuthState) else command.workspace_id


COMMAND_TYPES = (
    "register_account",
    "observe_auth_state",
    "passkey_confirm",
    "deregister_account",
    "get_auth_state",
)
_command_adapter: TypeAdapter[Command] = TypeAdapter(Command)


# --------------------------------------------------------------------------------------------
# Outputs: reply, status event, error event
# --------------------------------------------------------------------------------------------


class AuthData(BaseModel):
    """The contract's success ``data`` object (docs/api.md)."""

    model_config = ConfigDict(frozen=True)

    account_id: str
    status: str
    auth_status: str


class ErrorBody(BaseModel):
    """The contract's error object (docs/api.md, "Errors"): branch on ``code`` and
    ``numeric_code``, never on ``message``."""

    model_config = ConfigDict(frozen=True)

    code: str
    numeric_code: int
    message: str


class ReplyBody(BaseModel):
    """The response envelope the front-end returns unchanged."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    data: AuthData | None = None
    error: ErrorBody | None = None


class Reply(_Message):
    """Exactly one per ``passkey_confirm`` and per ``get_auth_state`` on auth.replies.
    ``version`` is the account record's version the reply reflects (absent in replies
    written before it existed, and in a query's 404)."""

    type: Literal["reply"] = "reply"
    command_id: str
    request_id: str
    account_id: str
    http_status: int
    body: ReplyBody
    version: int | None = None


class AuthStatusChanged(_Message):
    """On auth.status, only on a real transition; ``version`` is the record version after it."""

    type: Literal["auth_status_changed"] = "auth_status_changed"
    event_id: str
    account_id: str
    workspace_id: str
    previous_status: str | None
    status: str
    auth_status: str
    version: int
    command_id: str | None = None
    request_id: str | None = None
    occurred_at: str


class AuthError(_Message):
    """On auth.errors, one per failed command (and per DLQ record with a readable account)."""

    type: Literal["auth_error"] = "auth_error"
    event_id: str
    account_id: str
    workspace_id: str | None
    command_id: str | None
    request_id: str | None
    http_status: int
    error: ErrorBody
    occurred_at: str


# --------------------------------------------------------------------------------------------
# The account record on auth.state (compacted): the state store's changelog
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InFlight:
    """Write-ahead intent: a provider call that started and has not been settled yet."""

    command_id: str
    request_id: str
    started_at: SharedTimestamp
    deadline: float


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Timers of the flow after the challenge was confirmed (epoch seconds).

    They live in the record, so a new owner resumes them after a rebalance or a crash.
    """

    deadline_at: float
    next_poll_at: float
    polls: int = 0


def _command_id_in(value: str) -> int | str | None:
    return None if value == "" else compact_id(value)


def _command_id_out(value: int | str | None) -> str:
    return "" if value is None else expand_id(value)


_OPTIONAL_ID_SCHEMA = core_schema.no_info_after_validator_function(
    _command_id_in,
    core_schema.str_schema(),
    serialization=core_schema.plain_serializer_function_ser_schema(
        _command_id_out, return_schema=core_schema.str_schema()
    ),
)
OptionalCompactId = Annotated[
    int | str | None, GetPydanticSchema(lambda _t, _h: _OPTIONAL_ID_SCHEMA)
]
"""A ``CompactId`` or None: the command an outcome answers, None for one no command caused
(the follow-up's expiry, a poll's observation). On the wire (and in the JSON Schema) it is
always a string, ``""`` for None: the form the record has always had, which older workers
read."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """Compact result of one command: enough to re-send its reply and events identically."""

    # The docstring is the schema's description. ``cid`` and ``rid`` are the command and
    # request ids in ``compact_id``'s form (``command_id``, ``request_id`` on the wire): read
    # them as strings through the properties of those names, compare them compacted. ``cid``
    # is None for an outcome no command caused.
    cid: Annotated[OptionalCompactId, Field(alias="command_id")]
    http_status: int
    status: Interned
    auth_status: Interned
    version: int
    at: SharedTimestamp
    rid: Annotated[CompactId | None, Field(alias="request_id")] = None
    code: Interned | None = None
    numeric_code: int | None = None
    previous_status: Interned | None = None
    changed: bool = False

    @property
    def command_id(self) -> str | None:
        return None if self.cid is None else expand_id(self.cid)

    @property
    def request_id(self) -> str | None:
        return None if self.rid is None else expand_id(self.rid)


@dataclass(frozen=True, slots=True)
class AccountRecord:
    """Latest auth record of one account on auth.state; the worker owning its partition is
    the single writer. Slotted, not a pydantic model: the store keeps one per account in
    memory, where a model instance costs several times the bytes; pydantic still validates
    and serialises it via a TypeAdapter.
    """

    account_id: str
    workspace_id: Interned
    status: Interned
    auth_status: Interned
    version: int
    updated_at: RecordTimestamp
    provider: Interned | None = None
    provider_account_ref: str | None = None
    deregistered: bool = False
    in_flight: InFlight | None = None
    follow_up: FollowUp | None = None
    recent: tuple[Outcome, ...] = ()
    type: Literal["account_state"] = "account_state"
    schema_version: Literal[1] = SCHEMA_VERSION


_record_adapter: TypeAdapter[AccountRecord] = TypeAdapter(AccountRecord)


def decode_record(value: bytes) -> AccountRecord:
    """Decode an ``auth.state`` value; raises ``ValidationError`` (the restore loop counts it)."""
    # The context lets equal timestamps share one object (worker.contract.shared_timestamps).
    return _record_adapter.validate_json(value, context={})


def encode_record(record: AccountRecord) -> bytes:
    return _record_adapter.dump_json(record, by_alias=True)


# --------------------------------------------------------------------------------------------
# Decoding commands
# --------------------------------------------------------------------------------------------


# ``misrouted``: a command forwarded to its key's home partition that still arrived elsewhere
# (the partition count changed between the two hops); forwarding again could ping-pong.
DecodeReason = Literal[
    "too_large", "not_json", "not_object", "unknown_type", "invalid", "key_mismatch", "misrouted"
]
DECODE_REASONS: tuple[str, ...] = get_args(DecodeReason)


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """Why a record could not become a command, plus whatever ids could still be read from it.

    ``reason`` is a low-cardinality label for metrics and the DLQ header; ``detail`` is for
    humans and the error event's message.
    """

    reason: DecodeReason
    detail: str
    account_id: str | None = None
    workspace_id: str | None = None
    command_id: str | None = None
    request_id: str | None = None


_ID_RE = re.compile(ID_PATTERN)


def valid_id(value: str) -> bool:
    """The identifier rule (``ID_PATTERN``), matched against the whole value."""
    return _ID_RE.fullmatch(value) is not None


def _readable_id(obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    return value if isinstance(value, str) and valid_id(value) else None


def validation_problems(exc: ValidationError, whole: str = "value") -> list[str]:
    """Each error of ``exc`` as ``where: why`` (``whole`` where it is the whole input), never
    the value: it may hold a secret or be anything at all."""
    return [
        f"{'.'.join(str(part) for part in err['loc']) or whole}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)
    ]


def decode_command(key: bytes | None, value: bytes | None) -> Command | DecodeFailure:
    """Bytes → typed command, or a precise failure; never raises, whatever the bytes."""
    try:
        return _decode_command(key, value)
    except Exception as exc:  # a net under the checks below: any bytes must give an answer
        return DecodeFailure("invalid", f"undecodable: {type(exc).__name__}")


def _decode_command(key: bytes | None, value: bytes | None) -> Command | DecodeFailure:
    if value is None:
        return DecodeFailure("not_json", "record has no value")
    if len(value) > MAX_RECORD_BYTES:
        return DecodeFailure("too_large", f"record is {len(value)} bytes, limit {MAX_RECORD_BYTES}")
    # The common case in one pass of pydantic's JSON parser; anything it rejects takes the
    # path below, which names the failure exactly as before.
    try:
        fast = _command_adapter.validate_json(value)
    except ValidationError:
        pass
    else:
        if key == fast.account_id.encode():
            return fast
    try:
        # pydantic's parser bounds nesting depth (a ValueError past it), where json.loads
        # would raise RecursionError on a deeply nested array.
        obj = from_json(value)
    except ValueError as exc:
        return DecodeFailure("not_json", f"value is not UTF-8 JSON: {str(exc)[:120]}")
    if not isinstance(obj, dict):
        return DecodeFailure("not_object", "value is not a JSON object")
    ids = {
        n: _readable_id(obj, n) for n in ("account_id", "workspace_id", "command_id", "request_id")
    }
    if obj.get("type") not in COMMAND_TYPES:
        return DecodeFailure("unknown_type", f"unknown command type {obj.get('type')!r:.80}", **ids)
    try:
        command = _command_adapter.validate_python(obj)
    except ValidationError as exc:
        return DecodeFailure("invalid", validation_problems(exc)[0], **ids)
    if key != command.account_id.encode():
        # Without the right key the record may sit in another account's partition, and
        # per-account order could not be guaranteed.
        return DecodeFailure("key_mismatch", "record key differs from the body's account_id", **ids)
    return command


def json_schemas() -> dict[str, dict[str, Any]]:
    """Every published schema by file name, for ``make schemas`` and the drift test."""
    models: dict[str, Any] = {
        "command.schema.json": _command_adapter,
        "reply.schema.json": TypeAdapter(Reply),
        "auth-status-changed.schema.json": TypeAdapter(AuthStatusChanged),
        "auth-error.schema.json": TypeAdapter(AuthError),
        "account-state.schema.json": _record_adapter,
    }
    return {name: adapter.json_schema() for name, adapter in models.items()}
