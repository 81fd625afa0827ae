"""The flood's report: a pure rendering of its saved results (the ``--json`` file)
as Markdown (:func:`render`) and its frontier as SVG (:func:`render_plot`), so a saved run
re-renders byte for byte (``flood.py --report-from``).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from luftpause.measure import plot
from luftpause.measure.plot import Style
from tools.bench.arms.luftpause import STATUS_EVERY_S
from tools.bench.arms.plan import (
    CODING_ENGINE_ARGS,
    CODING_INTERACTIVE,
    INTERACTIVE_AGENTS,
    ROOT,
    TOOL_CALLS,
    Plan,
)
from tools.bench.arms.smg import (
    SMG_INTERACTIVE_RESERVED,
    SMG_KEY_HEADER,
    SMG_QUEUE_TIMEOUT_S,
    smg_scheduler_yaml,
)
from tools.bench.arms.vllm import VLLM_ENGINE_ARGS
from tools.bench.stats import ci_text, mean_ci, range_text
from tools.bench.stats import mean_or_none as _m


def _spread(values: list[float]) -> str:
    return ci_text(values)


def _f(value: float | None, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.0f}%" if pct else f"{value:.{digits}f}"


def aggregate(results: list[dict[str, Any]], cls: str, scale: float) -> dict[str, Any]:
    """Across repetitions: rates and times in model time."""
    rpm, rate, p50, p95, cached = [], [], [], [], []
    parts: dict[str, list[float]] = {
        k: [] for k in ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")
    }
    errors = 0
    for r in results:
        s = r["classes"].get(cls)
        if s is None:
            continue
        rpm.append(s["runs_per_min"] / scale)
        if s.get("runs_per_min_closed") is not None:
            rate.append(s["runs_per_min_closed"] / scale)
        if s["run_s"]["p50"] is not None:
            p50.append(s["run_s"]["p50"] * scale)
            p95.append(s["run_s"]["p95"] * scale)
        if s["cached_share"] is not None:
            cached.append(s["cached_share"])
        errors += s["error_count"]
        turn = s["turn"]
        held = r.get("held_by_class", {}).get(cls, {}).get("held_s")
        for k in parts:
            if k == "other_s" and r.get("held_in_other") and turn.get(k) is not None:
                # SMG's queue wait, measured by SMG, is out of the client's "other".
                parts[k].append(max(0.0, turn[k] - (held or 0.0)) * scale)
            elif turn.get(k) is not None:
                parts[k].append(turn[k] * scale)
            elif k == "held_s" and held is not None:
                parts[k].append(held * scale)
        if not turn["turns"]:  # sub-agents: the engine's side, all classes together
            e = r.get("engine_side", {})  # (the simulator has none: nothing to add)
            for k in ("queued_s", "prefill_s", "decode_s"):
                if e.get(k) is not None:
                    parts[k].append(e[k])
            if e.get("cached_share") is not None and not s["cached_share"]:
                cached.append(e["cached_share"])
    return {
        "rpm": rpm,
        "rate": rate,
        "p50": p50,
        "p95": p95,
        "cached": _m(cached),
        "errors": errors,
        "runs": sum(r["classes"].get(cls, {}).get("runs", 0) for r in results),
        **{k: _m(v) for k, v in parts.items()},
    }


def arm_table(
    rows: list[tuple[str, list[dict[str, Any]]]], scale: float, floor_s: float | None
) -> list[str]:
    lines = [
        "| arm | class | runs | runs/min | agents×60/mean | p50 s | p95 s | p50 / floor | "
        "cached | held s | queued s | prefill s | decode s | other s | errors | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, results in rows:
        loads = [r["load_avg"][0] for r in results]
        for cls in ("interactive", "batch"):
            a = aggregate(results, cls, scale)
            if not a["rpm"]:
                continue
            p50 = _m(a["p50"])
            slow = (p50 / floor_s) if (p50 is not None and floor_s) else None
            lines.append(
                f"| {name} | {cls} | {a['runs']} | {_spread(a['rpm'])} | {_spread(a['rate'])} | "
                f"{_spread(a['p50'])} | "
                f"{_spread(a['p95'])} | {_f(slow, 2)} | {_f(a['cached'], pct=True)} | "
                f"{_f(a['held_s'], 2)} | {_f(a['queued_s'], 2)} | {_f(a['prefill_s'], 2)} | "
                f"{_f(a['decode_s'], 2)} | {_f(a['other_s'], 2)} | {a['errors']} | "
                f"{range_text(loads)} |"
            )
    return lines


def rate(result: dict[str, Any], cls: str) -> float:
    """A closed loop's runs/min: agents × 60 / mean run time where known (it does not
    carry the window's rounding of up to one run per agent), else the count."""
    s = result["classes"][cls]
    closed = s.get("runs_per_min_closed")
    return float(closed if closed is not None else s["runs_per_min"])


def paired_ratios(
    results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str
) -> list[float]:
    """Per repetition, arm a's rate over arm b's: the two ran in the same round, under the
    most alike conditions (host load, the arms before them), so their ratio carries less
    of the round-to-round drift than a ratio of means."""

    def by_rep(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        return {int(r.get("rep", i)): r for i, r in enumerate(results)}

    a, b = by_rep(results_a), by_rep(results_b)
    out = []
    for k in sorted(a.keys() & b.keys()):
        if cls in a[k]["classes"] and cls in b[k]["classes"]:
            rb = rate(b[k], cls)
            if rb:
                out.append(rate(a[k], cls) / rb)
    return out


def turn_figure(result: dict[str, Any], cls: str, key: str) -> float | None:
    """From one arm's result, a figure of the turns of ``cls`` that ended in the window
    (engine-model time is left to the caller): ``p50``/``p95`` turn seconds, or
    ``tokens`` (reply tokens per minute)."""
    t = result["classes"].get(cls, {}).get("turns_ended")
    if not t:
        return None
    value = t["completion_tokens_per_min"] if key == "tokens" else t["wall_s"][key]
    return None if value is None else float(value)


def turn_values(results: list[dict[str, Any]], cls: str, key: str, scale: float) -> list[float]:
    """``turn_figure`` of each repetition that has it, in model time (seconds × scale,
    per-minute rates ÷ scale)."""
    values = (turn_figure(r, cls, key) for r in results)
    return [v / scale if key == "tokens" else v * scale for v in values if v is not None]


def paired_turn_ratios(
    results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str, key: str
) -> list[float]:
    """Per repetition, arm b's turn figure over arm a's (``p50``: how many times longer
    b's turns took than a's) or a's over b's (``tokens``: how much more work a did)."""
    a = {int(r.get("rep", i)): r for i, r in enumerate(results_a)}
    b = {int(r.get("rep", i)): r for i, r in enumerate(results_b)}
    out = []
    for k in sorted(a.keys() & b.keys()):
        fa, fb = turn_figure(a[k], cls, key), turn_figure(b[k], cls, key)
        if key == "tokens":
            if fb:  # luftpause doing no work at all is a ratio of 0, not a gap
                out.append((fa or 0.0) / fb)
        elif fa and fb:
            out.append(fb / fa)
    return out


def coding_table(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[str]:
    """The coding flood at one point: the turns that ended in the window, per arm and
    class, in model time (mean ± 95 % interval over the repetitions)."""
    lines = [
        "| arm | class | turns (all reps) | turn p50 s | turn p95 s | reply tokens/min "
        "| runs finished (all reps) | errors (all reps) | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, results in by_arm.items():
        loads = [r["load_avg"][0] for r in results if "load_avg" in r]  # none: simulated
        for cls in ("interactive", "batch"):
            ended = [r["classes"].get(cls, {}).get("turns_ended") for r in results]
            if not any(ended):
                continue
            p50 = turn_values(results, cls, "p50", scale)
            p95 = turn_values(results, cls, "p95", scale)
            tok = turn_values(results, cls, "tokens", scale)
            lines.append(
                f"| {name} | {cls} | {sum(t['turns'] for t in ended if t)} | "
                f"{ci_text(p50, 2)} | {ci_text(p95, 2)} | {ci_text(tok, 0)} | "
                f"{sum(r['classes'].get(cls, {}).get('runs', 0) for r in results)} | "
                f"{sum(r['classes'].get(cls, {}).get('error_count', 0) for r in results)} | "
                f"{range_text(loads)} |"
            )
    return lines


# The head of coding_goals' table.
CODING_GOALS_HEAD = (
    "| arm | interactive turn p50, arm / luftpause | batch work, luftpause vs arm |",
    "|---|---|---|",
)


def coding_goals(by_arm: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """luftpause against each other arm, per repetition: the other arm's interactive turn
    p50 over luftpause's (> 1×: luftpause's interactive turns are faster), and luftpause's
    batch reply tokens/min as a change on the other's. Returns the cells and one line per
    arm for the summary."""
    cells, lines = [], []
    ours = by_arm.get("luftpause", [])
    for name, results in by_arm.items():
        if name == "luftpause" or not ours:
            continue
        inter = ratio_text(paired_turn_ratios(ours, results, "interactive", "p50"))
        batch = ratio_text(paired_turn_ratios(ours, results, "batch", "tokens"), change=True)
        cells.append(f"| {name} | {inter} | {batch} |")
        lines.append(f"{name}: interactive turn p50 {name}/luftpause {inter}, batch work {batch}")
    return cells, lines


def ratio(results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str) -> float:
    """The mean of the per-repetition ratios (nan when there is none)."""
    values = paired_ratios(results_a, results_b, cls)
    return statistics.fmean(values) if values else float("nan")


def ratio_text(values: list[float], change: bool = False) -> str:
    """A ratio's mean (``1.42×``, or ``+3 %`` as a change) and its 95 % t-interval's
    half-width over the repetitions, where there are several."""
    if not values:
        return "-"
    mean, half = mean_ci(values)
    if change:
        return f"{(mean - 1) * 100:+.0f} %" + (f" ± {half * 100:.0f}" if half is not None else "")
    return f"{mean:.2f}×" + (f" ± {half:.2f}" if half is not None else "")


NO_VERDICT = "no verdict (the luftpause or router arm did not run)"
SATURATED_QUEUE_S = (
    2.0  # router arm: interactive engine-queue seconds per run that count as "seconds"
)


def goals_own(
    by_arm: dict[str, list[dict[str, Any]]], scale: float, target: float
) -> tuple[list[str], list[str], list[str]]:
    """Cells, missed goals and an explanation for one load point of a flood."""
    lp, ro = by_arm.get("luftpause", []), by_arm.get("router", [])
    inter = ratio(lp, ro, "interactive")
    batch = ratio(lp, ro, "batch")
    a_ro, a_lp = aggregate(ro, "interactive", scale), aggregate(lp, "interactive", scale)
    b_lp = aggregate(lp, "batch", scale)
    turns = _m([r["classes"]["interactive"]["turns_per_run"] or 0 for r in ro]) or 0.0
    router_queue = a_ro["queued_s"]
    per_run = (router_queue or 0.0) * turns
    saturated = per_run >= SATURATED_QUEUE_S
    cells = [
        ratio_text(paired_ratios(lp, ro, "interactive")),
        ratio_text(paired_ratios(lp, ro, "batch"), change=True),
        f"{per_run:.1f}",
    ]
    verdicts = []
    if inter < 0.98:
        verdicts.append(f"interactive {inter:.2f}× < 0.98× the router")
    if inter < 1.1 and abs(batch - 1) > 0.05:
        verdicts.append(f"batch {(batch - 1) * 100:+.0f} % where the gain is < 1.1× (limit ±5 %)")
    elif batch < 0.9:
        verdicts.append(f"batch {(batch - 1) * 100:+.0f} % (limit −10 %)")
    if saturated and target > 1 and inter < target:
        verdicts.append(f"saturated (router queue {per_run:.1f} s/run): {inter:.2f}× < {target}×")
    if "engine-prio" in by_arm:
        vs_prio = ratio(lp, by_arm["engine-prio"], "interactive")
        cells.append(ratio_text(paired_ratios(lp, by_arm["engine-prio"], "interactive")))
        if vs_prio < 0.98:
            verdicts.append(f"interactive {vs_prio:.2f}× the engine-priority arm (< 0.98×)")
    if "smg" in by_arm:  # the headline peer: shown, not (yet) part of the verdict
        cells.append(ratio_text(paired_ratios(lp, by_arm["smg"], "interactive")))
        cells.append(ratio_text(paired_ratios(lp, by_arm["smg"], "batch"), change=True))
    if not lp or not ro:  # --arms left one out: nothing to judge
        cells.append(NO_VERDICT)
    else:
        cells.append("met" if not verdicts else "**missed**: " + "; ".join(verdicts))

    def parts(a: dict[str, Any]) -> str:
        return ", ".join(
            f"{k.removesuffix('_s')} {a[k]:.2f}"
            for k in ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")
            if a.get(k) is not None
        )

    smg = (
        f"; SMG {parts(aggregate(by_arm['smg'], 'interactive', scale))}" if "smg" in by_arm else ""
    )
    why = [
        f"interactive turn (s): router {parts(a_ro)}; luftpause {parts(a_lp)}{smg}",
        f"batch turn through luftpause (s): {parts(b_lp)}",
    ]
    return cells, verdicts, why


def engine_lines(by_arm: dict[str, list[dict[str, Any]]], load: int) -> list[str]:
    """What the two engines did during each arm (all classes): the share of their busy
    time spent prefilling, their mean decode batch, the cached share of the prompt tokens
    they served, and how far the host's CPU let them fall behind the model."""
    parts = []
    for name, results in by_arm.items():
        sides = [r.get("engine_side", {}) for r in results]
        pre = _m([e["prefill_share"] for e in sides if e.get("prefill_share") is not None])
        batch = _m([e["decode_batch"] for e in sides if e.get("decode_batch") is not None])
        cached = _m([e["cached_share"] for e in sides if e.get("cached_share") is not None])
        behind = _m([e["behind"] for e in sides if e.get("behind") is not None])
        if pre is None:
            continue
        parts.append(
            f"{name} prefill {_f(pre, pct=True)} of busy time, decode batch {_f(batch)}, "
            f"cached {_f(cached, pct=True)}, behind {_f(behind, pct=True)}" + _split_text(sides)
        )
    return [f"Engines at {load}: " + "; ".join(parts) + ".", ""] if parts else []


def _per_replica(figures: list[dict[str, Any]], replicas: list[str], key: str) -> str:
    """``key`` of each replica, the mean over repetitions of each window's median."""
    return " / ".join(
        _f(
            _m(
                [
                    f["replicas"][n][key]
                    for f in figures
                    if f["replicas"].get(n, {}).get(key) is not None
                ]
            )
        )
        for n in replicas
    )


def scheduler_lines(by_arm: dict[str, list[dict[str, Any]]], load: int) -> list[str]:
    """What each luftpause arm's scheduler did over the window (medians of its
    ``/status``, mean over repetitions): each replica's cap and batch limit from the
    decode pace, its turns in flight, and the turns held in all."""
    parts = []
    for name, results in by_arm.items():
        figures = [r["scheduler"] for r in results if r.get("scheduler")]
        if not figures:
            continue
        replicas = list(figures[0]["replicas"])
        held = _m([f["held"] for f in figures if f.get("held") is not None])
        parts.append(
            f"{name} cap {_per_replica(figures, replicas, 'capacity')}, batch limit from the "
            f"pace {_per_replica(figures, replicas, 'batch_limit_from_pace')}, in flight "
            f"{_per_replica(figures, replicas, 'in_flight')}, held {_f(held)}"
        )
    if not parts:
        return []
    return [
        f"Scheduler at {load} (medians of its /status over the window, mean over "
        "repetitions; per replica): " + "; ".join(parts) + ".",
        "",
    ]


def _split_text(sides: list[dict[str, Any]]) -> str:
    """How the arm spread its requests and decode batches over the engines, mean over
    repetitions (runs without a per-engine record, from before it existed: "")."""
    per = [e["engines"] for e in sides if len(e.get("engines") or []) > 1]
    if not per:
        return ""
    n = min(len(p) for p in per)
    shares, batches = [], []
    for i in range(n):
        shares.append(
            _m([p[i]["requests"] / total for p in per if (total := sum(x["requests"] for x in p))])
        )
        batches.append(_m([b for p in per if (b := p[i]["decode_batch"]) is not None]))
    return (
        ", requests by engine "
        + " / ".join(_f(v, 0, pct=True) for v in shares)
        + ", decode batch by engine "
        + " / ".join(_f(v) for v in batches)
    )


# ------------------------------------------------------------------ the SMG frontier


@dataclass(frozen=True)
class Point:
    """One arm on the frontier plot: batch runs/min (x) against interactive runs/min (y),
    model time, agents×60/mean; ``xh``/``yh``: 95 % t-interval half-widths (None: one
    repetition)."""

    name: str
    x: float
    y: float
    xh: float | None = None
    yh: float | None = None

    @property
    def kind(self) -> str:
        for prefix in SWEPT:
            rest = self.name.removeprefix(prefix)
            if rest != self.name and _number(rest) is not None:
                return prefix
        return self.name

    @property
    def cap(self) -> float | None:
        """The swept setting of a sweep's point: SMG's capacity C, the decode pace target
        MS, the interactive target's slowdown S, vLLM router's token capacity T."""
        kind = self.kind
        return _number(self.name[len(kind) :]) if kind in SWEPT else None


# Arms swept over a setting written after their name: smg-cap16, luftpause-x1.3 ...
SWEPT = ("smg-cap", "smg-fifo", "luftpause-pace", "luftpause-x", "luftpause-pack-x",
         "vllm-prog-kv")  # fmt: skip
SWEPT_LABEL = {
    "luftpause-pace": "MS", "luftpause-x": "S", "luftpause-pack-x": "S", "vllm-prog-kv": "T",
}  # fmt: skip


def _number(text: str) -> float | None:
    """``"16"`` -> 16, ``"1.3"`` -> 1.3; None for anything else."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 and text.strip() == text else None


FRONTIER_ORDER = ("luftpause", "luftpause-x", "luftpause-pack-x", "luftpause-wset",
                  "luftpause-no-pk", "luftpause-no-pace", "luftpause-pace", "smg", "smg-cap",
                  "smg-fifo", "vllm-router", "vllm-prog", "vllm-prog-kv", "router",
                  "engine-prio")  # fmt: skip
FRONTIER_LABEL = {
    "luftpause": "luftpause",
    "luftpause-no-pk": "luftpause, no prefix keeping",
    "luftpause-no-pace": "luftpause, no decode pace",
    "luftpause-pace": "luftpause, decode pace target MS ms",
    "luftpause-x": "luftpause, interactive target S x the floor",
    "luftpause-pack-x": "luftpause, interactive target S x the floor, packing",
    "luftpause-wset": "luftpause, working-set admission",
    "smg": "SMG (priority scheduler, engines' own capacity)",
    "smg-cap": "SMG priority scheduler, capacity C",
    "smg-fifo": "SMG FIFO cap (--max-concurrent-requests C)",
    "router": "SGLang router (cache_aware)",
    "engine-prio": "engine priority, no proxy",
    "vllm-router": "vLLM router (cache_aware)",
    "vllm-prog": "vLLM router, program scheduling",
    "vllm-prog-kv": "vLLM router, program scheduling, token capacity T",
}


def frontier_points(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[Point]:
    """Every arm of one load point as a frontier point, in ``FRONTIER_ORDER`` (caps
    ascending)."""
    return _points(
        by_arm,
        lambda results: (
            aggregate(results, "batch", scale)["rate"],
            aggregate(results, "interactive", scale)["rate"],
        ),
    )


def coding_points(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[Point]:
    """The coding flood's arms at one load point as frontier points: batch reply
    tokens/min (x) against the interactive turn p50 in seconds (y, lower is better),
    model time, in ``FRONTIER_ORDER``."""
    return _points(
        by_arm,
        lambda results: (
            turn_values(results, "batch", "tokens", scale),
            turn_values(results, "interactive", "p50", scale),
        ),
    )


def _points(
    by_arm: dict[str, list[dict[str, Any]]],
    figures: Callable[[list[dict[str, Any]]], tuple[list[float], list[float]]],
) -> list[Point]:
    """One point per arm from ``figures`` (an arm's repetitions -> their x and y values):
    the means and 95 % half-widths, arms in ``FRONTIER_ORDER``, a sweep's caps ascending;
    an arm with no values on either axis is left out."""
    points = []
    for name, results in by_arm.items():
        x, y = figures(results)
        if not x or not y:
            continue
        (xm, xh), (ym, yh) = mean_ci(x), mean_ci(y)
        points.append(Point(name, xm, ym, xh, yh))
    return sorted(points, key=_frontier_key)


def _frontier_key(p: Point) -> tuple[int, float]:
    """Arms in ``FRONTIER_ORDER``, a sweep's settings ascending."""
    kind = FRONTIER_ORDER.index(p.kind) if p.kind in FRONTIER_ORDER else len(FRONTIER_ORDER)
    return kind, p.cap or 0


CODING_AXES = {
    "x_label": "batch reply tokens/min (model time)",
    "y_label": "interactive turn p50 s (lower is better)",
}


def frontier_table(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[str]:
    """The markdown table of one load point's frontier."""
    lines = [
        "| arm | cap C | interactive runs/min | batch runs/min | interactive p50 s "
        "| batch p50 s | failed runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in frontier_points(by_arm, scale):
        results = by_arm[p.name]
        inter, batch = aggregate(results, "interactive", scale), aggregate(results, "batch", scale)
        lines.append(
            f"| {p.name} | {'-' if p.cap is None else f'{p.cap:g}'} | {ci_text(inter['rate'])} | "
            f"{ci_text(batch['rate'])} | {ci_text(inter['p50'])} | {ci_text(batch['p50'])} | "
            f"{inter['errors'] + batch['errors']} |"
        )
    return lines


PEERS = ("smg", "router", "engine-prio", "vllm-")  # arm name prefixes of the peers


def frontier_goals(
    points: list[Point], floor: float | None = None, lower_is_better: bool = False
) -> list[str]:
    """luftpause's frontier (its default point and its interactive target's points,
    ``luftpause-xS``) against each peer's point, as the goal states it: at the peer's
    batch work, luftpause's interactive service is at least 1.5x the peer's (or within
    1.2x of ``floor``, the interactive figure of the interactive agents alone, whichever
    asks less); at the peer's interactive service, luftpause's batch work is at least
    1.5x the peer's; and the default point's interactive service at least 0.98x the
    peer's. Only measured points count (no interpolation). ``lower_is_better``: the
    interactive figure is a time (a turn p50), so "1.5x better" means 1/1.5 of it."""
    ours = [p for p in points if p.kind in ("luftpause", "luftpause-x")]
    default = next((p for p in points if p.name == "luftpause"), None)

    def better(a: float, b: float, factor: float = 1.0) -> bool:  # a at least factor x b
        return a * factor <= b if lower_is_better else a >= b * factor

    def ratio(a: float, b: float) -> float:  # how many times better a is than b
        return (b / a if a else math.inf) if lower_is_better else (a / b if b else math.inf)

    lines = [
        "| peer | peer interactive / batch | luftpause's best interactive at ≥ its batch "
        "| × (goal) | luftpause's best batch at ≥ its interactive | × (goal 1.5) "
        "| default's interactive × | goals met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for peer in points:
        if not peer.name.startswith(PEERS):
            continue
        goal = 1.5
        if floor is not None:  # within 1.2x of the floor asks less: take it
            near_floor = ratio(floor / 1.2 if not lower_is_better else floor * 1.2, peer.y)
            goal = min(goal, max(near_floor, 0.0))
        at_batch = [p.y for p in ours if p.x >= peer.x]
        best_y = (min if lower_is_better else max)(at_batch) if at_batch else None
        at_inter = [p.x for p in ours if better(p.y, peer.y)]
        best_x = max(at_inter) if at_inter else None
        r1 = None if best_y is None else ratio(best_y, peer.y)
        r2 = None if best_x is None else best_x / peer.x if peer.x else None
        r3 = None if default is None else ratio(default.y, peer.y)
        met = [
            r1 is not None and r1 >= goal - 1e-9,
            r2 is not None and r2 >= 1.5,
            r3 is not None and r3 >= 0.98,
        ]
        lines.append(
            f"| {peer.name} | {peer.y:.1f} / {peer.x:.0f} | "
            f"{'-' if best_y is None else f'{best_y:.1f}'} | "
            f"{'-' if r1 is None else f'{r1:.2f}'} ({goal:.2f}) | "
            f"{'-' if best_x is None else f'{best_x:.0f}'} | "
            f"{'-' if r2 is None else f'{r2:.2f}'} | "
            f"{'-' if r3 is None else f'{r3:.2f}'} | {sum(met)}/3 |"
        )
    return lines


SVG_STYLE = {  # kind -> its colour, marker and fill on the frontier plot
    "luftpause": Style("#d62728", "circle", True),
    "luftpause-no-pk": Style("#d62728", "circle", False),
    "luftpause-no-pace": Style("#d62728", "square", False),
    "luftpause-pace": Style("#d62728", "square", True),
    "luftpause-x": Style("#d62728", "diamond", True),
    "luftpause-pack-x": Style("#d62728", "diamond", False),
    "luftpause-wset": Style("#d62728", "triangle", True),
    "smg": Style("#1f77b4", "circle", False),
    "smg-cap": Style("#1f77b4", "circle", True),
    "smg-fifo": Style("#ff7f0e", "square", True),
    "router": Style("#555555", "triangle", False),
    "engine-prio": Style("#555555", "diamond", False),
    "vllm-router": Style("#2ca02c", "triangle", False),
    "vllm-prog": Style("#2ca02c", "circle", True),
    "vllm-prog-kv": Style("#2ca02c", "square", True),
}


def frontier_svg(
    panels: list[tuple[str, list[Point]]],
    title: str,
    subtitle: str = "",
    x_label: str = "batch runs/min (model time)",
    y_label: str = "interactive runs/min",
) -> str:
    """Per panel (one load point), batch work (x) against interactive service (y; by
    default runs/min of each); SMG's capacity sweeps and luftpause's targets as lines
    through their settings, every other arm a marker; whiskers are 95 % t-intervals over
    the repetitions (luftpause.measure.plot draws it)."""
    return plot.svg(
        [
            plot.Panel(
                name,
                [
                    plot.Mark(
                        p.x, p.y, p.kind, p.xh, p.yh,
                        "" if p.cap is None else f"{SWEPT_LABEL.get(p.kind, 'C')}={p.cap:g}",
                    )
                    for p in points
                ],
                x_label,
                y_label,
            )
            for name, points in panels
        ],
        title,
        SVG_STYLE,
        FRONTIER_LABEL,
        subtitle=subtitle,
        joined=("smg-cap", "smg-fifo", "luftpause-pace", "luftpause-x", "luftpause-pack-x"),
        legend_slots=len(SVG_STYLE),
    )  # fmt: skip


def plot_svg(
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]],
    plan: Plan,
    code: str,
) -> str | None:
    """The own-loop flood's frontier as SVG, or, for a coding flood alone, its interactive
    turn p50 against batch reply tokens/min; None when there is neither."""
    reps = f"{plan.reps} repetition{'s' if plan.reps != 1 else ''}"
    subtitle = (
        f"time scale {plan.time_scale:g}, {reps}, SMG placing runs by {plan.smg_policy}, "
        f"whiskers 95 % t-intervals; code {code or 'unknown'}"
    )
    own = results.get("own")
    if not own:
        coding = results.get("coding")
        if not coding:
            return None
        panels = [
            (f"{load} batch + {CODING_INTERACTIVE} interactive coding agents",
             coding_points(by_arm, plan.time_scale))
            for load, by_arm in sorted(coding.items(), key=lambda kv: int(kv[0]))
        ]  # fmt: skip
        title = "Coding flood: interactive turn p50 against batch reply tokens/min (model time)"
        return frontier_svg(panels, title, subtitle, **CODING_AXES)
    panels = [
        (f"{load} batch + {INTERACTIVE_AGENTS} interactive agents",
         frontier_points(by_arm, plan.time_scale))
        for load, by_arm in sorted(own.items())
    ]  # fmt: skip
    title = "Own-loop flood: interactive against batch runs/min (agents×60/mean, model time)"
    return frontier_svg(panels, title, subtitle)


def code_version() -> str:
    """The checkout's commit (``git rev-parse --short HEAD``) and whether the working tree
    matched it: what a report measured. Dirty: a tracked file changed, or an untracked
    file under src/ or tools/ (code the run may have imported)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", "."],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    except OSError:
        return ""
    if not head:
        return ""
    changed = [
        line[3:]
        for line in status
        if not line.startswith("??") or line[3:].startswith(("src/", "tools/"))
    ]
    if not changed:
        return f"{head} (working tree clean)"
    return f"{head} (working tree dirty: {len(changed)} file(s) differ from it)"


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


def report(
    plan: Plan,
    command: str,
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]],
    floors: dict[int, float],
    started: str,
    minutes: float,
    load_before: tuple[float, ...],
    rendered: str = "",
    code: str = "",
    host: str = "",
) -> str:
    """The markdown report. ``rendered``: the ``--report-from`` command that re-rendered
    a saved run (the results are that run's; only the text around them is newer);
    ``host``: the machine it ran on (:func:`machine`)."""
    sc = plan.time_scale
    setups: dict[str, str] = {}
    routers: dict[str, dict[str, Any]] = {}
    for per_load in results.values():
        for by_arm in per_load.values():
            for name, runs in by_arm.items():
                for r in runs:
                    if r.get("router"):
                        routers.setdefault(name, dict(r["router"]))
                    elif r.get("setup"):
                        setups.setdefault(name, str(r["setup"]))
    smg_lines = (
        [
            "- SMG arms (PyPI `smg` 1.13.0, the SGLang Model Gateway, in front of the same two "
            "engines; [how they run](../methodology.md#smg-arms)): `x-smg-priority` "
            f"interactive / bulk, the run ID in `{SMG_KEY_HEADER}` (sticky sessions), "
            f"`{plan.smg_policy}` placing a run's first turn, engine priorities 10 / 0; "
            f"`smg-capC` with {SMG_INTERACTIVE_RESERVED} of its C slots reserved for "
            f"`interactive`. Queue timeouts {SMG_QUEUE_TIMEOUT_S:g} s, starvation thresholds "
            f"SMG's defaults, its load poll (`--load-monitor-interval`) every "
            f"{plan.smg_load_poll_s:g} s, all in model time (÷ the time scale, rounded up). "
            "Command lines:",
            *(f"  - `{name}`: `{text}`" for name, text in sorted(setups.items())),
            "  - priority-scheduler config (`smg-priority.yaml`), time scale "
            f"{sc:g}: `" + smg_scheduler_yaml(sc).replace("\n", " ").strip() + "`",
        ]
        if setups
        else []
    )
    header = [
        "# Benchmarks",
        "",
        "Measured by `tools/bench/flood.py` (generated file: rerun the command to refresh it). "
        "What is not particular to this run (the arms, repetitions and intervals, the window, "
        "every column and line) is explained once in [Methodology](../methodology.md).",
        "",
        f"- command: `{command}`",
        *(
            [f"- this file: re-rendered from that run's raw results by `{rendered}`"]
            if rendered
            else []
        ),
        f"- code measured: commit {code or 'unknown (not a git checkout)'}",
        f"- date: {started}; duration {minutes:.1f} min",
        f"- machine: {host}; load average before the run "
        f"{' / '.join(f'{x:.2f}' for x in load_before)} (other work shares these cores: "
        "each table lists the 1-minute load average of its arms)",
        "- engines: two fake engines (`docs/guides/calibration.md` defaults"
        + (
            f"; the coding flood's with `{' '.join(CODING_ENGINE_ARGS)}`"
            if "coding" in results
            else ""
        )
        + ", `--priority-scheduling`, interactive turns priority 10 and batch 0), "
        f"time scale {sc:g}. **Every time and rate below is in the engine model's time** "
        f"(measured seconds × {sc:g}, runs/min ÷ {sc:g}).",
        "- luftpause arm: the scheduler's defaults (the decode pace's target 100 ms per token "
        "in model time)",
        *smg_lines,
        *vllm_router_lines(routers),
        f"- repetitions: {plan.reps} per arm and load point, arms in Williams Latin square "
        "order; a cell with several shows mean ± the half-width of its 95 % confidence "
        "interval, ratios between arms per repetition",
        f"- window: max({plan.window_s:g} s, 1.5 s × batch agents) measured after "
        f"max({plan.warmup_s:g} s, 1 s × batch agents) of warm-up (floods), the agents "
        + ("starting spread over its first half; " if plan.ramp else "all starting at once; ")
        + f"{plan.light_window_s:g} s (light), {plan.routing_window_s:g} s (routing)",
        f"- every run: system preamble + own task, {TOOL_CALLS} `lookup` calls (fake-mcp, "
        "~1 s each), replies capped at 256 tokens; interactive agents: "
        f"{INTERACTIVE_AGENTS}; replies drawn from each run's plan key (`--plan-seed`, the "
        "same for every arm of a repetition)",
        f"- scheduler lines: its `/status` read every {STATUS_EVERY_S:g} s",
        "",
    ]
    out: list[str] = []
    if floors:
        out += ["## Floor (one interactive agent alone on an idle engine)", ""]
        out += ["| context chars | p50 run s |", "|---|---|"]
        out += [f"| {c} | {v:.1f} |" for c, v in sorted(floors.items())]
        out.append("")
    titles = {
        "own": ("1. Own-loop flood", 2.0, 8000),
        "mcp": ("2. MCP flood (sub-agents through the runtime)", 2.7, 8000),
        "light": ("3. Light load (2,000-character contexts)", 0.0, 2000),
        "routing": ("4. Routing only (8 sub-agents, no saturation)", 0.0, 8000),
        "fanout": ("5. Fan-out (16 sub-agents)", 0.0, 11000),
        "coding": ("6. Coding-agent runs (shaped like real traces)", 0.0, 0),
    }
    summary: list[str] = []
    for bench, (title, target, ctx) in titles.items():
        if bench not in results:
            continue
        out += [f"## {title}", ""]
        per_load = results[bench]
        if bench in ("own", "mcp", "light"):
            goal_rows = []
            for load, by_arm in sorted(per_load.items()):
                out += [f"### {load} batch + {INTERACTIVE_AGENTS} interactive", ""]
                out += arm_table(list(by_arm.items()), sc, floors.get(ctx))
                out.append("")
                cells, verdicts, why = goals_own(by_arm, sc, target)
                goal_rows.append(f"| {load} | " + " | ".join(cells) + " |")
                out += [f"Where the time went at {load}: " + "; ".join(why) + ".", ""]
                out += engine_lines(by_arm, load)
                out += scheduler_lines(by_arm, load)
                if bench == "own" and any(n.startswith("smg") for n in by_arm):
                    out += [
                        f"SMG's frontier at {load}: every arm's interactive against batch "
                        "runs/min (agents×60/mean, model time), SMG's capacity sweeps by cap C"
                        + (" (plot: the `--plot` SVG)" if len(by_arm) > 1 else "")
                        + ".",
                        "",
                        *frontier_table(by_arm, sc),
                        "",
                    ]
                    floor_p50 = floors.get(ctx)
                    floor_rate = (
                        INTERACTIVE_AGENTS * 60 / floor_p50 if floor_p50 else None
                    )  # (the alone run's p50 as its mean: agents x 60 / run time)
                    out += [
                        "luftpause's frontier (its default and its interactive targets) "
                        "against each peer"
                        + (
                            f" (the floor: {INTERACTIVE_AGENTS} interactive agents alone, "
                            f"~{floor_rate:.1f} runs/min)"
                            if floor_rate
                            else ""
                        )
                        + ":",
                        "",
                        *frontier_goals(frontier_points(by_arm, sc), floor_rate),
                        "",
                    ]
                vs_smg = (
                    "; against SMG (not part of the verdict): interactive "
                    + ratio_text(paired_ratios(by_arm["luftpause"], by_arm["smg"], "interactive"))
                    + ", batch "
                    + ratio_text(
                        paired_ratios(by_arm["luftpause"], by_arm["smg"], "batch"), change=True
                    )
                    if "smg" in by_arm and "luftpause" in by_arm
                    else ""
                )
                judged = "luftpause" in by_arm and "router" in by_arm
                summary.append(
                    f"- {bench} {load}: "
                    + (
                        ("met" if not verdicts else "missed (" + "; ".join(verdicts) + ")")
                        if judged
                        else NO_VERDICT
                    )
                    + vs_smg
                    + vs_vllm_text(by_arm)
                )
            head = (
                "| batch agents | interactive luftpause/router | batch luftpause vs router "
                "| router interactive engine-queue s per run |"
            )
            sep = "|---|---|---|---|"
            if any("engine-prio" in v for v in per_load.values()):
                head += " interactive luftpause/engine-prio |"
                sep += "---|"
            if any("smg" in v for v in per_load.values()):
                head += " interactive luftpause/SMG | batch luftpause vs SMG |"
                sep += "---|---|"
            out += ["Goals:", "", head + " verdict |", sep + "---|", *goal_rows, ""]
        elif bench == "routing":
            by_arm = per_load[plan.routing_agents]
            out += arm_table(list(by_arm.items()), sc, floors.get(ctx))
            aff = aggregate(by_arm.get("luftpause", []), "batch", sc)["cached"]
            ca = aggregate(by_arm.get("router-cache", []), "batch", sc)["cached"]
            ok = aff is not None and ca is not None and aff >= ca - 0.005
            line = (
                f"Affinity's cached share {_f(aff, pct=True)} vs router cache_aware "
                f"{_f(ca, pct=True)}: {'met' if ok else '**missed**'}."
            )
            out += ["", line, ""]
            summary.append(f"- routing: {'met' if ok else 'missed'} ({line})")
        elif bench == "fanout":
            out += [
                "| arm | wall s (all 16) | vs sequential | per sub-agent p50 s | p95 s | failed |",
                "|---|---|---|---|---|---|",
            ]
            by_arm = per_load[plan.fanout_n]
            seq = [r["fan_out"] for r in by_arm.get("sequential", [])]
            ws = _m([f["wall_s"] * sc for f in seq])
            for name in ("luftpause", "router", "sequential"):
                rows = [r["fan_out"] for r in by_arm.get(name, [])]
                if not rows:
                    continue
                w = _m([f["wall_s"] * sc for f in rows])
                gain = (ws / w) if (ws and w) else None
                label = "one after another" if name == "sequential" else f"{name}, all together"
                out.append(
                    f"| {label} | {_spread([f['wall_s'] * sc for f in rows])} | "
                    + ("—" if name == "sequential" else f"{_f(gain)}×")
                    + f" | {_f(_m([(f['subagent_s']['p50'] or 0) * sc for f in rows]))} | "
                    f"{_f(_m([(f['subagent_s']['p95'] or 0) * sc for f in rows]))} | "
                    f"{sum(f['failed'] for f in rows)} |"
                )
                if name != "sequential":
                    ok = gain is not None and gain >= 5
                    summary.append(
                        f"- fan-out via {name}: {_f(gain)}× sequential "
                        f"({'met' if ok else 'missed'}: goal ≥ 5×)"
                    )
            out.append("")
        elif bench == "coding":
            out += [
                f"{CODING_INTERACTIVE} interactive agents beside N batch agents, every run "
                "sampled from `--profile coding-agent` (`docs/guides/workloads.md`), "
                f"engines `{' '.join(CODING_ENGINE_ARGS)}`; "
                f"{plan.coding_window_s:g} s measured after {plan.coding_warmup_s:g} s of "
                "warm-up (model time), the agents "
                + ("starting over its first half" if plan.ramp else "all starting at once")
                + ". Every arm of a repetition plays the same runs, slot for slot (the load "
                "generator's `--plan-seed`), under prompt text of its own"
                + ". A run takes longer than the window, so the arms are compared by the "
                "**turns that ended in the window** (finished runs or not): turn time (request "
                "to last token) and reply tokens per minute; a turn that failed is not in "
                "them but under *errors* (its run failed). The SMG arm's engines report a "
                "larger capacity here (their KV pool is larger), still more than the load "
                "ever asks for, so nothing waits in SMG.",
                "",
            ]
            for load, by_arm in sorted(per_load.items()):
                out += [f"### {load} batch + {CODING_INTERACTIVE} interactive", ""]
                out += coding_table(by_arm, sc)
                cells, lines = coding_goals(by_arm)
                out += [
                    "",
                    "luftpause against each arm, per repetition (mean ± 95 % interval): the "
                    "arm's interactive turn p50 over luftpause's (above 1×: luftpause's "
                    "interactive turns are faster), and luftpause's batch reply tokens/min "
                    "as a change on the arm's:",
                    "",
                    *CODING_GOALS_HEAD,
                    *cells,
                    "",
                ]
                out += engine_lines(by_arm, load)
                out += scheduler_lines(by_arm, load)
                summary += [f"- coding {load}: {line}" for line in lines]
    return "\n".join([*header, "## Goals at a glance", "", *summary, "", *out]) + "\n"


def vllm_router_lines(routers: dict[str, dict[str, Any]]) -> list[str]:
    """The report's description of the vLLM router arms that ran (``routers``: arm ->
    its ``router`` record): version, engines, how runs are named, every command line."""
    if not routers:
        return []
    first = next(iter(routers.values()))
    kv = next((r["kv_pool_tokens"] for r in routers.values() if r.get("kv_pool_tokens")), None)
    flags = " ".join(first.get("loadgen_program_flags", []))
    return [
        f"- vLLM router arms (PyPI `vllm-router` {first.get('version', '?')}, vLLM's router) "
        f"in front of two more fake engines, the same but `{' '.join(VLLM_ENGINE_ARGS)}` "
        "(its program scheduling reads vLLM's gauges from each engine's `/metrics`): "
        "`vllm-router` without program scheduling, `vllm-prog` with it (its defaults; the "
        "load generator names each run's program in the body's "
        "`vllm_xargs.agentic_context`), `vllm-prog-kv` the same with `token_capacity_per_target` "
        + (f"{kv} (" if kv else "(")
        + "the engines' KV pool, `max_total_num_tokens` of their `/server_info`). Like the "
        "SGLang router arm, the load generator sends no class headers or priorities; it "
        f"sends the run ID as the program's name (`{flags}`). The router's own times "
        "(metrics poll 1 s, acting TTL at most 10 s, queue timeout 600 s) are real "
        "seconds, not scaled with the engines. Each arm's final `GET "
        "/scheduling/diagnostics` is in the JSON (`router_diagnostics`). Command lines:",
        *(f"  - `{name}`: `{r['command']}`" for name, r in sorted(routers.items())),
    ]


def vs_vllm_text(by_arm: dict[str, list[dict[str, Any]]]) -> str:
    """luftpause against each vLLM router arm at one point, per repetition (not part of
    the verdict): interactive runs/min as a ratio, batch runs/min as a change."""
    lp = by_arm.get("luftpause")
    if not lp:
        return ""
    return "".join(
        f"; against {name} (not part of the verdict): interactive "
        + ratio_text(paired_ratios(lp, results, "interactive"))
        + ", batch "
        + ratio_text(paired_ratios(lp, results, "batch"), change=True)
        for name, results in by_arm.items()
        if any(r.get("router", {}).get("router") == "vllm-router" for r in results)
    )


def _parsed(
    data: dict[str, Any],
) -> tuple[Plan, dict[str, dict[int, dict[str, list[dict[str, Any]]]]]]:
    """The plan and the results of a saved run (``flood.py --json``: lists for tuples,
    load points as strings)."""
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data["plan"].items()
    }
    results = {b: {int(n): arms for n, arms in per.items()} for b, per in data["results"].items()}
    return Plan(**fields), results


def render(data: dict[str, Any], rendered: str = "") -> str:
    """The Markdown report of a saved run (what ``flood.py --json`` writes, with
    ``machine``), a function of ``data`` alone: the same data renders the same bytes.
    ``rendered``: the ``--report-from`` command that re-rendered it, if one did."""
    plan, results = _parsed(data)
    return report(
        plan,
        data["command"],
        results,
        {int(k): v for k, v in data["floors"].items()},
        data["started"],
        data["minutes"],
        tuple(data["load_before"]),
        rendered=rendered,
        code=data.get("code", ""),
        host=data["machine"],
    )


def render_plot(data: dict[str, Any]) -> str | None:
    """The ``--plot`` SVG of a saved run, a function of ``data`` alone; None when the run
    has nothing to plot (no own-loop or coding flood)."""
    plan, results = _parsed(data)
    return plot_svg(results, plan, data.get("code", ""))
