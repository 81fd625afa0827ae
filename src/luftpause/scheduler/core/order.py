"""Held-turn order: which held turn a replica with room takes first, within a class.

A policy unit of the core. ``decide.py``'s theory of operation says how it composes
with the rest (class order first, S4; this module orders within a class).

What it reads: ``Params.fairness``, ``prompt_weight``, ``completion_weight``,
``batch_order``, ``attained_measure`` and ``callers`` (weights and in-flight limits); per
caller, its turns in flight (``State.caller_in_flight``, and its sub-callers',
``State.sub_in_flight``) or its account's virtual token counter (``State.vtc``); per run, its
attained service (``RunState.attained``); per held turn, whether it waits in the
replica's own pin lane (prefix keeping), its service level (``HeldTurn.tier``) and its
arrival number.

What it decides: the sort key of a held turn (least first; ``held_key`` builds it for
one pick, ``decide._Tx._best_held`` iterates the candidates and keeps the least); the
FIFO a held turn waits in (``queue_caller``); and the bookkeeping the key needs: how
much a finished turn advances its caller's counter (``turn_cost``) and its run's
attained service (``served``), the service level of a run (``tier``), the counter an
account starts from (``lift``), and whether an account is at its in-flight limit
(``at_limit``).

The key, least first:

1. the caller's account (below): ``fairness = "in_flight"`` (S5, the default): its turns
   in flight divided by its weight; ``fairness = "tokens"`` (B3): its virtual token
   counter;
2. the caller itself within its account: its own turns in flight (0 for every caller
   while no sub-caller is in flight: then this part orders nothing);
3. (prefix keeping) 0 for a turn in the replica's own pin lane, else 1;
4. ``batch_order = "attained"`` (B2), batch class only: its run's service level when
   the turn was held;
5. its arrival number (a total order: the pick is deterministic).

Callers and sub-callers (B13). A caller named ``a/x`` is a sub-caller of ``a``: its
*account* is ``a`` (``account``; a caller without ``/`` is its own account). Accounts are
what the order is fair between: a configured caller's weight (``Params.callers``) is its
account's, its sub-callers share that account's place, and ``fairness = "tokens"`` keeps
one counter per account. Within an account, the caller with fewer turns in flight goes
first, so one sub-caller's flood cannot starve another of the same key. The account's
turns in flight are ``State.caller_in_flight[a]`` (the account's own turns, sent without
a sub-caller) plus ``State.sub_in_flight[a]`` (its sub-callers' turns).

Weights. Under ``fairness = "in_flight"`` an account's rank is its turns in flight over
its weight: whenever an account is admitted a turn while another account's turn waits
where it could have gone, n_f / w_f <= n_g / w_g held just before, so over a contended
period the two hold turns in flight in proportion to their weights, within one turn
(``tests/unit/test_core_order.py``). Under ``"tokens"`` the weight divides the counter's
increments (below).

Limits. An account at its ``max_in_flight`` is skipped by the pick (``at_limit``): its
held turns wait however much room there is, and the account's turn that ends next lets
one of them go (``decide`` then offers every replica again).

Attained service is discretised, as Autellix discretises PLAS into a few queues: a run's
level is 0 below ``ATTAINED_BASE`` and rises by one each time its service doubles. The
held-turn index keeps one FIFO per (lane, class, caller), and the pick looks only at FIFO
heads; a turn above level 0 waits in a FIFO of its caller and level, so the heads include
the oldest turn of every level of every caller (a few dozen levels at most), and the pick
stays a scan of heads, never of turns. A level is taken when the turn is held: a run's
service grows when its turns end, and its next turn is held after that.

Attained service comes after the prefix lane: a continuing run's turn keeps its cached
prefix ahead of a new run's turn, which has attained nothing, so attained service orders
the continuing runs among themselves and the new runs among themselves. Put first, it
would start new runs ahead of every continuing one and undo prefix keeping. Least
attained first favours runs early in their life; a run far along waits while younger
runs of its caller keep arriving on that replica (no aging: a lasting stream of young
runs can hold it back for as long as the stream lasts).

Virtual token counters (VTC, Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024), one per account. An account's counter advances when a turn of it finishes,
by ``(prompt_weight x prompt_tokens + completion_weight x completion_tokens) / w`` where
``w`` is the account's weight (``caller_weight``: 1 unless configured). An account is
*active* while it has a generative turn held or in flight; only active accounts have a
counter (bounded state). An account that becomes active
starts at the least counter of the active callers (0 if there are none): VTC's lift, so
time away earns no credit. (A caller that comes back with a counter above that minimum
would be lowered to it; that gain is within the bound below.)

The service-gap bound in our setting, where counters advance at a turn's end and a
caller may have several turns in flight. Take one replica, or more where every held
turn may take every freed slot (a single lane per class, or prefix keeping's run limit
not in the way), and two callers f and g of one class, both with a held turn at every
moment of [t1, t2]. Let U be the largest increment one turn makes and M_f the most turns
of f in flight at once. Then at every t in [t1, t2]

    c_f(t) - c_g(t) <= max(c_f(t1) - c_g(t1), 0) + M_f x U

Proof: if f was admitted in [t1, t], let ta be its last admission. g's head was a
candidate then and f's key was not greater: c_f(ta) <= c_g(ta). After ta, c_f grows only
when the turns of f in flight just after ta end: at most M_f of them, each by at most U;
c_g never falls (g stays active, so it is neither dropped nor lifted). So
c_f(t) <= c_g(ta) + M_f U <= c_g(t) + M_f U. If f was not admitted in [t1, t], c_f grows
only by its turns in flight at t1: c_f(t) <= c_f(t1) + M_f U. Hence the service f
receives over [t1, t2] (its counter's advance) exceeds g's by at most
max(c_g(t1) - c_f(t1), 0) + M_f U; once their counters are within M_f U of each other,
by at most 2 M_f U. VTC's paper proves 2U for counters that advance as tokens are
served; ending turns advance in steps of a whole turn, which is what M_f pays for.
``tests/unit/test_core_order.py`` checks the counter bound over random histories.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from immutables import Map

from luftpause.scheduler.core.state import HeldTurn, Lane
from luftpause.scheduler.core.types import Params, ServiceClass

HeldKey = Callable[[Lane, HeldTurn], tuple[float, ...]]
Rank1 = Callable[[str], float]
Get = Callable[[str, int], float]

# Attained service's first level, per measure: tokens (a few turns' uncached prompt and
# reply), seconds of turn time; each level above it doubles.
ATTAINED_BASE = {"tokens": 256.0, "time": 1.0}
MAX_TIER = 40


def account(caller: str) -> str:
    """The account a caller belongs to: the part before its first ``/``."""
    return caller.partition("/")[0]


def caller_weight(params: Params, name: str) -> float:
    """An account's share (its configured ``CallerPolicy.weight``; 1 if not configured)."""
    policy = params.callers.get(name)
    return 1.0 if policy is None else policy.weight


def in_flight_limit(params: Params, name: str) -> int | None:
    """An account's limit on turns in flight (None: none)."""
    policy = params.callers.get(name)
    return None if policy is None else policy.max_in_flight


def account_in_flight(in_flight: Map[str, int], sub_in_flight: Map[str, int], name: str) -> int:
    """An account's turns in flight: its own and its sub-callers'."""
    return in_flight.get(name, 0) + sub_in_flight.get(name, 0)


def at_limit(
    params: Params, in_flight: Map[str, int], sub_in_flight: Map[str, int], caller: str
) -> bool:
    """Whether ``caller``'s account has as many turns in flight as it may."""
    name = account(caller)
    limit = in_flight_limit(params, name)
    return limit is not None and account_in_flight(in_flight, sub_in_flight, name) >= limit


def limited(params: Params) -> bool:
    """Whether any configured caller has an in-flight limit."""
    return any(p.max_in_flight is not None for p in params.callers.values())


def caller_ranks(
    params: Params,
    in_flight: Map[str, int],
    sub_in_flight: Map[str, int],
    vtc: Map[str, float],
    tokens: bool,
) -> Rank1:
    """The key's first part for a caller: its account's rank (``tokens``: its virtual
    token counter, else its turns in flight over its weight)."""
    if tokens:
        get_vtc = vtc.get

        def by_tokens(caller: str) -> float:
            return get_vtc(caller.partition("/")[0], 0.0)

        return by_tokens
    weights = _weights(params)
    get = in_flight.get
    get_sub = sub_in_flight.get
    if not weights and not sub_in_flight:  # (the common case: one lookup)

        def plain(caller: str) -> float:
            if "/" in caller:
                return get(caller.partition("/")[0], 0)
            return get(caller, 0)

        return plain

    def weighted(caller: str) -> float:
        name = caller.partition("/")[0]
        return (get(name, 0) + get_sub(name, 0)) / weights.get(name, 1.0)

    return weighted


def held_key(
    params: Params,
    in_flight: Map[str, int],
    sub_in_flight: Map[str, int],
    vtc: Map[str, float],
    cls: ServiceClass,
    generative: bool,
    own: Lane,
) -> HeldKey:
    """The key, least first, of a held turn of class ``cls`` waiting in a lane (the
    arguments of the returned function) that a replica whose pin lane is ``own`` may
    take: its account's rank (``caller_ranks``; on a single-pass replica always the
    turns in flight: token fairness counts generative turns only), its own turns in
    flight within the account (while any sub-caller is in flight), 0 if it waits in
    ``own`` with prefix keeping on (else 1), its service level under the attained order
    (batch only), its arrival number. Built once per pick: what the key reads of
    ``params`` and the class is decided here, so that each candidate costs one call."""
    tokens = generative and params.fairness == "tokens"
    # a lane is never None: without prefix keeping no lane is the replica's own
    here = own if params.keep_prefixes else None
    attained = cls is ServiceClass.BATCH and params.batch_order == "attained"
    if not sub_in_flight and (tokens or not _weights(params)):
        # The common case, one lookup per candidate: no sub-caller in flight (so the
        # second part is 0 for all) and no weight to divide by.
        get = vtc.get if tokens else in_flight.get
        if attained:

            def plain_attained_key(
                lane: Lane, held: HeldTurn, get: Get = get, here: Lane | None = here
            ) -> tuple[float, ...]:
                caller = held.caller
                if "/" in caller:
                    caller = caller.partition("/")[0]
                return (get(caller, 0), 0, 0 if lane == here else 1, held.tier, held.seq)

            return plain_attained_key

        # (what it reads bound as defaults: locals, the fastest names to read)
        def plain_key(
            lane: Lane, held: HeldTurn, get: Get = get, here: Lane | None = here
        ) -> tuple[float, ...]:
            caller = held.caller
            if "/" in caller:
                caller = caller.partition("/")[0]
            return (get(caller, 0), 0, 0 if lane == here else 1, held.seq)

        return plain_key

    rank = caller_ranks(params, in_flight, sub_in_flight, vtc, tokens)
    own_get = in_flight.get
    if attained:

        def attained_key(
            lane: Lane,
            held: HeldTurn,
            rank: Rank1 = rank,
            own_get: Get = own_get,
            here: Lane | None = here,
        ) -> tuple[float, ...]:
            caller = held.caller
            return (
                rank(caller),
                own_get(caller, 0),
                0 if lane == here else 1,
                held.tier,
                held.seq,
            )

        return attained_key

    def key(
        lane: Lane,
        held: HeldTurn,
        rank: Rank1 = rank,
        own_get: Get = own_get,
        here: Lane | None = here,
    ) -> tuple[float, ...]:
        caller = held.caller
        return (rank(caller), own_get(caller, 0), 0 if lane == here else 1, held.seq)

    return key


def _weights(params: Params) -> dict[str, float]:
    """The configured weights other than 1."""
    return {name: p.weight for name, p in params.callers.items() if p.weight != 1.0}


def turn_cost(params: Params, name: str, prompt_tokens: int, completion_tokens: int) -> float:
    """How far a finished turn advances its account's (``name``) virtual counter."""
    cost = params.prompt_weight * max(0, prompt_tokens) + params.completion_weight * max(
        0, completion_tokens
    )
    return cost / caller_weight(params, name)


def served(
    params: Params, prompt_tokens: int, cached_tokens: int, completion_tokens: int, turn_s: float
) -> float:
    """A finished turn's addition to its run's attained service: its uncached prompt
    and completion tokens (the engine's work for it), or its seconds from admission to
    end (``attained_measure = "time"``)."""
    if params.attained_measure == "time":
        return max(0.0, turn_s)
    return float(max(0, prompt_tokens - max(0, cached_tokens)) + max(0, completion_tokens))


def tier(params: Params, attained: float) -> int:
    """A run's service level: 0 below ``ATTAINED_BASE``, one more per doubling."""
    base = ATTAINED_BASE.get(params.attained_measure, 1.0)
    if attained < base:
        return 0
    return min(MAX_TIER, 1 + int(math.log2(attained / base)))


def queue_caller(caller: str, level: int) -> str:
    """The caller part of a held turn's FIFO key: the caller itself at level 0 (always,
    while ``batch_order`` is not "attained"), else the caller and its level."""
    return caller if level == 0 else f"{caller}\x00{level}"


def lift(vtc: Map[str, float]) -> float:
    """The counter a caller becoming active starts from: the least active counter."""
    return min(vtc.values()) if len(vtc) else 0.0
