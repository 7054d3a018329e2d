"""The front-end's read model of auth.state, behind ``GET /v1/accounts/{account_id}/auth``.

Every replica tails all partitions of auth.state from the beginning (group-less, see
``worker.tail``) into a dict ``account_id → AccountView``; the last record of an account
wins, as in the worker's own restore. Deregistered accounts and tombstones are removed, so
they answer 404 like unknown ones. Only the four fields the route needs are kept (about 200
bytes per account), not the whole record, and only those are decoded and validated
(``decode_state_summary``).

Read-your-writes. The worker writes an account's state record, and waits for its ack, before
it replies; the reply carries the record's version. When this replica answers a POST it
remembers (``remember``) the account's status at that version until the view itself has read
that far, and ``lookup`` never answers with an older version than it remembers. So a GET right
after a POST on the same replica shows the POST's outcome or something newer; another replica
converges as soon as its tail reads the state record (docs/architecture.md, "Guarantees").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from worker.logs import get_logger
from worker.messages import decode_state_summary
from worker.tail import TopicTail

log = get_logger(__name__)


#: Remembered own writes, at most: the oldest are forgotten first (they are the likeliest to
#: have been read by the view already).
REMEMBERED_MAX: Final = 100_000


@dataclass(frozen=True, slots=True)
class AccountView:
    """What the polling route returns about one account, plus its owner and version."""

    workspace_id: str
    status: str
    auth_status: str
    deregistered: bool = False
    version: int = 0


class AuthStateView(TopicTail):
    """Replica-local map of every live account's status, kept current from auth.state.

    ``consumer`` is an unstarted, group-less consumer; the view starts and closes it.
    ``caught_up`` is true once the records present at start-up were applied.
    """

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        idle_timeout_ms: int = 200,
        max_records: int = 5000,
    ) -> None:
        super().__init__(
            consumer,
            topic,
            name="auth-state-view",
            idle_timeout_ms=idle_timeout_ms,
            max_records=max_records,
        )
        self._accounts: dict[str, AccountView] = {}
        self._written: OrderedDict[str, AccountView] = OrderedDict()
        self.undecodable = 0

    def __len__(self) -> int:
        return len(self._accounts)

    def get(self, account_id: str) -> AccountView | None:
        """The account's entry, whichever workspace owns it (internal use)."""
        return self._accounts.get(account_id)

    def lookup(self, account_id: str, workspace_id: str) -> AccountView | None:
        """The account as seen by ``workspace_id``: ``None`` when unknown, deregistered or
        owned by another workspace (the caller can not tell these apart). Never older than
        what this replica remembered answering."""
        entry = self._accounts.get(account_id)
        written = self._written.get(account_id) if self._written else None
        if written is not None and (entry is None or entry.version < written.version):
            entry = written
        if entry is None or entry.workspace_id != workspace_id:
            return None
        return entry

    def remember(self, account_id: str, entry: AccountView) -> None:
        """A reply this replica answered: reads stay at least this new until the view is."""
        held = self._accounts.get(account_id)
        if held is not None and held.version >= entry.version:
            return
        self._written[account_id] = entry
        self._written.move_to_end(account_id)
        if len(self._written) > REMEMBERED_MAX:
            self._written.popitem(last=False)

    def handle(self, records: list[Any]) -> None:
        accounts = self._accounts
        for msg in records:
            if msg.value is None:  # tombstone from a compacting producer
                if msg.key:
                    accounts.pop(msg.key.decode("utf-8", "replace"), None)
                continue
            try:
                record = decode_state_summary(msg.value)
            except ValidationError:
                self.undecodable += 1
                log.error("state_record_undecodable", partition=msg.partition, offset=msg.offset)
                continue
            written = self._written.get(record.account_id) if self._written else None
            if written is not None and written.version <= record.version:
                del self._written[record.account_id]
            if record.deregistered:
                accounts.pop(record.account_id, None)
                continue
            accounts[record.account_id] = AccountView(
                workspace_id=record.workspace_id,
                status=record.status,
                auth_status=record.auth_status,
                version=record.version,
            )
