"""The AsyncAPI 3.0 document of the Kafka contract (``schemas/asyncapi.json``), for other teams'
tools, assembled from its messages, channels and operations."""

from __future__ import annotations

from typing import Any, Final

from worker.contract.topics import Topics, co_partitioned
from worker.documents.asyncapi.channels import all_channels, channel_object
from worker.documents.asyncapi.components import component_schemas
from worker.documents.asyncapi.messages import all_messages, message_object
from worker.documents.asyncapi.operations import ROLES, all_operations, operation_object
from worker.settings import DEFAULT_BOOTSTRAP

ASYNCAPI_VERSION: Final = "3.0.0"


def _default_topics() -> Topics:
    """The default topic names, whatever ``TOPIC_*`` says in this process's environment."""
    return Topics.model_construct()


def asyncapi_document() -> dict[str, Any]:
    """The whole document, deterministic (the drift test compares it byte for byte)."""
    topics = _default_topics()
    addresses: dict[str, str] = topics.model_dump()
    field_of = {address: field for field, address in addresses.items()}
    groups = co_partitioned(topics)
    channels = {c.field: c for c in all_channels()}
    channel_objects = {}
    for field, c in channels.items():
        address = addresses[field]
        partners = [a for g in groups if address in g for a in g if a != address]
        channel_objects[field] = channel_object(c, address, partners)
    assert set(field_of.values()) == set(channels), "every topic needs a channel"
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:passkey-auth-worker:kafka",
        "info": {
            "title": "Passkey auth-flow: Kafka contract",
            "version": "1.0.0",
            "description": "Every topic of the passkey auth-flow worker, its front-end and the "
            "webhook dispatcher: keys, headers, payloads and who sends or receives them. "
            'Generated from the code (`make schemas`); docs/architecture.md, "Topics and '
            'messages", explains the design. Values are UTF-8 JSON with `type` and '
            "`schema_version`; adding optional fields is compatible, renaming is not. Topic "
            "names are settings (`TOPIC_*`): the addresses here are the defaults.",
            "license": {"name": "Apache-2.0"},
            "tags": [{"$ref": f"#/components/tags/{role}"} for role in ROLES],
        },
        "defaultContentType": "application/json",
        "servers": {
            "production": {
                "host": "{bootstrap}",
                "protocol": "kafka",
                "description": "The production cluster (`KAFKA_BOOTSTRAP_SERVERS`).",
                "variables": {
                    "bootstrap": {
                        "default": "kafka.example.internal:9092",
                        "description": "A bootstrap server of the cluster (placeholder).",
                    }
                },
            },
            "development": {
                "host": DEFAULT_BOOTSTRAP,
                "protocol": "kafka",
                "description": "The development broker of `make run`.",
            },
        },
        "channels": channel_objects,
        "operations": {o.id: operation_object(o, channels) for o in all_operations()},
        "components": {
            "schemas": component_schemas(),
            "messages": {m.id: message_object(m) for m in all_messages()},
            "tags": {role: {"name": role, "description": text} for role, text in ROLES.items()},
        },
    }
