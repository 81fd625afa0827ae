"""Held-turn order (``scheduler/core/order.py``): the caller order (S5 in-flight counts,
or B3's virtual token counters) and the batch run order (arrival, or B2's attained
service), each rule by example, VTC's service-gap bound and liveness under every order
as Hypothesis properties over random histories.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from _core_host import CoreHost
from hypothesis import given, settings
from hypothesis import strategies as st
from immutables import Map

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    EndpointKind,
    Params,
    ServiceClass,
    TurnAbandoned,
    TurnFinished,
    TurnRequested,
    initial_state,
    order,
)
from luftpause.scheduler.core.state import HeldTurn, free_lane, pin_lane
from luftpause.scheduler.core.view import run_status, status

GEN = EndpointKind.GENERATIVE
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH
# No ramp, no decode pace: the cap a probe sets is the only limit.
BASE = Params(initial_cap=None, queue_probes=1, interactive_pace_s=None)
VTC = replace(BASE, fairness="tokens")
ATTAINED = replace(BASE, batch_order="attained")


class Host(CoreHost):
    """Feeds ``decide`` one replica's events, checking the invariants after each."""

    def __init__(self, params: Params, cap: int = 1, replicas: int = 1) -> None:
        super().__init__(params, cap, replicas)

    def req(
        self, turn: str, run: str, caller: str = "c", cls: ServiceClass = BAT
    ) -> tuple[str, ...]:
        actions = self(TurnRequested(self.t, turn, run, "m", cls, caller, GEN, "dp"))
        return tuple(a.turn_id for a in actions if isinstance(a, Admit))

    def finish(
        self,
        turn: str,
        prompt: int = 0,
        reply: int = 0,
        cached: int = 0,
        paused: bool = False,
    ) -> tuple[str, ...]:
        actions = self(
            TurnFinished(
                self.t,
                turn,
                paused_on_tool=paused,
                prompt_tokens=prompt,
                completion_tokens=reply,
                cached_tokens=cached,
            )
        )
        self.admitted.pop(turn, None)
        return tuple(a.turn_id for a in actions if isinstance(a, Admit))


# ------------------------------------------------------------- caller order


def _caller_race(params: Params) -> tuple[str, ...]:
    """alice is served 2000 weighted tokens, bob 30; then, with one turn each in flight,
    alice's older held turn and bob's compete for a freed slot: who gets it."""
    host = Host(params, cap=3)
    assert host.req("a1", "ra1", "alice") == ("a1",)
    assert host.req("b1", "rb1", "bob") == ("b1",)
    assert host.req("b2", "rb2", "bob") == ("b2",)
    host.req("a2", "ra2", "alice")  # held: full
    assert host.finish("a1", prompt=1000, reply=500) == ("a2",)  # the only one held
    host.req("a3", "ra3", "alice")  # held, older than bob's
    host.req("b3", "rb3", "bob")  # held
    if params.fairness == "tokens":
        assert dict(host.state.vtc) == {"alice": 2000.0, "bob": 0.0}
    else:
        assert dict(host.state.vtc) == {}  # no counters kept while the order is off
    return host.finish("b1", prompt=10, reply=10)  # one in flight each now


def test_in_flight_order_fewest_caller_turns_first_by_default() -> None:
    """S5 (default ``fairness = "in_flight"``): of two held turns whose callers have as
    many turns in flight, the older goes first, whatever tokens each caller was served."""
    assert _caller_race(BASE) == ("a3",)


def test_token_fairness_caller_with_least_tokens_first() -> None:
    """B3 (``fairness = "tokens"``): the held turn of the caller whose finished turns were
    served fewer weighted tokens goes first (alice: 1000 + 2 x 500 = 2000; bob: 30),
    the other caller's older turn notwithstanding."""
    assert _caller_race(VTC) == ("b3",)


def test_token_fairness_counter_weights() -> None:
    """B3: a finished turn advances its caller's counter by prompt_weight x prompt +
    completion_weight x completion tokens, over the caller's weight (1)."""
    params = replace(VTC, prompt_weight=0.5, completion_weight=3.0)
    assert order.turn_cost(params, "x", 100, 10) == 80.0
    assert order.turn_cost(VTC, "x", 100, 10) == 120.0  # VTC's defaults, 1 and 2
    assert order.caller_weight(VTC, "anyone") == 1.0
    host = Host(params, cap=1)
    host.req("a1", "ra1", "alice")
    host.req("a2", "ra2", "alice")  # held: alice stays active
    host.finish("a1", prompt=100, reply=10)
    assert dict(host.state.vtc) == {"alice": 80.0}


def test_token_fairness_returning_caller_lifted_to_least_active_counter() -> None:
    """B3 (VTC's lift): a caller with nothing held or in flight starts from the least
    counter of the callers that have, so time away earns it no credit; its counter is
    dropped while it has nothing (bounded state)."""
    host = Host(VTC, cap=2)
    host.req("a1", "ra1", "alice")
    host.req("b1", "rb1", "bob")
    host.req("a2", "ra2", "alice")  # held
    host.finish("a1", prompt=300)  # alice 300; a2 admitted
    host.finish("b1", prompt=700)  # bob 700, and now bob has nothing: dropped
    assert dict(host.state.vtc) == {"alice": 300.0}
    host.req("a3", "ra3", "alice")  # in flight
    host.finish("a2", prompt=100)  # alice 400
    assert host.req("c1", "rc1", "carol") == ("c1",)  # admitted at once: lifted all the same
    assert dict(host.state.vtc) == {"alice": 400.0, "carol": 400.0}
    host.req("b2", "rb2", "bob")  # held: lifted to the least active counter, not 700
    assert host.state.vtc["bob"] == 400.0
    assert status(host.state, host.t)["held_order"] == {
        "fairness": "tokens",
        "batch_order": "arrival",
        "caller_virtual_tokens": {"alice": 400.0, "bob": 400.0, "carol": 400.0},
    }
    host(TurnAbandoned(host.t, "b2"))  # bob leaves with nothing: dropped again
    assert "bob" not in host.state.vtc
    assert "bob" not in host.state.caller_held


def test_token_fairness_first_caller_starts_at_zero() -> None:
    """B3: with no active caller the lift is 0."""
    assert order.lift(initial_state((), VTC).vtc) == 0.0
    host = Host(VTC, cap=1)
    host.req("a1", "ra1", "alice")
    assert dict(host.state.vtc) == {"alice": 0.0}


# ---------------------------------------------------------------- batch order


def test_attained_order_run_with_least_service_first() -> None:
    """B2 (``batch_order = "attained"``): of one caller's held batch turns, the turn of
    the run with less attained service (its finished turns' uncached prompt and reply
    tokens) goes first, though the other run's turn is older; arrival order otherwise."""
    for params, first in ((ATTAINED, "new1"), (BASE, "old2")):
        host = Host(replace(params, keep_prefixes=False), cap=1)
        host.req("old1", "old")
        host.finish("old1", prompt=5000, cached=1000, reply=1000)  # 4000 + 1000 served
        if params.batch_order == "attained":
            assert run_status(host.state, "old", host.t)["attained_service"] == 5000.0  # type: ignore[index]
        host.req("x1", "x")  # in flight: the slot is taken
        host.req("old2", "old")  # held, older
        host.req("new1", "new")  # held, a run that attained nothing
        assert host.finish("x1") == (first,)


def test_attained_order_by_turn_time() -> None:
    """B2 with ``attained_measure = "time"``: a run's attained service is its finished
    turns' seconds from admission to end."""
    params = replace(ATTAINED, attained_measure="time", keep_prefixes=False)
    host = Host(params, cap=1)
    host.req("slow1", "slow")
    host.t = 30.0
    host.finish("slow1")
    status_run = run_status(host.state, "slow", host.t)
    assert status_run is not None
    assert status_run["attained_service"] == 30.0
    assert status_run["attained_measure"] == "time"
    host.req("x1", "x")
    host.req("slow2", "slow")
    host.req("fresh1", "fresh")
    assert host.finish("x1") == ("fresh1",)


def test_attained_order_keeps_prefix_lane_first_and_levels_discrete() -> None:
    """B2 composes after the prefix lane (a continuing run's turn before a new run's, at
    any service), and orders by service level: runs within one doubling of each other
    keep arrival order."""
    assert [order.tier(ATTAINED, x) for x in (0, 255, 256, 511, 512, 1e15)] == [
        0,
        0,
        1,
        1,
        2,
        order.MAX_TIER,
    ]
    host = Host(ATTAINED, cap=2)
    host.req("x0", "x")
    host.finish("x0", prompt=10_000, reply=1000)  # x: 12000 tokens served, idle
    assert host.req("x1", "x") == ("x1",)  # x generates on g0 from here
    assert host.req("x2", "x") == ("x2",)  # (two turns of it in flight: g0 is full)
    host.req("n1", "n")  # held in the free lane: a new run, attained nothing
    host.req("x3", "x")  # held in g0's own lane
    assert host.finish("x1") == ("x3",)  # own lane first, despite its 12000 tokens
    host.finish("x2")
    host.finish("x3")
    host.finish("n1")
    # runs u (300 tokens) and v (400) share a level: arrival order between them
    host.req("u1", "u")
    host.finish("u1", prompt=300)
    host.req("v1", "v")
    host.finish("v1", prompt=400)
    host.req("z1", "z")
    host.req("z2", "z")  # g0 full
    host.req("v2", "v")  # held, older
    host.req("u2", "u")  # held, less served but at the same level
    assert host.finish("z1") == ("v2",)


def test_attained_order_leaves_interactive_turns_in_arrival_order() -> None:
    """B2 orders the batch class only: interactive turns keep arrival order (and go
    before batch, S4)."""
    host = Host(replace(ATTAINED, keep_prefixes=False), cap=1)
    host.req("big1", "big", cls=INT)
    host.finish("big1", prompt=50_000, reply=5000)
    host.req("x1", "x", cls=INT)
    host.req("big2", "big", cls=INT)  # held, older
    host.req("new1", "new", cls=INT)  # held
    host.req("b1", "b")  # held batch
    assert host.finish("x1") == ("big2",)


# ------------------------------------------------------------------ the key


def _held(caller: str, seq: int, lane: tuple[str, ...], tier: int = 0) -> HeldTurn:
    return HeldTurn(
        f"t{seq}", f"run{seq}", "m", BAT, caller, GEN, "dp", 0.0, seq, lane, 0, "", tier
    )


OWN = pin_lane("g0")
FREE = free_lane(GEN, "m")


def test_held_key_orders_caller_then_prefix_lane_then_level_then_arrival() -> None:
    """S5, B2, prefix keeping: the key's parts, each deciding only where the ones before
    it tie; the level counts only for batch turns under the attained order."""
    in_flight: Map[str, int] = Map({"busy": 2})
    vtc: Map[str, float] = Map()
    key = order.held_key(ATTAINED, in_flight, Map(), vtc, BAT, True, OWN)
    # the caller with fewer turns in flight first, whatever else
    assert key(FREE, _held("idle", 9, FREE, tier=5)) < key(OWN, _held("busy", 1, OWN))
    # same caller: a turn whose run lives here (its own pin lane) before a new run's
    assert key(OWN, _held("c", 9, OWN, tier=5)) < key(FREE, _held("c", 1, FREE))
    # same lane: the lower level, then the older turn
    assert key(FREE, _held("c", 9, FREE, tier=0)) < key(FREE, _held("c", 1, FREE, tier=1))
    assert key(FREE, _held("c", 1, FREE, tier=1)) < key(FREE, _held("c", 2, FREE, tier=1))
    # interactive turns and the arrival order ignore the level
    for k in (
        order.held_key(ATTAINED, in_flight, Map(), vtc, INT, True, OWN),
        order.held_key(BASE, in_flight, Map(), vtc, BAT, True, OWN),
    ):
        assert k(FREE, _held("c", 1, FREE, tier=3)) < k(FREE, _held("c", 2, FREE, tier=0))
        assert k(FREE, _held("idle", 9, FREE)) < k(OWN, _held("busy", 1, OWN))
        assert k(OWN, _held("c", 9, OWN)) < k(FREE, _held("c", 1, FREE))


def test_held_key_reads_the_rank_the_options_name() -> None:
    """B3: token fairness ranks callers by their virtual counters on a generative
    replica, by turns in flight on a single-pass one; without prefix keeping the
    replica's own pin lane goes first no more."""
    in_flight: Map[str, int] = Map({"a": 3})
    vtc: Map[str, float] = Map({"a": 10.0, "b": 500.0})
    a, b = _held("a", 2, FREE), _held("b", 1, FREE)
    tokens = order.held_key(VTC, in_flight, Map(), vtc, BAT, True, OWN)
    assert tokens(FREE, a) < tokens(FREE, b)
    single_pass = order.held_key(VTC, in_flight, Map(), vtc, BAT, False, OWN)
    assert single_pass(FREE, b) < single_pass(FREE, a)
    by_flight = order.held_key(BASE, in_flight, Map(), vtc, BAT, True, OWN)
    assert by_flight(FREE, b) < by_flight(FREE, a)
    no_keep = order.held_key(
        replace(BASE, keep_prefixes=False), in_flight, Map(), vtc, BAT, True, OWN
    )
    assert no_keep(FREE, _held("c", 1, FREE)) < no_keep(OWN, _held("c", 2, OWN))


@settings(max_examples=200, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.sampled_from("abc"), st.booleans(), st.integers(0, 3)),
        min_size=2,
        max_size=12,
    ),
    fairness=st.sampled_from(["in_flight", "tokens"]),
    batch_order=st.sampled_from(["arrival", "attained"]),
    keep=st.booleans(),
    cls=st.sampled_from(ServiceClass),
)
def test_held_key_is_a_total_order(
    turns: list[tuple[str, bool, int]],
    fairness: str,
    batch_order: str,
    keep: bool,
    cls: ServiceClass,
) -> None:
    """Determinism: turns with distinct arrival numbers never tie, so the pick does not
    depend on the order the candidates are visited in."""
    params = replace(BASE, fairness=fairness, batch_order=batch_order, keep_prefixes=keep)
    key = order.held_key(params, Map({"a": 1}), Map(), Map({"b": 3.0}), cls, True, OWN)
    keys = [
        key(OWN if here else FREE, _held(caller, seq, OWN if here else FREE, tier))
        for seq, (caller, here, tier) in enumerate(turns)
    ]
    assert len(set(keys)) == len(keys)
    assert min(keys) == min(reversed(keys))


# ------------------------------------------------------ VTC's service-gap bound

PW, CW = 1.0, 2.0
MAX_PROMPT, MAX_REPLY = 400, 100
U = PW * MAX_PROMPT + CW * MAX_REPLY  # the most one turn advances a counter


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    cap=st.integers(1, 4),
    callers=st.integers(2, 3),
    steps=st.lists(
        st.tuples(
            st.integers(0, 10**6),  # which turn in flight ends
            st.integers(0, MAX_PROMPT),
            st.integers(0, MAX_REPLY),
            st.booleans(),  # paused on a tool
            st.integers(0, 2),  # extra turns its caller sends
        ),
        min_size=1,
        max_size=80,
    ),
)
def test_vtc_service_gap_bound(
    cap: int, callers: int, steps: list[tuple[int, int, int, bool, int]]
) -> None:
    """B3: the counter bound order.py proves. Callers kept backlogged (at least two held
    turns each, so that no event admits a caller's last one) on one replica of ``cap``
    slots: at every step, for every pair, c_f - c_g <= max(c_f(t1) - c_g(t1), 0) + M x U,
    with t1 the moment all are backlogged and M = cap (the most turns of f in flight)."""
    params = replace(VTC, prompt_weight=PW, completion_weight=CW, keep_prefixes=False)
    host = Host(params, cap=cap)
    names = [f"c{i}" for i in range(callers)]
    n = 0
    runs: dict[str, str] = {}  # turn -> run

    def send(caller: str) -> None:
        nonlocal n
        n += 1
        run = f"r{n % 7}-{caller}"  # some runs get several turns (pinned, then free)
        runs[f"t{n}"] = run
        host.req(f"t{n}", run, caller)

    def top_up() -> None:
        for caller in names:
            while host.state.caller_held.get(caller, 0) < 2:
                send(caller)

    top_up()
    start = dict(host.state.vtc)
    assert set(start) == set(names)
    for pick, prompt, reply, paused, extra in steps:
        live = sorted(host.admitted)
        turn = live[pick % len(live)]
        host.finish(turn, prompt, reply, paused=paused)
        for _ in range(extra):
            send(names[pick % callers])
        top_up()
        vtc = host.state.vtc
        for f in names:
            for g in names:
                if f != g:
                    slack = max(start[f] - start[g], 0.0) + cap * U
                    assert vtc[f] - vtc[g] <= slack + 1e-6, (f, g, dict(vtc))


# ------------------------------------------------------------ no starvation

ORDERS = [
    BASE,
    VTC,
    ATTAINED,
    replace(ATTAINED, attained_measure="time"),
    replace(VTC, batch_order="attained"),
]


@pytest.mark.parametrize(
    "params", ORDERS, ids=["in_flight", "tokens", "attained", "attained-time", "both"]
)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    cap=st.integers(1, 3),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["req", "req", "req", "finish", "finish", "abandon", "tick"]),
            st.integers(0, 10**6),
            st.booleans(),
        ),
        max_size=60,
    ),
)
def test_every_held_turn_is_admitted_or_abandoned(
    params: Params, cap: int, ops: list[tuple[str, int, bool]]
) -> None:
    """B2/B3/S5 liveness under every order: after a random history on two capped
    replicas, with no new turns, finishing the admitted turns one by one admits every
    held turn not abandoned; the cap stays (no capacity is added to drain them)."""
    host = Host(params, cap=cap, replicas=2)
    requested: set[str] = set()
    abandoned: set[str] = set()
    for i, (op, pick, flag) in enumerate(ops):
        host.t += 0.5
        if op == "req":  # (a run keeps its class: r0 is interactive, the rest batch)
            run = f"r{pick % 5}"
            turn = f"t{i}"
            requested.add(turn)
            host.req(turn, run, f"c{pick % 3}", INT if run == "r0" else BAT)
        elif op == "finish" and host.admitted:
            turn = sorted(host.admitted)[pick % len(host.admitted)]
            host.finish(turn, prompt=pick % 3000, reply=pick % 300, cached=pick % 500, paused=flag)
        elif op == "abandon" and host.state.held:
            turn = sorted(host.state.held)[pick % len(host.state.held)]
            abandoned.add(turn)
            host(TurnAbandoned(host.t, turn))
        elif op == "tick":
            host(ClockTicked(host.t))
    # Drain: pauses lapse after their lease (an interactive pause holds a slot, S4)
    host.t += params.tool_lease_default_s + 1
    host(ClockTicked(host.t))
    for _ in range(4 * len(requested) + 4):
        if not host.state.held:
            break
        assert host.admitted, "turns held with nothing in flight to free a slot"
        host.finish(sorted(host.admitted)[0], prompt=100, reply=10)
    assert not host.state.held
    assert requested - abandoned <= host.ever
