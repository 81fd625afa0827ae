"""B13: the callers in ``/status`` (``callers`` and ``unconfigured_callers``). A read.

Per configured caller (``[[callers]]``, in configuration order): its weight and
``max_in_flight`` (from the core's ``Params.callers``), its account's turns in flight
and held (its own and its sub-callers'), its token limits with what is left of them
(:mod:`.quotas`), the turns refused for each limit since start, and its sub-callers
with turns in flight or held (the :data:`SUBS_SHOWN` busiest, then how many more).
Every other caller is summed in ``unconfigured_callers``, so that no turn goes
uncounted. Names only: keys never appear here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from luftpause.scheduler.core.order import account
from luftpause.scheduler.core.state import State
from luftpause.scheduler.service.quotas import Quotas

SUBS_SHOWN = 16


def callers_status(state: State, quotas: Quotas, now: float, wall: float) -> dict[str, Any]:
    """``{"callers": [...], "unconfigured_callers": {...}}`` for ``/status``."""
    configured = quotas.names
    known = set(configured)
    in_flight: Counter[str] = Counter()  # per caller, sub-callers apart
    held: Counter[str] = Counter()
    for caller, n in state.caller_in_flight.items():
        in_flight[caller] += n
    for h in state.held.values():
        held[h.caller] += 1
    subs: dict[str, set[str]] = {name: set() for name in configured}
    other: set[str] = set()
    other_in_flight = other_held = 0
    for caller in in_flight.keys() | held.keys():
        name = account(caller)
        if name in known:
            if caller != name:
                subs[name].add(caller)
        else:
            other.add(caller)
            other_in_flight += in_flight[caller]
            other_held += held[caller]
    out = []
    for name in configured:
        policy = state.params.callers.get(name)
        limits = quotas.limits(name)
        assert limits is not None
        bucket = quotas.bucket(name, now)
        ranked = sorted(subs[name], key=lambda c: (-(in_flight[c] + held[c]), c))
        out.append(
            {
                "name": name,
                "weight": 1.0 if policy is None else policy.weight,
                "max_in_flight": None if policy is None else policy.max_in_flight,
                # the account's: its own turns and its sub-callers'
                "in_flight": in_flight[name] + sum(in_flight[c] for c in subs[name]),
                "held": held[name] + sum(held[c] for c in subs[name]),
                "tokens_per_minute": limits.tokens_per_minute,
                # what is left in the bucket (below 0 after an overdraft; null: no limit)
                "tokens_per_minute_left": None if bucket is None else int(bucket),
                "daily_tokens": limits.daily_tokens,
                "tokens_today": quotas.today(name, wall),  # since 00:00 UTC
                "tokens_total": quotas.total(name),  # since the scheduler started
                "refused": quotas.refused(name),  # turns refused, by limit, since start
                "sub_callers": [
                    {"name": c, "in_flight": in_flight[c], "held": held[c]}
                    for c in ranked[:SUBS_SHOWN]
                ],
                "sub_callers_more": max(0, len(ranked) - SUBS_SHOWN),
            }
        )
    return {
        "callers": out,
        "unconfigured_callers": {
            "callers": len(other),
            "in_flight": other_in_flight,
            "held": other_held,
        },
    }
