"""The dispatcher's state store: the delivery states of the accounts whose partitions this
process owns, restored from the delivery-state changelog topic on assignment.

One record per account (key: account id, co-partitioned with auth.status and auth.errors),
holding a ``DeliveryState`` per endpoint. Each endpoint's queue head has a timer keyed
``endpoint/account`` (``delivery.state_key``), so the consume loop's timer sweep hands a due
retry to that pair's lane, and a failing endpoint never holds up another.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from worker.store import PartitionedStore
from worker.webhooks.delivery import DeliveryState, state_key


class AccountDeliveries(BaseModel):
    """The value on the delivery-state topic."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_account_deliveries"] = "webhook_account_deliveries"
    schema_version: Literal[1] = 1
    account_id: str
    workspace_id: str
    endpoints: dict[str, DeliveryState] = {}

    def of(self, endpoint_id: str) -> DeliveryState:
        held = self.endpoints.get(endpoint_id)
        if held is not None:
            return held
        return DeliveryState(
            endpoint_id=endpoint_id, account_id=self.account_id, workspace_id=self.workspace_id
        )

    def with_state(self, state: DeliveryState) -> AccountDeliveries:
        return self.model_copy(update={"endpoints": {**self.endpoints, state.endpoint_id: state}})


def decode_deliveries(value: bytes) -> AccountDeliveries:
    """Raises ``pydantic.ValidationError`` for anything else."""
    return AccountDeliveries.model_validate_json(value)


class DeliveryStore(PartitionedStore[AccountDeliveries]):
    """Delivery states by account, and a timer per (endpoint, account) whose queue waits."""

    @staticmethod
    def decode(value: bytes) -> tuple[str, AccountDeliveries]:
        record = decode_deliveries(value)
        return record.account_id, record

    def key_of(self, record: AccountDeliveries) -> str:
        return record.account_id

    def _arm(self, partition: int, record: AccountDeliveries) -> None:
        for endpoint_id, state in record.endpoints.items():
            key = state_key(endpoint_id, record.account_id)
            due = state.due_at()
            if due is None:
                self.timers.cancel(key)
            else:
                self.timers.arm(key, partition, due)

    def _timer_keys(self, record: AccountDeliveries) -> list[str]:
        return [state_key(e, record.account_id) for e in record.endpoints]
