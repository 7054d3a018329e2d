"""The OpenAPI document: committed copy without drift, the statuses the contract names, and
examples that agree with the error catalogue and the document's own schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from schemathesis.core.result import Ok

from worker.api.bodies import ApiHealth, ApiReadiness, AuthResponse, ErrorResponse
from worker.api.cors import ALLOW_HEADERS, ALLOW_METHODS, CORS_MAX_AGE_S
from worker.api.event_types import EVENT_TYPES_PATH
from worker.api.methods import allow_value
from worker.api.portal.tokens import in_portal_scope
from worker.api.routes import ACCOUNT_AUTH, PASSKEY_CONFIRM
from worker.api.webhooks.delivery_routes import WEBHOOK_DELIVERY, WEBHOOK_RESEND, WEBHOOK_TEST
from worker.api.webhooks.follow_routes import (
    ACCOUNT_EVENTS,
    FOLLOW_ROUTES,
    WEBHOOK_REPLAY_CANCEL,
    WEBHOOK_REPLAY_STATUS,
)
from worker.api.webhooks.quotas import ENDPOINT_QUOTA, TOO_MANY, EndpointLimits
from worker.api.webhooks.routes import (
    WEBHOOK_ACTIVATE,
    WEBHOOK_DEACTIVATE,
    WEBHOOK_DELIVERIES,
    WEBHOOK_ENDPOINT,
    WEBHOOK_ENDPOINTS,
    WEBHOOK_EXPIRE_PREVIOUS,
    WEBHOOK_REPLAY,
    WEBHOOK_ROTATE,
)
from worker.contract.catalogue import ServiceError, entry
from worker.contract.messages import ID_PATTERN
from worker.documents.export import documents
from worker.documents.openapi.document import openapi_document

COMMITTED = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"
REGENERATE = (
    '.venv/bin/python -c "from worker.documents.export import write_all; from pathlib import Path;'
    " write_all(Path('schemas'))\""
)


def test_committed_document_has_no_drift() -> None:
    assert COMMITTED.exists(), f"schemas/openapi.json missing; run {REGENERATE}"
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == openapi_document(), (
        f"schemas/openapi.json drifted from worker/documents/openapi/; run {REGENERATE}"
    )
    assert COMMITTED.read_text(encoding="utf-8") == documents()["openapi.json"]


def test_document_is_deterministic() -> None:
    assert json.dumps(openapi_document()) == json.dumps(openapi_document())


def test_shape_servers_and_security() -> None:
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0"
    assert doc["servers"] == [{"url": "http://127.0.0.1:8080"}]
    assert doc["components"]["securitySchemes"]["ApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-Api-Key",
        "description": "Server-side workspace API key; selects the workspace.",
    }
    post = doc["paths"][PASSKEY_CONFIRM]["post"]
    get = doc["paths"][ACCOUNT_AUTH]["get"]
    assert post["security"] == get["security"] == [{"ApiKey": []}]
    assert set(post["responses"]) == {
        "200", "400", "401", "404", "408", "409", "429", "500", "501", "502"
    }  # fmt: skip
    assert set(get["responses"]) == {"200", "400", "401", "404", "429", "500"}
    # The service extensions: 429 on every operation with a key, 408 where a body is read.
    for path, item in doc["paths"].items():
        for method, op in item.items():
            keyed = {"ApiKey": []} in op["security"]
            assert ("429" in op["responses"]) == keyed, (method, path)
            assert ("408" in op["responses"]) == ("requestBody" in op or op is post), (method, path)
    retry_after = post["responses"]["429"]["headers"]["Retry-After"]
    assert retry_after["schema"] == {"type": "integer", "minimum": 1}
    for route in (PASSKEY_CONFIRM, ACCOUNT_AUTH):
        options = doc["paths"][route]["options"]
        assert set(options["responses"]) == {"204", "403", "404"}
        assert options["security"] == []
    for name in ("AccountId", "EndpointId"):
        schema = doc["components"]["parameters"][name]["schema"]
        assert schema["pattern"] == ID_PATTERN
        assert (schema["minLength"], schema["maxLength"]) == (1, 128)


def _responses(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (path, method, status, response)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        for status, response in op["responses"].items()
    ]


def test_every_response_documents_x_request_id() -> None:
    doc = openapi_document()
    header = doc["components"]["headers"]["X-Request-Id"]
    assert header["required"] is True
    for path, method, status, response in _responses(doc):
        assert response["headers"]["X-Request-Id"] == {
            "$ref": "#/components/headers/X-Request-Id"
        }, (path, method, status)


def _resolver_schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}


def test_error_examples_match_catalogue_and_schema() -> None:
    doc = openapi_document()
    error_schema = _resolver_schema(doc, "ErrorResponse")
    seen = 0
    for path, method, status, response in _responses(doc):
        content = response.get("content", {}).get("application/json")
        if content is None or path in ("/healthz", "/readyz"):
            continue
        if status.startswith("2"):
            if "example" in content:  # against its own answer's schema
                ok_schema = {**content["schema"], "components": doc["components"]}
                jsonschema_rs.validate(ok_schema, content["example"])
            continue
        assert content["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
        assert content["examples"], (path, method, status)
        for example in content["examples"].values():
            value = example["value"]
            jsonschema_rs.validate(error_schema, value)
            err = value["error"]
            row = entry(err["code"], int(status))
            assert row.http_status == int(status)
            ServiceError(err["code"], err["numeric_code"], int(status), err["message"])
            assert f"`{err['code']}`" in response["description"]
            seen += 1
    assert seen >= 20


def test_error_schema_rejects_extra_fields() -> None:
    doc = openapi_document()
    schema = _resolver_schema(doc, "ErrorResponse")
    good = {
        "request_id": "r",
        "error": {"code": "not_found", "numeric_code": 10001, "message": "m"},
    }
    jsonschema_rs.validate(schema, good)
    for bad in (
        {**good, "data": {}},
        {"request_id": "r", "error": {**good["error"], "extra": 1}},  # type: ignore[dict-item]
        {"request_id": "r", "error": {"code": "x", "numeric_code": 999, "message": "m"}},
    ):
        with pytest.raises(jsonschema_rs.ValidationError):
            jsonschema_rs.validate(schema, bad)


def test_schemathesis_accepts_the_document() -> None:
    import schemathesis

    schema = schemathesis.openapi.from_dict(openapi_document())
    operations = [op.ok() for op in schema.get_all_operations() if isinstance(op, Ok)]
    labels = {op.label for op in operations}
    assert labels == {
        f"POST {PASSKEY_CONFIRM}",
        f"OPTIONS {PASSKEY_CONFIRM}",
        f"GET {ACCOUNT_AUTH}",
        f"OPTIONS {ACCOUNT_AUTH}",
        f"GET {EVENT_TYPES_PATH}",
        f"OPTIONS {EVENT_TYPES_PATH}",
        "GET /healthz",
        "GET /readyz",
        *WEBHOOK_OPERATIONS,
        *(f"OPTIONS {path}" for path in WEBHOOK_PATHS),
        "POST /v1/portal-sessions",
        "DELETE /v1/portal-sessions",
        "OPTIONS /v1/portal-sessions",
        "DELETE /v1/portal-sessions/{session_id}",
        "OPTIONS /v1/portal-sessions/{session_id}",
        f"GET {WEBHOOK_REPLAY_STATUS}",
        f"POST {WEBHOOK_REPLAY_CANCEL}",
        f"GET {ACCOUNT_EVENTS}",
        *(f"OPTIONS {path}" for path in FOLLOW_ROUTES),
    }


WEBHOOK_PATHS = (
    WEBHOOK_ENDPOINTS,
    WEBHOOK_ENDPOINT,
    WEBHOOK_DEACTIVATE,
    WEBHOOK_ACTIVATE,
    WEBHOOK_ROTATE,
    WEBHOOK_EXPIRE_PREVIOUS,
    WEBHOOK_DELIVERIES,
    WEBHOOK_REPLAY,
    WEBHOOK_DELIVERY,
    WEBHOOK_RESEND,
    WEBHOOK_TEST,
)
WEBHOOK_OPERATIONS = {
    f"POST {WEBHOOK_ENDPOINTS}": {"201", "400", "401", "409", "500"},
    f"GET {WEBHOOK_ENDPOINTS}": {"200", "401", "500"},
    f"GET {WEBHOOK_ENDPOINT}": {"200", "400", "401", "404", "500"},
    f"PATCH {WEBHOOK_ENDPOINT}": {"200", "400", "401", "404", "500"},
    f"DELETE {WEBHOOK_ENDPOINT}": {"204", "400", "401", "404", "500"},
    f"POST {WEBHOOK_DEACTIVATE}": {"200", "400", "401", "404", "500"},
    f"POST {WEBHOOK_ACTIVATE}": {"200", "400", "401", "404", "500"},
    f"POST {WEBHOOK_ROTATE}": {"200", "400", "401", "404", "500"},
    f"POST {WEBHOOK_EXPIRE_PREVIOUS}": {"200", "400", "401", "404", "500"},
    f"GET {WEBHOOK_DELIVERIES}": {"200", "400", "401", "404", "500"},
    f"POST {WEBHOOK_REPLAY}": {"202", "400", "401", "404", "500"},
    f"GET {WEBHOOK_DELIVERY}": {"200", "400", "401", "404", "500"},
    f"POST {WEBHOOK_RESEND}": {"202", "400", "401", "404", "500"},
    f"POST {WEBHOOK_TEST}": {"202", "400", "401", "404", "500"},
}


def test_webhook_operations_and_their_500s() -> None:
    """Each webhook route lists its statuses and exactly its one catalogued 500."""
    doc = openapi_document()
    five_hundreds = {}
    for label, statuses in WEBHOOK_OPERATIONS.items():
        method, path = label.split(" ", 1)
        op = doc["paths"][path][method.lower()]
        # The front door's 408/429 are checked for every operation in
        # test_shape_servers_and_security.
        assert set(op["responses"]) - {"408", "429"} == statuses, label
        # The portal's routes take a portal session token besides the key.
        portal = in_portal_scope(method, path)
        assert op["security"] == [{"ApiKey": []}, *([{"PortalSession": []}] if portal else [])]
        five_hundreds[label] = set(
            op["responses"]["500"]["content"]["application/json"]["examples"]
        )
    assert five_hundreds == {
        f"POST {WEBHOOK_ENDPOINTS}": {"create_webhook_endpoint_failed"},
        f"GET {WEBHOOK_ENDPOINTS}": {"list_webhook_endpoints_failed"},
        f"GET {WEBHOOK_ENDPOINT}": {"get_webhook_endpoint_failed"},
        f"PATCH {WEBHOOK_ENDPOINT}": {"update_webhook_endpoint_failed"},
        f"DELETE {WEBHOOK_ENDPOINT}": {"delete_webhook_endpoint_failed"},
        f"POST {WEBHOOK_DEACTIVATE}": {"deactivate_webhook_endpoint_failed"},
        f"POST {WEBHOOK_ACTIVATE}": {"update_webhook_endpoint_failed"},
        f"POST {WEBHOOK_ROTATE}": {"update_webhook_endpoint_failed"},
        f"POST {WEBHOOK_EXPIRE_PREVIOUS}": {"update_webhook_endpoint_failed"},
        f"GET {WEBHOOK_DELIVERIES}": {"get_webhook_endpoint_failed"},
        f"POST {WEBHOOK_REPLAY}": {"update_webhook_endpoint_failed"},
        f"GET {WEBHOOK_DELIVERY}": {"get_webhook_endpoint_failed"},
        f"POST {WEBHOOK_RESEND}": {"update_webhook_endpoint_failed"},
        f"POST {WEBHOOK_TEST}": {"update_webhook_endpoint_failed"},
    }


def test_document_states_the_constants_and_models_the_code_uses() -> None:
    """Generated, not copied: the preflight headers are the CORS constants and the body
    schemas are the response models' own JSON Schemas."""
    doc = openapi_document()
    headers = doc["paths"][ACCOUNT_AUTH]["options"]["responses"]["204"]["headers"]
    assert headers["Access-Control-Allow-Methods"]["schema"]["const"] == ALLOW_METHODS
    assert headers["Access-Control-Allow-Headers"]["schema"]["const"] == ALLOW_HEADERS
    assert headers["Access-Control-Max-Age"]["schema"]["const"] == str(CORS_MAX_AGE_S)
    schemas = doc["components"]["schemas"]
    for model in (AuthResponse, ErrorResponse, ApiHealth, ApiReadiness):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schema.pop("$defs", None)
        assert schemas[model.__name__] == schema, model.__name__


def test_the_replay_quota_refusal_is_429_with_retry_after() -> None:
    doc = openapi_document()
    refused = doc["paths"][WEBHOOK_REPLAY]["post"]["responses"]["429"]
    assert set(refused["content"]["application/json"]["examples"]) == {TOO_MANY}
    assert refused["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}
    assert "WEBHOOK_REPLAYS_PER_WORKSPACE" in refused["description"]


def test_the_endpoint_quota_is_409_not_500() -> None:
    """A limit, not a fault: the quota's refusal is its own 409 (a service extension), and
    the create's 500 no longer speaks of it."""
    doc = openapi_document()
    responses = doc["paths"][WEBHOOK_ENDPOINTS]["post"]["responses"]
    refused = responses["409"]
    assert set(refused["content"]["application/json"]["examples"]) == {ENDPOINT_QUOTA}
    assert "WEBHOOK_ENDPOINTS_PER_WORKSPACE" in refused["description"]
    assert "quota" not in responses["500"]["description"]
    assert entry(ENDPOINT_QUOTA).extension


def test_options_states_allow_and_optional_preflight_headers() -> None:
    """Every path with OPTIONS documents the ``Allow`` the front door answers (from the same
    function), and the preflight headers as optional: without them OPTIONS is plain, 204."""
    doc = openapi_document()
    for path, item in doc["paths"].items():
        if "options" not in item:
            assert path in ("/healthz", "/readyz"), path
            continue
        options = item["options"]
        allow = options["responses"]["204"]["headers"]["Allow"]
        assert allow["required"] is True
        assert allow["schema"]["const"] == allow_value(m.upper() for m in item), path
        for parameter in options["parameters"]:
            if parameter["in"] == "header":
                assert parameter["required"] is False, (path, parameter)
            else:  # the path's id is not checked by OPTIONS
                assert parameter["schema"] == {"type": "string", "minLength": 1}, path
        cors = options["responses"]["204"]["headers"]
        assert not any(cors[h]["required"] for h in cors if h.startswith("Access-Control"))
    assert "405 `method_not_allowed` (90003" in doc["info"]["description"]


def test_links_lead_from_an_endpoint_to_every_operation_on_it() -> None:
    """The stateful phase of a fuzzer (and a client) follows these: create, get, change,
    rotate → the same endpoint's other operations, by its ``data.id``."""
    doc = openapi_document()
    by_id = {
        op["operationId"]: (path, op) for path, item in doc["paths"].items() for op in item.values()
    }
    on_one = {
        op_id
        for op_id, (path, op) in by_id.items()
        if path.startswith(WEBHOOK_ENDPOINT)
        and "{replay_id}" not in path  # reached from a replay's answer (below)
        and not op_id.startswith("preflight")
        and "{delivery_id}" not in path
    }
    assert len(on_one) == 10
    for op_id, status in (
        ("createWebhookEndpoint", "201"),
        ("getWebhookEndpoint", "200"),
        ("updateWebhookEndpoint", "200"),
        ("rotateWebhookEndpointSecret", "200"),
    ):
        links = by_id[op_id][1]["responses"][status]["links"]
        assert {link["operationId"] for link in links.values()} == on_one, op_id
        for link in links.values():
            assert link["parameters"] == {"endpoint_id": "$response.body#/data/id"}
    replay_links = by_id["replayWebhookEvents"][1]["responses"]["202"]["links"]
    assert {link["operationId"] for link in replay_links.values()} == {
        "getWebhookReplay",
        "cancelWebhookReplay",
    }


def test_links_lead_from_a_test_send_to_its_delivery_and_its_resend() -> None:
    """create → test → the log → one delivery → resend: the stateful phase's chain; each link
    to one delivery carries both its endpoint id and its delivery id."""
    doc = openapi_document()
    test = doc["paths"][WEBHOOK_TEST]["post"]["responses"]["202"]["links"]
    listed = doc["paths"][WEBHOOK_DELIVERIES]["get"]["responses"]["200"]["links"]
    one = doc["paths"][WEBHOOK_DELIVERY]["get"]["responses"]["200"]["links"]
    for links, pointer, endpoint in (
        (test, "/data/delivery_id", "$response.body#/data/endpoint_id"),
        (listed, "/data/0/delivery_id", "$request.path.endpoint_id"),
        (one, "/data/delivery_id", "$request.path.endpoint_id"),
    ):
        assert links["GetWebhookDelivery"]["operationId"] == "getWebhookDelivery"
        assert links["ResendWebhookDelivery"]["parameters"] == {
            "endpoint_id": endpoint,
            "delivery_id": f"$response.body#{pointer}",
        }
        assert links["ListWebhookDeliveries"]["operationId"] == "listWebhookDeliveries"


def _pointer(value: Any, pointer: str) -> Any:
    """``value`` at a JSON pointer (``KeyError``/``IndexError`` when it is not there)."""
    for token in pointer.lstrip("/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    return value


def _schema_at(doc: dict[str, Any], schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    """The schema of the value at a JSON pointer into a body of ``schema`` (``$ref`` and a
    nullable ``anyOf`` followed; fails when the pointer leads nowhere)."""

    def plain(node: dict[str, Any]) -> dict[str, Any]:
        while True:
            if "$ref" in node:
                node = _pointer(doc, node["$ref"].removeprefix("#"))
            elif "anyOf" in node:
                (node,) = (n for n in node["anyOf"] if n.get("type") != "null")
            else:
                return node

    node = plain(schema)
    for token in pointer.lstrip("/").split("/"):
        node = plain(node["items"] if token.isdigit() else node["properties"][token])
    return node


def test_every_link_resolves() -> None:
    """Every link names an existing operation and only parameters that operation takes, all of
    its required path parameters; every ``$request.path.*`` is a path parameter of the source,
    and every ``$response.body#...`` points at a value in the source answer's example (so a
    client or the stateful fuzzer following it finds something there)."""
    doc = openapi_document()

    def parameters(op: dict[str, Any]) -> list[dict[str, Any]]:
        found = []
        for parameter in op.get("parameters", []):
            if "$ref" in parameter:
                parameter = _pointer(doc, parameter["$ref"].removeprefix("#"))
            found.append(parameter)
        return found

    by_id = {
        op["operationId"]: op
        for item in doc["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    seen = 0
    for item in doc["paths"].values():
        for source in item.values():
            if not isinstance(source, dict):
                continue
            source_path = {p["name"] for p in parameters(source) if p["in"] == "path"}
            for status, response in source.get("responses", {}).items():
                for name, link in response.get("links", {}).items():
                    seen += 1
                    where = (source["operationId"], status, name)
                    target = by_id.get(link["operationId"])
                    assert target is not None, where
                    taken = {p["name"]: p for p in parameters(target)}
                    given = link["parameters"]
                    assert set(given) <= set(taken), where
                    required = {n for n, p in taken.items() if p["in"] == "path"}
                    assert required <= set(given), where
                    for expression in given.values():
                        if expression.startswith("$request.path."):
                            assert expression.removeprefix("$request.path.") in source_path
                            continue
                        assert expression.startswith("$response.body#"), where
                        pointer = expression.removeprefix("$response.body#")
                        body = response["content"]["application/json"]
                        assert _schema_at(doc, body["schema"], pointer)["type"] == "string"
                        if "example" in body:
                            value = _pointer(body["example"], pointer)
                            assert isinstance(value, str) and value, where
    assert seen > 40


def _limits_of(doc: dict[str, Any], body: str) -> tuple[int, int, int]:
    props = doc["components"]["schemas"][body]["properties"]
    (text,) = (b for b in props["description"]["anyOf"] if b.get("type") == "string")
    (array,) = (b for b in props["event_types"]["anyOf"] if b.get("type") == "array")
    return props["url"]["maxLength"], text["maxLength"], array["maxItems"]


def test_the_body_schemas_state_the_configured_limits() -> None:
    """The committed document states the settings' defaults; a front-end configured
    otherwise publishes its own limits."""
    defaults = openapi_document()
    for body in ("CreateEndpointBody", "UpdateEndpointBody"):
        assert _limits_of(defaults, body) == (2048, 512, 16)
    custom = openapi_document(
        EndpointLimits(url_max_chars=300, description_max_chars=40, event_types_max_items=2)
    )
    for body in ("CreateEndpointBody", "UpdateEndpointBody"):
        assert _limits_of(custom, body) == (300, 40, 2)
    assert defaults == openapi_document()  # building a custom document changed nothing shared
