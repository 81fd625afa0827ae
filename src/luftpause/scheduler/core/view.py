"""The status snapshot (S12) as plain JSON-ready data. A read, not an event."""

from __future__ import annotations

from collections import Counter
from typing import Any

from luftpause.scheduler.core import target, working_set
from luftpause.scheduler.core.leases import tool_lease
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.types import EndpointKind, Params, RunPhase

TOOLS_SHOWN = 32  # the tool estimates the status lists: those with the most samples


def lapsed_by_replica(state: State) -> Counter[str]:
    """Runs paused on a tool past their lease, by the replica they last ran on."""
    return Counter(r.replica for r in state.runs.values() if r.lapsed and r.replica is not None)


def status(state: State, now: float) -> dict[str, Any]:
    """Per replica in-flight and capacity; held turns by class and caller with the
    oldest wait; runs by phase and class."""
    lapsed = lapsed_by_replica(state)
    params = state.params
    replicas = []
    for name in sorted(state.replicas):
        rep = state.replicas[name]
        replicas.append(
            {
                "name": name,
                "kind": rep.spec.kind.value,
                "models": sorted(rep.spec.models),
                "healthy": rep.healthy,
                "in_flight": rep.in_flight,
                "capacity": rep.cap,  # null: not limited
                "capacity_ramping": rep.ramping,  # S2: initial_cap's ramp, no queue seen yet
                "engine_orders_classes": rep.spec.orders_classes,
                "reserved_for_interactive": rep.reserved,
                "runs_pinned": rep.pinned_runs,
                # prefix keeping: new batch runs wait while runs_pinned reaches it
                "run_limit": rep.run_limit,
                # paused past their tool's lease: not counted in runs_pinned, no reservation
                "runs_lapsed": lapsed[name],
                "engine_running": rep.running,
                "engine_waiting": rep.waiting,
                "kv_usage": rep.kv_usage,
                "prefix_misses": rep.prefix_misses,
                # decode pace (interactive_pace_s): batch turns here and their limit while
                # an interactive run lives here (null: none), the smoothed s per token
                "batch_in_flight": rep.batch_in_flight,
                "batch_limit_from_pace": rep.pace_cap,
                "pace_s_per_token": None if rep.pace_s is None else round(rep.pace_s, 4),
                "best_pace_s_per_token": (
                    None if rep.pace_best_s is None else round(rep.pace_best_s, 4)
                ),
                # the interactive target (B7): replies here should stream under this many
                # s per token; the batch slots its limit keeps empty (null: no cap)
                "target_pace_s_per_token": _rounded(target.target_pace(params, rep.pace_best_s)),
                "batch_withheld_by_target": target.withheld(rep),
                "probed_s_ago": None if rep.probed_at is None else round(now - rep.probed_at, 3),
                # working-set admission (working_set.py): the engine's KV pool in tokens
                # (null: unknown) and the tokens the runs living here are expected to hold
                "kv_tokens": rep.kv_tokens,
                "working_set_tokens": working_set.working_set(rep),
                # membership (B11): "serving", "draining" (no new runs; its runs move at
                # drain_moves_s_from_now, or have moved: null) or "leaving" (gone; kept
                # while turns, runs or reservations still refer to it)
                "membership": _membership(state, name),
                "drain_moves_s_from_now": _drain_left(state, name, now),
            }
        )
    held: dict[str, dict[str, dict[str, Any]]] = {}
    for h in state.held.values():
        by_caller = held.setdefault(h.service_class.value, {})
        entry = by_caller.setdefault(
            h.caller, {"held": 0, "oldest_wait_s": 0.0, "oldest_trace_id": None}
        )
        entry["held"] += 1
        wait = round(now - h.requested_at, 3)
        if entry["held"] == 1 or wait > entry["oldest_wait_s"]:
            entry["oldest_wait_s"] = max(wait, 0.0)
            entry["oldest_trace_id"] = h.trace_id or None
    order: dict[str, Any] = {
        "fairness": state.params.fairness,
        "batch_order": state.params.batch_order,
    }
    if state.params.fairness == "tokens":
        # token fairness: each caller's virtual token counter (weighted prompt +
        # completion tokens of its finished turns), while it has a turn held or in flight
        order["caller_virtual_tokens"] = {c: round(v, 1) for c, v in sorted(state.vtc.items())}
    runs: dict[str, dict[str, int]] = {}
    for r in state.runs.values():
        by_class = runs.setdefault(r.phase.value, {})
        by_class[r.service_class.value] = by_class.get(r.service_class.value, 0) + 1
    return {
        "replicas": replicas,
        "held": {
            cls: {caller: held[cls][caller] for caller in sorted(held[cls])} for cls in sorted(held)
        },
        "held_total": len(state.held),
        "in_flight_total": sum(
            1 for t in state.turns.values() if t.kind is EndpointKind.GENERATIVE
        ),
        "runs": {phase: dict(sorted(v.items())) for phase, v in sorted(runs.items())},
        "runs_total": len(state.runs),
        "callers_in_flight": dict(sorted(state.caller_in_flight.items())),
        # B6: admitted turns per dataplane (each dataplane's in-flight, as the scheduler sees it)
        "in_flight_by_dataplane": dict(
            sorted(Counter(t.dataplane_id for t in state.turns.values()).items())
        ),
        # S11: dataplanes that stopped reporting -> seconds until their turns are released
        "dataplanes_lost": {
            dp: round(max(0.0, due - now), 3) for dp, due in sorted(state.lost_dataplanes.items())
        },
        # tool leases: how long runs stay away on each tool ("" = calls without a name)
        "tool_times": _tool_times(state),
        # B7: the interactive target the decode pace keeps, and what it costs batch work
        # now: the batch slots its limits keep empty on capped replicas
        "interactive_target": target_text(params),
        "batch_withheld_by_target": sum(r["batch_withheld_by_target"] or 0 for r in replicas),
        # held-turn order (order.py): which caller and which batch run go first
        "held_order": order,
    }


def _membership(state: State, name: str) -> str:
    if name in state.left:
        return "leaving"
    return "draining" if name in state.draining else "serving"


def _drain_left(state: State, name: str, now: float) -> float | None:
    """Seconds until a draining replica's runs move (None: not draining, or moved)."""
    until = state.draining.get(name)
    return None if until is None or until <= now else round(until - now, 3)


def target_text(params: Params) -> str:
    """``"1.3x"``, ``"100ms"`` or ``"off"``: the target as ``interactive_target`` says it."""
    if params.interactive_slowdown is not None:
        return f"{params.interactive_slowdown:g}x"
    if params.interactive_pace_s is not None:
        return f"{params.interactive_pace_s * 1000:g}ms"
    return "off"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _tool_times(state: State) -> dict[str, dict[str, Any]]:
    shown = sorted(state.tool_times.items(), key=lambda kv: (-kv[1].samples, kv[0]))
    return {
        name: {
            "mean_s": round(est.mean_s, 3),
            "dev_s": round(est.dev_s, 3),
            "samples": est.samples,
            "lease_s": round(tool_lease(state.params, state.tool_times, (name,)), 3),
        }
        for name, est in sorted(shown[:TOOLS_SHOWN])
    }


def run_status(state: State, run_id: str, now: float) -> dict[str, Any] | None:
    """One run as the scheduler sees it (S12), or None if it does not know the run."""
    run = state.runs.get(run_id)
    if run is None:
        return None
    return {
        "run_id": run.run_id,
        "phase": run.phase.value,
        "service_class": run.service_class.value,
        "caller": run.caller,
        "replica": run.replica,  # where its last turn ran (holds its prefix)
        "turns": run.turns,  # admitted
        "moves": run.moves,  # turns admitted elsewhere than the one before
        "in_flight": run.in_flight,
        "reserved_on": run.reserved_on,
        # tool leases: the tools it is paused on, and whether the pause outlived its lease
        "paused_tools": list(run.paused_tools),
        "lapsed": run.lapsed,
        "lease_s": (
            round(tool_lease(state.params, state.tool_times, run.paused_tools), 3)
            if run.phase is RunPhase.PAUSED_ON_TOOL
            else None
        ),
        "idle_s": round(max(now - run.last_active, 0.0), 3),
        "last_prompt_tokens": run.last_prompt,
        # held-turn order (batch_order = "attained"): what its finished turns were served,
        # in attained_measure units (tokens or seconds); 0 while that order is off
        "attained_service": round(run.attained, 3),
        "attained_measure": state.params.attained_measure,
    }
