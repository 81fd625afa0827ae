"""Callers bound to keys in the core (B13, ``order.py`` "Callers and sub-callers"): weights
in the caller order under both fairness rules, sub-callers sharing their account's place,
and in-flight limits that hold turns instead of refusing them. Rules by example, then
Hypothesis properties: the weighted in-flight bound, VTC's bound with weights, no account
over its limit, and every held turn admitted in the end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from _core_host import CoreHost
from hypothesis import given, settings
from hypothesis import strategies as st
from immutables import Map

from luftpause.scheduler.core import (
    Admit,
    CallerPolicy,
    EndpointKind,
    Params,
    ReplicaProbed,
    ServiceClass,
    TurnAbandoned,
    TurnFinished,
    TurnRequested,
    order,
)
from luftpause.scheduler.core.invariants import over_limit
from luftpause.scheduler.core.state import HeldTurn

GEN = EndpointKind.GENERATIVE
BAT = ServiceClass.BATCH
INT = ServiceClass.INTERACTIVE
# No ramp, no decode pace, no prefix keeping: the cap a probe sets is the only limit, and
# every held turn is a candidate for every freed slot.
BASE = Params(initial_cap=None, queue_probes=1, interactive_pace_s=None, keep_prefixes=False)


def callers(**policies: CallerPolicy) -> Map[str, CallerPolicy]:
    return Map(policies)


class Host(CoreHost):
    def req(self, turn: str, caller: str, cls: ServiceClass = BAT, run: str = "") -> bool:
        """Request a turn (its own run unless named); whether it was admitted at once."""
        ev = TurnRequested(self.t, turn, run or f"run-{turn}", "m", cls, caller, GEN, "dp")
        return any(isinstance(a, Admit) and a.turn_id == turn for a in self(ev))

    def finish(self, turn: str, prompt: int = 0, reply: int = 0) -> list[str]:
        self.admitted.pop(turn, None)
        actions = self(TurnFinished(self.t, turn, prompt_tokens=prompt, completion_tokens=reply))
        return [a.turn_id for a in actions if isinstance(a, Admit)]


def account_in_flight(host: Host) -> Counter[str]:
    return Counter(order.account(host.state.turns[t].caller) for t in host.admitted)


# ------------------------------------------------------------------ examples


def test_a_caller_of_weight_two_holds_twice_the_turns_in_flight() -> None:
    """B13, S5: with both backlogged on one replica of 6 slots, alice (weight 2) ends up
    with 4 turns in flight and bob (weight 1) with 2, however the turns end."""
    host = Host(replace(BASE, callers=callers(alice=CallerPolicy(weight=2.0))), cap=6, replicas=1)
    for i in range(12):
        host.req(f"a{i}", "alice")
        host.req(f"b{i}", "bob")
    for turn in sorted(host.admitted)[:4]:  # end some, whoever they are
        host.finish(turn)
    assert account_in_flight(host) == {"alice": 4, "bob": 2}


def test_sub_callers_share_their_account_and_are_fair_within_it() -> None:
    """B13: alice/ci and alice/web are alice's; together they get alice's share (not one
    each), and within alice the sub-caller with fewer turns in flight goes first."""
    host = Host(BASE, cap=4, replicas=1)
    for i in range(8):
        host.req(f"ci{i}", "alice/ci")
    for i in range(8):
        host.req(f"web{i}", "alice/web")
        host.req(f"b{i}", "bob")
    for turn in sorted(host.admitted):  # the first 4 were all alice/ci's
        host.finish(turn)
    assert account_in_flight(host) == {"alice": 2, "bob": 2}
    mine = Counter(host.state.turns[t].caller for t in host.admitted if t[0] != "b")
    assert mine == {"alice/ci": 1, "alice/web": 1}
    assert dict(host.state.sub_in_flight) == {"alice": 2}


def test_an_in_flight_limit_holds_turns_however_much_room_there_is() -> None:
    """B13: alice may have 2 turns in flight; her third waits although two replicas have
    room, and is admitted the moment one of hers ends (on either replica); bob, without a
    limit, is never held for hers."""
    host = Host(replace(BASE, callers=callers(alice=CallerPolicy(max_in_flight=2))), 4, 2)
    assert host.req("a0", "alice/ci") and host.req("a1", "alice")
    assert not host.req("a2", "alice/web")
    assert "a2" in host.state.held
    assert host.req("b0", "bob") and host.req("b1", "bob")
    assert host.finish("a0") == ["a2"]
    assert over_limit(host.state) == []
    assert not host.req("a3", "alice", INT)  # the class changes nothing
    assert host.finish("b0") == []  # another caller's slot does not free hers


def test_token_fairness_keeps_one_weighted_counter_per_account() -> None:
    """B3 + B13: a finished turn advances its account's counter by its weighted tokens
    over the account's weight; sub-callers add to their account's counter."""
    params = replace(BASE, fairness="tokens", callers=callers(alice=CallerPolicy(weight=4.0)))
    host = Host(params, cap=1, replicas=1)
    host.req("a0", "alice/ci")
    host.req("b0", "bob")
    host.req("a1", "alice/web")
    host.finish("a0", prompt=100, reply=50)  # (100 + 2 x 50) / 4
    assert dict(host.state.vtc) == {"alice": 50.0, "bob": 0.0}
    assert "alice/ci" not in host.state.vtc
    assert order.turn_cost(params, "alice", 100, 50) == 50.0
    assert order.turn_cost(params, "bob", 100, 50) == 200.0


def test_the_key_ranks_accounts_by_weighted_turns_in_flight() -> None:
    """The key's first part is the account's turns in flight (its own and its
    sub-callers') over its weight; the second, while sub-callers are in flight, the
    caller's own."""
    params = replace(BASE, callers=callers(alice=CallerPolicy(weight=2.0)))
    in_flight: Map[str, int] = Map({"alice": 1, "alice/ci": 2, "bob": 2})
    sub: Map[str, int] = Map({"alice": 2})
    key = order.held_key(params, in_flight, sub, Map(), BAT, True, ("pin", "g0"))
    free = ("free", "generative", "m")
    assert key(free, _held("alice/web"))[:2] == (1.5, 0)
    assert key(free, _held("bob"))[:2] == (2.0, 2)
    assert key(free, _held("alice/ci"))[:2] == (1.5, 2)
    # without sub-callers in flight or weights, one lookup: the account's turns in flight
    plain = order.held_key(BASE, Map({"alice": 3}), Map(), Map(), BAT, True, ("pin", "g0"))
    assert plain(free, _held("alice/web"))[:2] == (3, 0)


def _held(caller: str) -> HeldTurn:
    return HeldTurn("t", "r", "m", BAT, caller, GEN, "dp", 0.0, 7, ("free", "generative", "m"), 0)


# ------------------------------------------------------------------ properties

WEIGHTS = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    cap=st.integers(1, 6),
    weights=st.lists(WEIGHTS, min_size=2, max_size=4),
    subs=st.booleans(),
    ends=st.lists(st.integers(0, 10**6), min_size=1, max_size=80),
)
def test_weighted_in_flight_bound(
    cap: int, weights: list[float], subs: bool, ends: list[int]
) -> None:
    """B13's bound under ``fairness = "in_flight"``: accounts kept backlogged on one full
    replica, their turns ending in any order. After every event, every account f holds at
    most one turn above the least weighted share: n_f / w_f - 1 / w_f <= min_g n_g / w_g.
    So each account's turns in flight stay within one turn of cap x w_f / sum(w); with
    turns of equal length, so does its share of the service."""
    names = [f"c{i}" for i in range(len(weights))]
    policies = {n: CallerPolicy(weight=w) for n, w in zip(names, weights, strict=True)}
    host = Host(replace(BASE, callers=Map(policies)), cap=cap, replicas=1)
    sent = 0

    def top_up(least: int = 2) -> None:
        nonlocal sent
        waiting = Counter(order.account(h.caller) for h in host.state.held.values())
        for i, name in enumerate(names):
            while waiting[name] < least:
                caller = f"{name}/s{sent % 2}" if subs and i % 2 == 0 else name
                host.req(f"t{sent}", caller)
                sent += 1
                waiting[name] += 1

    # Everyone backlogged before the replica takes any (a turn arriving at a replica with
    # room goes in at once, whoever sent it: the order is for held turns).
    host(ReplicaProbed(host.t, "g0", False))
    top_up(cap + 2)
    host(ReplicaProbed(host.t, "g0", True, cap, 1))
    assert sum(account_in_flight(host).values()) == cap
    for pick in ends:
        live = sorted(host.admitted)
        host.finish(live[pick % len(live)])
        top_up()
        n = account_in_flight(host)
        assert sum(n.values()) == cap
        least = min(n[g] / policies[g].weight for g in names)
        for f in names:
            assert n[f] / policies[f].weight - 1 / policies[f].weight <= least + 1e-9, dict(n)


PW, CW = 1.0, 2.0
MAX_PROMPT, MAX_REPLY = 400, 100
U = PW * MAX_PROMPT + CW * MAX_REPLY


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    cap=st.integers(1, 4),
    weights=st.lists(WEIGHTS, min_size=2, max_size=3),
    steps=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, MAX_PROMPT), st.integers(0, MAX_REPLY)),
        min_size=1,
        max_size=80,
    ),
)
def test_weighted_vtc_bound(
    cap: int, weights: list[float], steps: list[tuple[int, int, int]]
) -> None:
    """B3 with B13's weights: the bound ``order.py`` proves, where one turn advances
    account f's counter by at most U / w_f: c_f - c_g <= max(c_f(t1) - c_g(t1), 0) +
    cap x U / w_f while both are backlogged. So over a contended period each account's
    weighted tokens served, divided by its weight, stay within that bound of another's."""
    names = [f"c{i}" for i in range(len(weights))]
    policies = {n: CallerPolicy(weight=w) for n, w in zip(names, weights, strict=True)}
    params = replace(
        BASE, fairness="tokens", prompt_weight=PW, completion_weight=CW, callers=Map(policies)
    )
    host = Host(params, cap=cap, replicas=1)
    sent = 0

    def top_up() -> None:
        nonlocal sent
        for name in names:
            while host.state.caller_held.get(name, 0) < 2:
                host.req(f"t{sent}", name if sent % 3 else f"{name}/x")
                sent += 1

    top_up()
    start = dict(host.state.vtc)
    for pick, prompt, reply in steps:
        live = sorted(host.admitted)
        host.finish(live[pick % len(live)], prompt, reply)
        top_up()
        vtc = host.state.vtc
        for f in names:
            for g in names:
                if f != g:
                    slack = max(start[f] - start[g], 0.0) + cap * U / policies[f].weight
                    assert vtc[f] - vtc[g] <= slack + 1e-6, (f, g, dict(vtc))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    limits=st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=2, max_size=3),
    cap=st.integers(1, 4),
    ops=st.lists(
        st.tuples(st.sampled_from(["req", "req", "finish", "abandon"]), st.integers(0, 10**6)),
        max_size=60,
    ),
)
def test_no_caller_exceeds_its_limit_and_every_held_turn_goes_in_the_end(
    limits: list[int | None], cap: int, ops: list[tuple[str, int]]
) -> None:
    """B13: over random histories on two replicas, no account ever has more turns in
    flight than its limit, a turn is held only for room or its account's limit, and
    ending the turns in flight one by one admits every held turn not abandoned."""
    names = [f"c{i}" for i in range(len(limits))]
    policies = {n: CallerPolicy(max_in_flight=m) for n, m in zip(names, limits, strict=True)}
    host = Host(replace(BASE, callers=Map(policies)), cap=cap, replicas=2)
    requested: set[str] = set()
    abandoned: set[str] = set()
    for i, (op, pick) in enumerate(ops):
        host.t += 0.1
        if op == "req":
            name = names[pick % len(names)]
            caller = name if pick % 4 else f"{name}/sub{pick % 3}"
            requested.add(f"t{i}")
            host.req(f"t{i}", caller, INT if pick % 5 == 0 else BAT, run=f"r{pick % 6}")
        elif op == "finish" and host.admitted:
            host.finish(sorted(host.admitted)[pick % len(host.admitted)])
        elif op == "abandon" and host.state.held:
            turn = sorted(host.state.held)[pick % len(host.state.held)]
            abandoned.add(turn)
            host(TurnAbandoned(host.t, turn))
        assert over_limit(host.state) == []
        flying = account_in_flight(host)
        for held in host.state.held.values():
            account = order.account(held.caller)
            limit = policies[account].max_in_flight
            room = any(
                r.in_flight < (r.cap or 0) for r in host.state.replicas.values() if r.healthy
            )
            held_for_limit = limit is not None and flying[account] >= limit
            assert held_for_limit or not room or held.lane[0] == "pin", held
    for _ in range(4 * len(requested) + 4):
        if not host.state.held:
            break
        assert host.admitted, "turns held with nothing in flight to free a slot"
        host.finish(sorted(host.admitted)[0])
    assert not host.state.held
    assert requested - abandoned <= host.ever
