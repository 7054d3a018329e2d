"""Each endpoint's share of the dispatcher (``worker.dispatcher.endpoint_gate``), without I/O: the
cap on attempts in flight, the line of waiting pairs and its wakes, backing off as a whole, and
the rate limit."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from worker.dispatcher.endpoint_gate import (
    MAX_PARK_S,
    WAKE_HOLD_S,
    Admission,
    EndpointGate,
    GateConfig,
)

NOW = 1_800_000_000.0


class Wakes:
    """The gate's waker: records (partition, key, at); ``gone`` keys answer False."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, float]] = []
        self.gone: set[str] = set()

    def __call__(self, partition: int, key: str, at: float) -> bool:
        if key in self.gone:
            return False
        self.calls.append((partition, key, at))
        return True

    @property
    def keys(self) -> list[str]:
        return [key for _, key, _ in self.calls]


def gate(wakes: Wakes, **config: float) -> EndpointGate:
    values: dict[str, float] = {"max_in_flight": 2, "backoff_after": 3, "park_s": 10.0}
    values.update(config)
    return EndpointGate(
        GateConfig(**values),  # type: ignore[arg-type]
        wake=wakes,
        rng=random.Random(1),
    )


def admit(
    g: EndpointGate,
    key: str,
    now: float = NOW,
    *,
    rate: int | None = None,
    revision: int = 1,
    workspace: str = "",
) -> Admission:
    endpoint = key.partition("/")[0]
    return g.admit(
        endpoint,
        revision=revision,
        rate_limit=rate,
        partition=0,
        key=key,
        now=now,
        workspace_id=workspace,
    )


def test_an_endpoint_holds_at_most_its_share_and_waiting_pairs_come_in_turn() -> None:
    wakes = Wakes()
    g = gate(wakes)
    assert admit(g, "ep_1/a").admitted and admit(g, "ep_1/b").admitted
    c = admit(g, "ep_1/c")
    assert (c.admitted, c.reason) == (False, "capacity")
    assert c.until > NOW, "a fallback time, in case no wake comes"
    assert not admit(g, "ep_1/d").admitted
    assert g.waiting("ep_1") == 2
    assert wakes.calls == []

    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.calls == [(0, "ep_1/c", NOW + 1)], "the first in line, woken at once"
    assert not admit(g, "ep_1/e", NOW + 1.1).admitted, "a newcomer does not take c's slot"
    assert admit(g, "ep_1/c", NOW + 1.2).admitted
    g.release("ep_1", ok=True, now=NOW + 2)
    assert wakes.keys == ["ep_1/c", "ep_1/d"], "then d, then e: first come, first served"
    assert admit(g, "ep_1/d", NOW + 2.1).admitted
    assert admit(g, "ep_1/f", NOW + 2.2).reason == "capacity", "c and d under way"


def test_other_endpoints_are_not_held_up() -> None:
    g = gate(Wakes())
    for key in ("ep_1/a", "ep_1/b"):
        assert admit(g, key).admitted
    assert not admit(g, "ep_1/c").admitted
    other = g.admit("ep_2", revision=1, rate_limit=None, partition=0, key="ep_2/a", now=NOW)
    assert other.admitted


def test_a_workspace_holds_at_most_its_share_over_all_its_endpoints() -> None:
    """Many endpoints of one workspace (each hanging) hold no more than the workspace's share;
    a slot one of them frees wakes a pair of another; other workspaces are not held up."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=2, workspace_max_in_flight=3)

    def try_(endpoint: str, pair: str, workspace: str = "ws_evil", now: float = NOW) -> bool:
        return admit(g, f"{endpoint}/{pair}", now, workspace=workspace).admitted

    admitted = [try_(ep, p) for ep in ("ep_1", "ep_2", "ep_3") for p in ("a", "b")]
    assert admitted.count(True) == 3, admitted  # not 3 endpoints x 2
    assert try_("ep_9", "a", workspace="ws_victim")
    g.release("ep_1", ok=False, now=NOW + 1)
    assert len(wakes.calls) == 1, "one slot freed, one pair woken"
    _, woken, _ = wakes.calls[0]
    endpoint, _, pair = woken.partition("/")
    assert try_(endpoint, pair, now=NOW + 1.1)
    assert not try_("ep_1", "z", now=NOW + 1.2)


def test_a_wake_that_goes_nowhere_passes_on_to_the_next() -> None:
    wakes = Wakes()
    g = gate(wakes, max_in_flight=1)
    assert admit(g, "ep_1/a").admitted
    for key in ("ep_1/b", "ep_1/c"):
        assert not admit(g, key).admitted
    wakes.gone.add("ep_1/b")  # its partition went to another process
    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_1/c"]
    assert g.waiting("ep_1") == 1

    # a woken pair that has nothing to do any more gives its wake on
    assert not admit(g, "ep_1/d", NOW + 1.1).admitted
    g.forget("ep_1", "ep_1/c", NOW + 1.2)
    assert wakes.keys == ["ep_1/c", "ep_1/d"]


def test_a_woken_pair_that_does_not_come_frees_its_slot_in_time() -> None:
    wakes = Wakes()
    g = gate(wakes, max_in_flight=1)
    assert admit(g, "ep_1/a").admitted
    assert not admit(g, "ep_1/b").admitted
    g.release("ep_1", ok=True, now=NOW + 1)
    assert not admit(g, "ep_1/c", NOW + 1.5).admitted, "b's slot is held for it"
    assert admit(g, "ep_1/c", NOW + 10).admitted, "b never came: the hold expired"


def test_a_pair_whose_wake_ran_out_is_first_in_line_again() -> None:
    """A woken pair leaves the line for its wake; when the wake runs out unused, the pair is
    back at the front (before those that came after it) and counts as waiting throughout."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=1)
    assert admit(g, "ep_1/a").admitted
    for key in ("ep_1/b", "ep_1/c", "ep_1/d"):
        assert not admit(g, key).admitted
    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_1/b"]
    assert g.waiting("ep_1") == 3, "b, woken, is still waiting for its attempt"
    late = NOW + 1 + WAKE_HOLD_S + 0.5
    assert not admit(g, "ep_1/e", late).admitted, "those in line go first"
    assert wakes.keys == ["ep_1/b", "ep_1/b"], "b again, not c: its wake ran out, not its turn"
    assert admit(g, "ep_1/b", late + 0.1).admitted
    for n, key in enumerate(("ep_1/c", "ep_1/d", "ep_1/e"), start=2):
        g.release("ep_1", ok=True, now=late + n)
        assert wakes.keys[-1] == key
        assert admit(g, key, late + n + 0.1).admitted
    assert g.waiting("ep_1") == 0


def test_a_pair_whose_wake_ran_out_is_woken_again_by_the_next_release() -> None:
    """Alone in line, its wake run out unused: the next attempt that ends wakes it again
    (found by ``Lines``: the wake was looked for only among pairs never woken)."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=2)
    assert admit(g, "ep_1/a").admitted and admit(g, "ep_1/b").admitted
    assert not admit(g, "ep_1/c").admitted
    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_1/c"]
    g.release("ep_1", ok=True, now=NOW + 1 + WAKE_HOLD_S + 0.1)
    assert wakes.keys == ["ep_1/c", "ep_1/c"], "woken again, not left to its fallback time"


def test_a_wake_at_one_endpoint_counts_against_its_workspace_while_another_comes_and_goes() -> None:
    """A pair woken at one endpoint holds its workspace's slot while another endpoint of the
    workspace is admitted, ends and is forgotten (found by ``WorkspaceLines``: the wake was
    dropped from the workspace's count with the other endpoint's entry)."""
    g = gate(Wakes(), max_in_flight=2, workspace_max_in_flight=3)

    def try_(key: str) -> bool:
        return admit(g, key, NOW, workspace="ws").admitted

    assert try_("ep_1/a") and try_("ep_1/b") and not try_("ep_1/c")
    g.release("ep_1", ok=True, now=NOW)  # c woken: ep_1/a and c's wake hold two of three
    assert try_("ep_2/a")
    g.release("ep_2", ok=True, now=NOW)  # ep_2 at rest: its entry goes
    assert try_("ep_2/a")
    assert not try_("ep_2/b"), "the workspace's third slot is ep_2/a's; c's wake holds one"


def test_a_failing_endpoint_backs_off_as_a_whole_then_probes_one_at_a_time() -> None:
    wakes = Wakes()
    g = gate(wakes, max_in_flight=4, backoff_after=3, backoff_base_s=1.0, backoff_max_s=8.0)
    now = NOW
    for key in ("a", "b", "c"):
        assert admit(g, f"ep_1/{key}", now).admitted
    for _ in range(3):
        g.release("ep_1", ok=False, now=now)
    assert g.failing_since("ep_1") == now
    first = admit(g, "ep_1/d", now + 0.1)
    second = admit(g, "ep_1/e", now + 0.1)
    assert (first.admitted, first.reason, first.until) == (False, "backoff", now + 1.0)
    assert second.reason == "backoff" and second.until > now + 1.0, "only the first probes"

    probe = admit(g, "ep_1/d", now + 1.0)
    assert probe.admitted
    assert not admit(g, "ep_1/e", now + 1.0).admitted, "one attempt at a time while failing"
    g.release("ep_1", ok=False, now=now + 2.0)
    assert admit(g, "ep_1/e", now + 2.5).until == now + 2.0 + 2.0, "the pause doubles"
    assert wakes.calls[-1] == (0, "ep_1/e", now + 4.0), "the next probe is woken for its end"

    # many failures: the pause stops at its maximum
    for step in range(10):
        at = now + 100 * (step + 1)
        assert admit(g, "ep_1/e", at).admitted
        g.release("ep_1", ok=False, now=at)
    assert admit(g, "ep_1/f", now + 1001).until == now + 1000 + 8.0

    assert not admit(g, "ep_1/e", now + 1010).admitted, "f is first in line"
    assert admit(g, "ep_1/f", now + 1010).admitted
    assert g.failing_since("ep_1") == now, "failing as a whole since the first failure"
    g.release("ep_1", ok=True, now=now + 1010)
    g.forget("ep_1", "ep_1/e", now + 1010)
    assert g.failing_since("ep_1") is None
    assert all(admit(g, f"ep_1/n{i}", now + 1011).admitted for i in range(4)), "full share again"


def test_retry_after_pauses_the_endpoint_and_a_changed_endpoint_starts_afresh() -> None:
    g = gate(Wakes(), backoff_max_s=60.0)
    assert admit(g, "ep_1/a").admitted
    g.release("ep_1", ok=False, now=NOW, retry_after_s=30.0)
    assert admit(g, "ep_1/b", NOW + 1).until == NOW + 30.0
    assert admit(g, "ep_1/b", NOW + 2, revision=2).admitted, "a new URL: no pause inherited"

    assert admit(g, "ep_1/c", NOW + 3, revision=2).admitted
    g.release("ep_1", ok=False, now=NOW + 3, retry_after_s=86_400.0)
    assert admit(g, "ep_1/d", NOW + 4, revision=2).until == NOW + 3 + 60.0, "bounded"


def test_the_rate_limit_spaces_attempts() -> None:
    wakes = Wakes()
    g = gate(wakes, max_in_flight=10)
    assert admit(g, "ep_1/a", rate=2).admitted
    assert admit(g, "ep_1/b", rate=2).admitted
    late = admit(g, "ep_1/c", rate=2)
    assert (late.admitted, late.reason) == (False, "rate")
    assert late.until == pytest.approx(NOW + 0.5)
    assert admit(g, "ep_1/c", NOW + 0.5, rate=2).admitted
    assert not admit(g, "ep_1/d", NOW + 0.5, rate=2).admitted
    g.release("ep_1", ok=True, now=NOW + 0.6)
    assert wakes.calls[-1][2] == pytest.approx(NOW + 1.0), "woken for the next token"


def test_a_long_line_waits_longer_for_its_fallback_but_bounded() -> None:
    g = gate(Wakes(), max_in_flight=1, park_s=10.0)
    assert admit(g, "ep_1/head").admitted
    waits = [admit(g, f"ep_1/{i}").until - NOW for i in range(2000)]
    assert waits[0] < 40.0
    assert waits[-1] > 1000.0, "the back of the line does not come back all at once"
    assert max(waits) <= MAX_PARK_S * 1.5


def test_endpoints_created_and_deleted_leave_a_bounded_gate() -> None:
    """A workspace that creates an endpoint, has it fail (so the gate notes failures that
    keep its entry), and deletes it, again and again: the gate holds what the registry and
    the busy endpoints need, not one entry per endpoint ever attempted."""
    registry: set[str] = set()
    g = EndpointGate(
        GateConfig(max_in_flight=2, backoff_after=3),
        wake=Wakes(),
        rng=random.Random(1),
        known=registry.__contains__,
    )
    for i in range(1000):
        endpoint = f"ep_{i}"
        registry.add(endpoint)
        now = NOW + i
        assert admit(g, f"{endpoint}/a", now, workspace="ws_churn").admitted
        g.release(endpoint, ok=False, now=now)
        registry.discard(endpoint)  # deleted: no attempt under way, no pair will come back
    assert len(g._endpoints) <= 64, len(g._endpoints)
    assert sum(map(len, g._workspace_endpoints.values())) <= 64


def test_an_idle_endpoint_keeps_what_it_learnt_and_a_forgotten_one_starts_as_new() -> None:
    """Dropping an entry never changes what the gate decides: an endpoint with failures in a
    row keeps them (it backs off at the third failure whenever it comes, whatever else was
    swept meanwhile); one that has nothing (no failure, full bucket) is dropped and comes back
    as it was."""
    registry = {"ep_1", "ep_2", *(f"ep_x{i}" for i in range(300))}
    g = EndpointGate(
        GateConfig(max_in_flight=2, backoff_after=3),
        wake=Wakes(),
        rng=random.Random(1),
        known=registry.__contains__,
    )
    for step in range(2):
        assert admit(g, f"ep_1/a{step}", NOW + step).admitted
        g.release("ep_1", ok=False, now=NOW + step)
    # many other endpoints come and go (each one sweep-worthy), ep_1 idle meanwhile
    for i in range(300):
        g.admit(
            f"ep_x{i}",
            revision=1,
            rate_limit=None,
            partition=0,
            key="k",
            now=NOW + 2,
            workspace_id="",
        )
        g.release(f"ep_x{i}", ok=True, now=NOW + 2)
    assert g.failing_since("ep_1") == NOW, "its failures in a row are kept"
    assert admit(g, "ep_1/b", NOW + 3).admitted
    g.release("ep_1", ok=False, now=NOW + 3)
    assert admit(g, "ep_1/c", NOW + 3).reason == "backoff", "the third failure backs it off"
    assert len(g._endpoints) == 1, "endpoints with nothing to remember are gone"

    # a rate-limited endpoint is kept while its bucket refills, then dropped
    assert admit(g, "ep_2/a", NOW, rate=1).admitted
    g.release("ep_2", ok=True, now=NOW)
    assert "ep_2" in g._endpoints, "its bucket is not full yet"
    assert not admit(g, "ep_2/b", NOW + 0.5, rate=1).admitted, "the rate limit still holds"


class CountingEntries(dict[str, object]):
    """The gate's endpoint entries, counting how often one is looked up."""

    lookups = 0

    def __getitem__(self, key: str) -> object:
        self.lookups += 1
        return super().__getitem__(key)

    def get(self, key: str, default: object = None) -> object:
        self.lookups += 1
        return super().get(key, default)


def test_a_release_in_a_workspace_of_a_thousand_endpoints_looks_at_a_few() -> None:
    """A workspace at its share with a pair waiting at each of a thousand endpoints: a slot
    freed wakes one pair, and finding it looks at a few endpoints' entries, not every
    endpoint's once per endpoint (which made a big workspace's fan-out crawl)."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=2, workspace_max_in_flight=4)

    def try_(endpoint: str, now: float = NOW) -> bool:
        return admit(g, f"{endpoint}/a", now, workspace="ws_big").admitted

    admitted = [try_(f"ep_{i:04}") for i in range(1000)]
    assert admitted.count(True) == 4
    g._endpoints = entries = CountingEntries(g._endpoints)  # type: ignore[assignment]
    g.release("ep_0000", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_0004/a"], "one slot freed, the next in line woken"
    assert entries.lookups < 100, entries.lookups
    assert try_("ep_0004", NOW + 1.1)


def test_a_woken_pair_that_does_not_come_frees_its_workspaces_slot_in_time() -> None:
    """A pair woken at one endpoint that never comes (its partition went elsewhere) holds the
    workspace's slot at most ``WAKE_HOLD_S``, even when nothing touches its endpoint again."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=2, workspace_max_in_flight=3)

    def try_(endpoint: str, now: float = NOW) -> bool:
        return admit(g, f"{endpoint}/a", now, workspace="ws_a").admitted

    assert all(try_(ep) for ep in ("ep_1", "ep_2", "ep_3"))
    assert not try_("ep_4")
    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_4/a"]
    assert not try_("ep_5", NOW + 1.5), "ep_4's pair holds the slot it was woken for"
    assert try_("ep_5", NOW + 1 + WAKE_HOLD_S + 1), "it never came: the workspace's slot is free"


def test_a_release_looks_only_at_endpoints_with_pairs_in_line() -> None:
    """Forty endpoints of one workspace each with an attempt under way and nobody in line:
    a release looks at none of the others (it sorted and read every endpoint of the
    workspace that ever had an attempt, per release)."""
    wakes = Wakes()
    g = gate(wakes, max_in_flight=1, workspace_max_in_flight=64)
    for i in range(40):
        ep = f"ep_{i:02}"
        assert admit(g, f"{ep}/a", workspace="ws").admitted
    g._endpoints = entries = CountingEntries(g._endpoints)  # type: ignore[assignment]
    g.release("ep_00", ok=True, now=NOW + 1)
    assert entries.lookups < 5, entries.lookups
    assert wakes.calls == []


def test_a_new_pair_at_a_full_endpoint_is_lined_up_as_admit_would() -> None:
    """``line_up`` puts a new pair of an endpoint at its cap in line without a slot asked
    (``admit`` decides anything else): it is woken in its turn and then admitted."""
    wakes = Wakes()
    g = gate(wakes)

    def line_up(key: str, now: float = NOW, revision: int = 1) -> float | None:
        return g.line_up("ep_1", revision, "", 0, key, now)

    assert line_up("ep_1/a") is None, "no entry: admit decides"
    assert admit(g, "ep_1/a").admitted
    assert line_up("ep_1/b") is None, "room for one more"
    assert admit(g, "ep_1/b").admitted
    assert line_up("ep_1/c", revision=2) is None, "a changed endpoint: admit decides"
    c = line_up("ep_1/c")
    assert c is not None and c > NOW, "until when it waits, in case no wake comes"
    assert g.line_up("ep_1", 1, "ws_other", 0, "ep_1/c", NOW) is None, "another workspace's"
    assert g.waiting("ep_1") == 1
    assert not admit(g, "ep_1/d").admitted, "d queues behind c"
    g.release("ep_1", ok=True, now=NOW + 1)
    assert wakes.keys == ["ep_1/c"], "c, lined up first, is woken first"
    assert admit(g, "ep_1/c", NOW + 1.1).admitted


class Lines(RuleBasedStateMachine):
    """Random asks, ends, forgets and clock steps at ``ENDPOINTS`` of one workspace, two slots
    each and ``SHARE`` for the workspace: every pair refused and still asking is in its
    endpoint's line exactly once (waiting, or woken), slots and wakes stay within the caps, and
    an attempt that ends leaves no room while a pair waits unwoken."""

    ENDPOINTS: tuple[str, ...] = ("ep_1",)
    SHARE = 48  # the default workspace's share: not reached by one endpoint

    def __init__(self) -> None:
        super().__init__()
        self.gate = gate(Wakes(), max_in_flight=2, workspace_max_in_flight=self.SHARE)
        self.now = NOW
        self.running: list[str] = []  # pairs holding a slot
        self.asking: set[str] = set()  # pairs refused, neither admitted since nor forgotten

    @rule(data=st.data(), pair=st.sampled_from("abcdef"))
    def ask(self, data: st.DataObject, pair: str) -> None:
        key = f"{data.draw(st.sampled_from(self.ENDPOINTS))}/{pair}"
        if key in self.running:
            return
        if admit(self.gate, key, self.now, workspace="ws").admitted:
            self.running.append(key)
            self.asking.discard(key)
        else:
            self.asking.add(key)

    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        if not self.running:
            return
        key = data.draw(st.sampled_from(self.running))
        self.running.remove(key)
        self.gate.release(key.partition("/")[0], ok=True, now=self.now)
        live = [e for ep in self.ENDPOINTS if (e := self.gate._endpoints.get(ep)) is not None]
        busy = sum(e.in_flight + len(e.woken) for e in live)
        for e in live:
            if e.waiters:
                full = e.in_flight + len(e.woken) == 2
                assert full or busy == self.SHARE, "room left while pairs wait unwoken"

    @rule(pair=st.sampled_from("abcdef"))
    def forget(self, pair: str) -> None:
        for key in [k for k in self.asking if k.endswith(f"/{pair}")][:1]:
            self.asking.discard(key)
            self.gate.forget(key.partition("/")[0], key, self.now)

    @rule(seconds=st.sampled_from([0.1, 1.0, WAKE_HOLD_S + 0.1]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def every_asking_pair_is_in_its_line_once(self) -> None:
        busy = 0
        for endpoint in self.ENDPOINTS:
            e = self.gate._endpoints.get(endpoint)
            waiting = set() if e is None else set(e.waiters)
            woken = set() if e is None else set(e.woken)
            assert not waiting & woken
            assert waiting | woken == {k for k in self.asking if k.startswith(endpoint + "/")}
            if e is not None:
                assert e.in_flight == sum(k.startswith(endpoint + "/") for k in self.running)
                assert e.in_flight + len(e.woken) <= 2
                busy += e.in_flight + len(e.woken)
        assert busy <= self.SHARE
        assert sum(self.gate.waiting(ep) for ep in self.ENDPOINTS) == len(self.asking)


class WorkspaceLines(Lines):
    """The same at two endpoints whose workspace has three slots."""

    ENDPOINTS = ("ep_1", "ep_2")
    SHARE = 3


STATEFUL = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestLines = Lines.TestCase
TestLines.settings = STATEFUL
TestWorkspaceLines = WorkspaceLines.TestCase
TestWorkspaceLines.settings = STATEFUL
