"""The form check of a webhook ``url`` costs time linear in the URL (issue 31, "Bounded
resources", row 5).

Running the published pattern on a whole URL backtracks quadratically on a run of ``?`` that
ends in a character it refuses (``https://a.example/`` + 2,029 ``?`` + a space: ~110 ms per
create on main). ``url_form_allowed`` decides the same as the pattern (checked here against
the pattern itself on generated strings) and runs the pattern on the authority alone, never
more than 259 characters of it; the adversarial URLs cost time proportional to their length
(a 4x longer one costs well under 16x as much, which is what quadratic costs), and through
the real front-end the adversarial URL costs what a harmless URL of the same length does.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.support import headers, running_api
from tests.api.test_api_http import assert_error
from tests.api.webhooks.test_routes import ENDPOINTS
from worker.api.webhooks import urls
from worker.api.webhooks.urls import url_form_allowed, url_pattern
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

#: Strings a backtracking engine may take quadratic (or worse) time to refuse, by length n.
ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "query marks then a space": lambda n: "https://a.example/" + "?" * n + " ",
    "slashes then a space": lambda n: "https://a.example/" + "/" * n + " ",
    "alternating / and ?": lambda n: "https://a.example/" + "/?" * (n // 2) + " ",
    "percent signs": lambda n: "https://a.example/" + "%" * n,
    "escapes then a bad one": lambda n: "https://a.example/" + "%41" * (n // 3) + "%4",
    "fragment of query marks": lambda n: "https://a.example/#" + "?" * n + "#",
    "a long host": lambda n: "https://" + "a." * (n // 2) + "com/",
    "a long host of hyphens": lambda n: "https://a" + "-" * n + "/",
    "a long port": lambda n: "https://a.example:" + "1" * n + "/",
    "a long bracketed host": lambda n: "https://[" + "2:" * (n // 2) + "]/",
}


def _reference(url: str, *, allow_http: bool) -> bool:
    """The published pattern, run whole (fast enough on the short strings drawn here)."""
    return re.fullmatch(url_pattern(allow_http=allow_http), url) is not None


# -- the same decisions as the pattern -------------------------------------------------------

PIECES = st.sampled_from(
    [
        "https://",
        "http://",
        "HTTPS://",
        "a",
        "Z",
        "0",
        "9",
        "_",
        "-",
        ".",
        ":",
        "/",
        "?",
        "#",
        "%",
        "%4",
        "%41",
        "%zz",
        "[",
        "]",
        "@",
        "~",
        "'",
        " ",
        "\n",
        "ü",
        "a.example",
        "example.com",
        "8.8.8.8",
        "255.1.2.3",
        "[2606:4700::1111]",
        "[2001::1]",
        ":443",
        ":65536",
        ":0",
        "123",
    ]
)


@pytest.mark.parametrize("allow_http", [False, True])
def test_the_check_decides_as_the_pattern_on_generated_strings(allow_http: bool) -> None:
    pattern = url_pattern(allow_http=allow_http)
    disagreements: list[str] = []

    @settings(
        max_examples=1000,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.one_of(
            st.lists(PIECES, max_size=12).map("".join),
            st.builds(
                lambda scheme, parts: scheme + "".join(parts),
                st.sampled_from(["https://", "http://"]),
                st.lists(PIECES, max_size=10),
            ),
            st.from_regex(pattern, fullmatch=True),
            st.tuples(st.from_regex(pattern, fullmatch=True), st.integers(0, 40), PIECES).map(
                lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
            ),
        )
    )
    def check(url: str) -> None:
        if url_form_allowed(url, allow_http=allow_http) != _reference(url, allow_http=allow_http):
            disagreements.append(url)

    check()
    assert disagreements == []


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_the_adversarial_strings_are_decided_as_the_pattern_decides(shape: str) -> None:
    url = ADVERSARIAL[shape](60)
    for allow_http in (False, True):
        assert url_form_allowed(url, allow_http=allow_http) == _reference(
            url, allow_http=allow_http
        ), url


# -- linear work ------------------------------------------------------------------------------


class _Recording:
    """Stands in for the authority pattern and records the length of what it is run on."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.lengths: list[int] = []

    def fullmatch(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        end = len(text) if endpos is None else endpos
        self.lengths.append(end - pos)
        return self.pattern.fullmatch(text, pos, end)


def test_the_pattern_only_ever_runs_on_a_bounded_authority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the URL's length, the pattern sees at most 259 characters (a 253-character
    name and a port); everything else is looked at by single passes over the string."""
    recording = _Recording(urls._AUTHORITY)
    monkeypatch.setattr(urls, "_AUTHORITY", recording)
    for make in ADVERSARIAL.values():
        for allow_http in (False, True):
            url_form_allowed(make(8192), allow_http=allow_http)
    assert recording.lengths, "the authority pattern never ran"
    assert max(recording.lengths) <= 253 + len(":65535")


def _best_seconds(url: str, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        url_form_allowed(url, allow_http=True)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_the_work_grows_linearly_with_the_length(shape: str) -> None:
    """A 4x longer adversarial URL costs less than 8x as much (the best of 7 runs each):
    linear work costs ~4x, quadratic backtracking 16x (main: 30 ms at 1,024 ``?``, 577 ms at
    4,096, 2.2 s at 8,192)."""
    make = ADVERSARIAL[shape]
    short, long = _best_seconds(make(2048)), _best_seconds(make(8192))
    assert long < 8 * short + 50e-6, (shape, short, long)


# -- through the front-end -------------------------------------------------------------------


@pytest.mark.integration
async def test_an_adversarial_url_costs_the_front_end_what_a_harmless_one_does(
    api_settings: Callable[..., Settings],
) -> None:
    """The attacker's create: a 2,048-character URL (the longest the API takes) of 2,029
    ``?`` and a space, refused ``url_form_not_allowed``; its median cost over 7 creates stays
    within 3x that of a same-length URL of letters refused the same way (main: ~110 ms
    against ~2 ms)."""
    adversarial = "https://a.example/" + "?" * 2029 + " "
    harmless = "https://a.example/" + "a" * 2029 + " "
    assert len(adversarial) == len(harmless) == 2048
    async with (
        running_api(api_settings(webhook_secrets_key=generate_key())) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):

        async def create(url: str) -> float:
            start = time.perf_counter()
            resp = await http.post(ENDPOINTS, json={"url": url}, headers=headers())
            elapsed = time.perf_counter() - start
            message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
            assert "url_form_not_allowed" in message, message
            return elapsed

        await create(harmless)  # warm up the route
        costs: dict[str, list[float]] = {"adversarial": [], "harmless": []}
        for _ in range(7):
            costs["harmless"].append(await create(harmless))
            costs["adversarial"].append(await create(adversarial))
        medians = {name: statistics.median(values) for name, values in costs.items()}
        assert medians["adversarial"] < 3 * medians["harmless"] + 0.005, medians
