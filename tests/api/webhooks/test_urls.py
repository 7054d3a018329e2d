"""The published form of a webhook ``url`` and the server agree (no broker, no server).

The document states the form as a ``pattern`` (``worker.api.webhooks.urls``); the handlers
enforce that pattern after ``validate_url``. So a URL the document calls valid must pass
``validate_url`` (its address aside, which the policy judges), and its JSON Schema validator
must agree with Python's reading of the pattern: both are checked on a thousand URLs drawn
from the pattern itself, as a fuzzer draws them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.api.webhooks.urls import url_form_allowed, url_pattern
from worker.documents.openapi.document import openapi_document
from worker.webhooks.targets import TargetPolicy, url_rejection

COMMITTED = Path(__file__).resolve().parents[3] / "schemas" / "openapi.json"
#: Private targets allowed: what remains of ``validate_url`` is the form alone (and the
#: addresses no policy lifts, which the pattern leaves out).
LAX_HTTPS = TargetPolicy(allow_http=False, allow_private=True)
LAX_HTTP = TargetPolicy(allow_http=True, allow_private=True)


def _url_schema(doc: dict[str, Any], body: str) -> dict[str, Any]:
    url: dict[str, Any] = doc["components"]["schemas"][body]["properties"]["url"]
    return url


def _validator(schema: dict[str, object]) -> jsonschema_rs.Validator:
    return jsonschema_rs.validator_for(schema, validate_formats=True)


@pytest.mark.parametrize("allow_http", [False, True])
def test_every_url_of_the_published_form_passes_the_server_check(allow_http: bool) -> None:
    pattern = url_pattern(allow_http=allow_http)
    policy = LAX_HTTP if allow_http else LAX_HTTPS
    validator = _validator({"type": "string", "format": "uri", "pattern": pattern})
    refused: list[tuple[str, str | None, bool]] = []

    @settings(
        max_examples=500,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.from_regex(pattern, fullmatch=True))
    def check(url: str) -> None:
        reason = url_rejection(url, policy)
        if (
            reason is not None
            or not validator.is_valid(url)
            or not url_form_allowed(url, allow_http=allow_http)
        ):
            refused.append((url, reason, validator.is_valid(url)))

    check()
    assert refused == []


GOOD = [
    "https://hooks.example.com/in",
    "https://hooks.example.com:8443/in?token=abc&x=1#frag",
    "https://a.b-c.example/p%20q/~user/",
    "https://EXAMPLE.com/",
    "https://x_y.example.com/",
    "https://8.8.8.8/hook",
    "https://[2606:4700::1111]/hook",
    "https://[2a00:1450:4001:82b::200e]:443/",
    "https://" + ".".join(["a" * 63] * 3) + ".com/",  # 195 characters of name
]
BAD = [
    "0",
    "/relative",
    "https://",
    "https:///path",
    "hooks.example.com/in",
    "ftp://hooks.example.com/",
    "HTTPS://hooks.example.com/",
    "https://user:pw@hooks.example.com/",
    "https://hooks.example.com:0/",
    "https://hooks.example.com:65536/",
    "https://hooks.example.com:08443/",
    "https://hooks..example.com/",
    "https://-hooks.example.com/",
    "https://hooks.example.com./",
    "https://hooks.example.123/",
    "https://127.1/",
    "https://0x7f.0.0.1/",
    "https://2130706433/",
    "https://0.0.0.0/",
    "https://224.0.0.1/",
    "https://255.255.255.255/",
    "https://1.2.3.4.5/",
    "https://[::1]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[2002:7f00:1::]/",  # 6to4 around 127.0.0.1
    "https://[2001::1]/",  # Teredo
    "https://[fe80::1%25eth0]/",
    "https://bücher.example/",
    "https://hooks.example.com/a b",
    "https://hooks.example.com/{id}",
    "https://hooks.example.com/%zz",
    "https://hooks.example.com/\n",
    "https://hooks.example.com\n",
    "https://" + ".".join(["a" * 63] * 4) + ".com/",  # 259 characters of name
]


@pytest.mark.parametrize("url", GOOD)
def test_urls_of_the_form(url: str) -> None:
    assert url_form_allowed(url, allow_http=False), url
    assert url_rejection(url, LAX_HTTPS) is None, url


@pytest.mark.parametrize("url", BAD)
def test_urls_not_of_the_form(url: str) -> None:
    """Refused by the form, whatever ``validate_url`` says of them: many of these it would
    accept (an upper-case scheme, a trailing dot, an IDN, a space or a newline in the path)."""
    assert not url_form_allowed(url, allow_http=True), url
    assert not _validator({"type": "string", "pattern": url_pattern(allow_http=True)}).is_valid(
        url
    ), url


def test_http_only_where_the_policy_allows_it() -> None:
    assert not url_form_allowed("http://hooks.example.com/", allow_http=False)
    assert url_form_allowed("http://hooks.example.com/", allow_http=True)


def test_the_document_states_the_form_and_the_length() -> None:
    """The committed document (production defaults: https only) and a document served under
    a lax policy state the pattern the handlers enforce for that policy."""
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    for doc, allow_http in (
        (committed, False),
        (openapi_document(policy=TargetPolicy(allow_http=True, allow_private=True)), True),
    ):
        for body in ("CreateEndpointBody", "UpdateEndpointBody"):
            url = _url_schema(doc, body)
            assert url["type"] == "string"
            assert url["format"] == "uri"
            assert url["pattern"] == url_pattern(allow_http=allow_http)
            assert url["maxLength"] == 2048
            assert url["minLength"] == 1
