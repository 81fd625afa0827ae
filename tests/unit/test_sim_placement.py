"""Where the simulator's gateways place a run (B1, B10, issue #18): the SGLang Model
Gateway's and the SGLang router's ``cache_aware`` over an approximate prefix tree,
``round_robin`` and ``least_load``, and the routing text a chat request is placed by."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from luftpause.fakes.engine.model import EngineParams
from luftpause.measure.mix import Group
from luftpause.sim.arms import SmgArm
from luftpause.sim.fleet import Replica
from luftpause.sim.placement import (
    ExpectedWait,
    LeastLoad,
    LoadReport,
    PrefixTree,
    RoundRobin,
    SmgCacheAware,
    router_placement,
    routing_text,
    smg_placement,
)
from luftpause.sim.run import SimConfig, simulate
from luftpause.sim.world import World


@dataclass
class Stub:
    name: str
    in_flight: int = 0


SHARED = "You are a coding agent. " * 40  # 960 characters every run starts with


def test_the_tree_matches_the_longest_prefix_and_names_the_replica_that_created_it() -> None:
    """A match ends in the node where the text leaves the tree; its owner is the replica
    whose text created that node, kept when a later text splits it."""
    tree = PrefixTree()
    tree.insert(SHARED + "task one", "a")
    assert tree.match(SHARED + "task one") == (len(SHARED) + 8, "a")
    tree.insert(SHARED + "task two", "b")  # splits a's node after "task "
    assert tree.match(SHARED + "task two, again") == (len(SHARED) + 8, "b")
    # ends inside the shared part, split off a's node: still a's
    assert tree.match(SHARED + "other") == (len(SHARED), "a")
    assert tree.match("nothing alike") == (0, None)
    assert tree.chars == {"a": len(SHARED) + 8, "b": len(SHARED) + 8}


def test_the_routers_cache_aware_follows_the_prefix_unless_loads_are_far_apart() -> None:
    """The router's cache_aware: a text matching more than 30 % goes to the owner of the
    match even when the other replica is idle; loads more than 64 apart (and 1.5× apart)
    send it to the least loaded."""
    a, b = Stub("a"), Stub("b")
    policy = router_placement()
    assert policy.place(SHARED + "run 1", [a, b]) == "a"  # empty tree: least loaded, a first
    a.in_flight = 40
    assert policy.place(SHARED + "run 2", [a, b]) == "a"  # 99 % match: a, busy or not
    a.in_flight = 65
    assert policy.place(SHARED + "run 3", [a, b]) == "b"  # imbalanced: the least loaded
    a.in_flight = 10
    assert policy.place(SHARED + "run 3", [a, b]) == "b"  # and the tree now has it on b


def test_below_the_threshold_a_text_goes_to_the_least_loaded_replica() -> None:
    """A text whose match is 30 % of it or less goes to the least loaded replica, in the
    router's policy as in SMG's, and is then the tree's on that replica."""
    short = "shared head " + "x" * 10
    a, b = Stub("a", in_flight=3), Stub("b", in_flight=5)
    for policy in (smg_placement("cache_aware"), router_placement()):
        assert policy.place(short + " first run with a long task of its own " * 5, [a, b]) == "a"
        a.in_flight, b.in_flight = 6, 5
        text = short + " another run, whose own text is most of it " * 5
        assert policy.place(text, [a, b]) == "b"
        a.in_flight, b.in_flight = 1, 5
        assert policy.place(text + " and its next turn", [a, b]) == "b"  # follows its prefix
        a.in_flight, b.in_flight = 3, 5


def test_round_robin_random_and_least_load_ignore_the_text() -> None:
    """round_robin takes the replicas in turn; random any, the same ones for the same
    seed; least_load (before any load report) the emptiest, equals drawn from the seed."""
    a, b = Stub("a", in_flight=9), Stub("b")
    rr = RoundRobin()
    assert [rr.place(SHARED, [a, b]) for _ in range(3)] == ["a", "b", "a"]
    assert LeastLoad().place(SHARED, [a, b]) == "b"
    b.in_flight = 9
    ties = [LeastLoad(seed=n).place(SHARED, [a, b]) for n in range(20)]
    assert set(ties) == {"a", "b"}
    assert ties == [LeastLoad(seed=n).place(SHARED, [a, b]) for n in range(20)]
    picks = [smg_placement("random", seed=3).place(SHARED, [a, b]) for _ in range(1)]
    one, other = smg_placement("random", seed=3), smg_placement("random", seed=3)
    drawn = [one.place(SHARED, [a, b]) for _ in range(40)]
    assert drawn == [other.place(SHARED, [a, b]) for _ in range(40)]
    assert set(drawn) == {"a", "b"} and picks[0] == drawn[0]
    with pytest.raises(ValueError, match="unknown SMG policy 'power_of_two'"):
        smg_placement("power_of_two")


def test_the_routing_text_is_the_conversation_text() -> None:
    """A chat request routes on every message's text, tool results and replies (with their
    reasoning) included and tool calls' arguments not, so a run's next turn extends its
    last; text parts of a content list count, images and empty contents add nothing."""
    first = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "task 7"},
    ]
    later = [
        *first,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "look it up",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"q": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a tool result"},
    ]
    assert routing_text(first) == "be brief task 7"
    assert routing_text(later) == "be brief task 7 look it up a tool result"
    parts = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "image_url"}]},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]},
    ]
    assert routing_text(parts) == "S look"


CODING = SimConfig(
    groups=(
        Group("people", 2, "interactive", "people", profile="coding-agent"),
        Group("crowd", 24, "batch", "crowd", profile="coding-agent"),
    ),
    duration_s=200.0,
    warmup_s=100.0,
    ramp_s=50.0,
    engine=EngineParams(priority_scheduling=True, context_length=131_072, kv_tokens=1_000_000),
)


# the classic flood's runs at 48 batch agents, a short window
OWN = SimConfig(
    groups=(
        Group("interactive", 4, "interactive", "interactive"),
        Group("batch", 48, "batch", "batch"),
    ),
    duration_s=60.0,
    warmup_s=30.0,
    ramp_s=15.0,
)


def share(result: dict[str, object]) -> float:
    counts = result["requests_by_replica"]
    assert isinstance(counts, dict)
    return max(counts.values()) / sum(counts.values())


def test_cache_aware_piles_coding_runs_onto_one_replica_and_round_robin_spreads_them() -> None:
    """Coding runs share a 21,000-token system prompt: SMG's cache_aware, capped at 12
    slots (loads never 64 apart), keeps most of them on the replica of the first, as the
    flood measured it; round_robin spreads them; own-loop runs, whose shared preamble is a
    small part of each prompt, stay balanced under cache_aware, and under the router,
    which places every turn."""
    piled_run = simulate(CODING, "smg-cap12")
    spread_run = simulate(replace(CODING, smg_policy="round_robin"), "smg-cap12")
    assert piled_run["error_count"] == 0 and spread_run["error_count"] == 0  # the turns ran
    piled, spread = share(piled_run), share(spread_run)
    assert piled > 0.75
    assert spread < 0.6
    assert share(simulate(OWN, "smg-cap16")) < 0.6
    assert share(simulate(OWN, "router")) < 0.6


def test_the_tree_names_every_replica_holding_the_node_a_match_ends_in() -> None:
    """SMG 1.13 takes as candidates every replica whose text passed through the node where
    the match ends, not only the one that created it."""
    tree = PrefixTree()
    tree.insert(SHARED + "task one", "a")
    tree.insert(SHARED + "task two", "b")
    assert tree.holders(SHARED + "task four") == (len(SHARED) + 5, frozenset({"a", "b"}))
    assert tree.holders(SHARED + "task one, again") == (len(SHARED) + 8, frozenset({"a"}))
    assert tree.holders("nothing alike") == (0, frozenset())


def test_expected_wait_prices_the_last_report_and_what_was_sent_since() -> None:
    """B1: SMG's expected wait reads each engine's running and waiting requests as last
    polled, adds the requests it chose there since, and is reset by the next poll: between
    polls the chosen engine fills up in the score though the report stays the same."""
    scorer = ExpectedWait()
    a, b = Stub("a", in_flight=4), Stub("b")
    scorer.poll({"a": LoadReport(3, 1, 0.0), "b": LoadReport(0, 0, 0.0)})
    assert scorer.seconds(a, 0.0) == pytest.approx(4 * 1024 / 2000)
    # b is emptier by four requests: the next four go there, then they are level
    assert [scorer.choose([a, b]) for _ in range(4)] == ["b"] * 4
    assert scorer.seconds(b, 0.0) == pytest.approx(scorer.seconds(a, 0.0))
    # a poll that still reads b empty (the requests not yet there) forgets the four
    scorer.poll({"a": LoadReport(3, 1, 0.0), "b": LoadReport(0, 0, 0.0)})
    assert scorer.choose([a, b]) == "b"


def test_expected_wait_counts_the_gateways_own_requests_and_kv_pressure() -> None:
    """B1: an engine whose report shows fewer requests than the gateway holds there is
    priced at the gateway's count; at equal counts, the fuller KV cache waits longer
    (0.15 k / (1 - k) seconds)."""
    scorer = ExpectedWait()
    a, b = Stub("a", in_flight=6), Stub("b", in_flight=2)
    scorer.poll({"a": LoadReport(0, 0, 0.0), "b": LoadReport(2, 0, 0.0)})
    assert scorer.seconds(a, 0.0) == pytest.approx(6 * 1024 / 2000)
    assert scorer.choose([a, b]) == "b"
    a.in_flight = b.in_flight = 0
    scorer.poll({"a": LoadReport(1, 0, 0.5), "b": LoadReport(1, 0, 0.0)})
    assert scorer.seconds(a, 0.0) - scorer.seconds(b, 0.0) == pytest.approx(0.15)
    assert scorer.choose([a, b]) == "b"
    # an engine without a report beside one with: the best known wait plus its own count
    c = Stub("c", in_flight=1)
    assert scorer.seconds(c, 0.5) == pytest.approx(0.5 + 1024 / 2000)


def test_the_gateways_floor_counts_the_credit_and_the_baseline_is_the_candidates() -> None:
    """B1: the requests the gateway holds beyond the report are those neither the report
    nor the credit since it accounts for; an engine without a report starts from the
    best reporting *candidate*, not from an engine the request may not go to."""
    scorer = ExpectedWait()
    a, b = Stub("a", in_flight=5), Stub("b")
    scorer.poll({"a": LoadReport(2, 0, 0.0), "b": LoadReport(0, 0, 0.0)})
    scorer.since_poll["a"] = 1  # one request chosen there since the report
    # 2 reported + 1 credited + 2 more the gateway holds = 5, not 6
    assert scorer.seconds(a, 0.0) == pytest.approx(5 * 1024 / 2000)
    a.in_flight = 2  # fewer held than reported and credited: no floor at all
    assert scorer.seconds(a, 0.0) == pytest.approx(3 * 1024 / 2000)
    scorer.poll({"a": LoadReport(4, 0, 0.0), "b": LoadReport(0, 0, 0.0)})
    a.in_flight = 4
    c = Stub("c", in_flight=3)  # never reported
    # b (idle) is not a candidate: c is priced from a's 2.048 s, so 3.584 s, and a wins
    assert scorer.choose([a, c]) == "a"
    assert scorer.choose([b, c]) == "b"  # from b's 0 s, c's 1.536 s loses to b


def test_smg_cache_aware_picks_among_the_holders_and_spills_past_the_gate() -> None:
    """B1: SMG 1.13's cache_aware sends a hit to the least expected wait among the
    replicas holding the prefix; a holder more than 1.5× the mean and the margin
    (min(64, max(4, ceil(2 sqrt(mean))))) above it is skipped, and where every holder is,
    the request spills to another replica, which then holds the prefix too."""
    a, b = Stub("a", in_flight=9), Stub("b", in_flight=1)
    policy = SmgCacheAware()
    policy.tree.insert(SHARED + "run 0", "a")
    # mean 5, margin 5: 9 is over 7.5 but not over 10, so a keeps the hit though b is idle
    assert policy.place(SHARED + "run 1", [a, b]) == "a"
    a.in_flight = 11  # mean 6, margin 5: over 9 and over 11? no (not strictly)
    assert policy.place(SHARED + "run 2", [a, b]) == "a"
    a.in_flight = 12  # mean 6.5, margin 6: over 9.75 and 12.5? no
    assert policy.place(SHARED + "run 3", [a, b]) == "a"
    a.in_flight = 20  # mean 10.5, margin 7: over 15.75 and 17.5: spill
    assert policy.place(SHARED + "run 4", [a, b]) == "b"
    assert policy.tree.holders(SHARED + "run 5")[1] == frozenset({"a", "b"})
    # both hold it now: the next hit goes to the one of least expected wait
    a.in_flight, b.in_flight = 3, 4
    assert policy.place(SHARED + "run 5", [a, b]) == "a"
    # a text matching 30 % or less is a miss: the least expected wait of all
    c = Stub("c")
    assert policy.place("x" * 4000 + SHARED, [a, b, c]) == "c"
    # once SMG has read the engines, a hit goes by the read, not by the live count: a
    # holds fewer requests now but was read busier
    a.in_flight, b.in_flight = 3, 4
    policy.poll({"a": LoadReport(6, 0, 0.0), "b": LoadReport(4, 0, 0.0)})
    assert policy.place(SHARED + "run 6", [a, b]) == "b"


def test_the_smg_arm_reads_the_engines_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """B1: the SMG arm hands its load-priced placement a read of every engine's gauges at
    its start and every poll_s model seconds after; a placement that ignores load hears
    none."""
    world = World()
    replicas = [Replica(f"engine-{i}", EngineParams(), world) for i in range(2)]
    heard: list[tuple[float, tuple[str, ...]]] = []
    placement = SmgCacheAware()
    monkeypatch.setattr(
        placement, "poll", lambda reports: heard.append((world.now, tuple(reports)))
    )
    arm = SmgArm(world, replicas, placement=placement, poll_s=4.0)
    arm.start()
    world.run(10.0)
    assert heard == [(t, ("engine-0", "engine-1")) for t in (0.0, 4.0, 8.0)]
    quiet = World()
    SmgArm(quiet, replicas, placement=RoundRobin(), poll_s=4.0).start()
    quiet.run(10.0)
    assert quiet.events == 0
    with pytest.raises(ValueError, match="load poll must be a positive interval"):
        SmgArm(world, replicas, poll_s=0.0)


def test_a_staler_load_poll_changes_smg_placement_but_not_its_seed_reproducibility() -> None:
    """B1: the simulator's SMG arm with the same seed and poll gives the same results;
    reading the engines every 50 s instead of every 2 s changes where runs go."""
    fresh = simulate(replace(OWN, smg_load_poll_s=2.0), "smg-cap36")
    again = simulate(replace(OWN, smg_load_poll_s=2.0), "smg-cap36")
    stale = simulate(replace(OWN, smg_load_poll_s=50.0), "smg-cap36")
    assert fresh["requests_by_replica"] == again["requests_by_replica"]
    assert fresh["classes"] == again["classes"]
    assert fresh["requests_by_replica"] != stale["requests_by_replica"]
