"""What a load run records and how it is summarised.

One :class:`TurnRecord` per model turn (own-loop agents only: sub-agents' turns
happen inside the runtime), one :class:`RunRecord` per finished run, one
:class:`ErrorRecord` per failed run. :func:`summarise` turns them into the
numbers the table and the JSON show, per class and per group:

* ``runs_per_min``: runs that *finished* inside the measured window, divided by
  the window's length (closed loop: a run in flight when the window closes is
  not counted);
* ``runs_per_min_closed``: for closed-loop groups, ``agents * 60 / mean run
  time`` over the same runs (Little's law with no think time). It estimates the
  same rate without the window's rounding: with 4 agents and runs of about half
  the window, the count is off by up to one run per agent (tens of percent),
  while the mean run time over the same runs is off by a few percent;
* ``run_s``: p50/p95/mean of those runs' wall time;
* ``cached_share``: cached prompt tokens / prompt tokens over all their turns;
* ``turn``: where an average turn's time went - held in luftpause
  (``x-luftpause-held-ms``), queued in the engine, prefilling, decoding
  (``usage.luftpause_timing``), and ``other`` (wall time minus those: network,
  proxy, streaming, client);
* ``errors``: failed runs by kind. Errors are counted whenever they happen,
  including in the warm-up, and never dropped;
* ``turns_ended`` (when the load logged every turn as it ended, :class:`EndedTurn`):
  the model turns that *ended* inside the window, whether or not their run did -
  how many, per minute, their wall time p50/p90/p95 and reply tokens per minute,
  per class and per group (two groups claiming one class - a caller and another
  posing as it, B13 - are told apart by their groups). Runs that take longer than
  the window (long agent traces, B10) show here what a window of runs/min cannot: how
  long each turn kept its user waiting, and how much work got done.

Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

CLASSES = ("interactive", "batch")
BREAKDOWN = ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")


@dataclass
class TurnRecord:
    wall_s: float
    held_s: float | None = None  # None: no luftpause in the path
    queued_s: float | None = None  # None: the engine sent no luftpause_timing
    prefill_s: float | None = None
    decode_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    replica: str | None = None
    tool_calls: int = 0
    # Replays of a plan (B10): the lengths the plan asked for, beside what the engine reported.
    planned_prompt_tokens: int | None = None
    planned_completion_tokens: int | None = None

    @property
    def other_s(self) -> float:
        known = sum(v for v in (self.held_s, self.queued_s, self.prefill_s, self.decode_s) if v)
        return max(0.0, self.wall_s - known)


@dataclass(frozen=True, slots=True)
class EndedTurn:
    """One model turn as it ended (``end_s``: seconds since the load started), for the
    turns-in-the-window view; a sub-agent's turn is logged under its parent's group."""

    group: str
    cls: str
    end_s: float
    turn: TurnRecord


@dataclass
class RunRecord:
    group: str
    cls: str
    kind: str  # "agent" (own loop) or "subagent" (over MCP, through the runtime)
    start_s: float  # seconds since the load started
    end_s: float
    turns: int
    tool_calls: int
    tool_s: float = 0.0
    turn_records: list[TurnRecord] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    turn_s: float | None = None  # sub-agents: the runtime's own turn time
    subagents: int = 0  # sub-agent runs it started (B10 plans); their turns are in turn_records

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def replicas(self) -> list[str]:
        return sorted({t.replica for t in self.turn_records if t.replica})


@dataclass
class ErrorRecord:
    group: str
    cls: str
    kind: str
    at_s: float
    message: str


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def runs_per_min(count: int, window_s: float) -> float:
    if window_s <= 0:
        raise ValueError("the window must be longer than zero")
    return count * 60.0 / window_s


def cached_share(runs: Iterable[RunRecord]) -> float | None:
    """Cached prompt tokens / prompt tokens; None when no turn reported usage."""
    prompt = cached = 0
    for run in runs:
        if run.prompt_tokens is None:
            continue
        prompt += run.prompt_tokens
        cached += run.cached_tokens or 0
    return cached / prompt if prompt else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def turn_breakdown(runs: Iterable[RunRecord]) -> dict[str, Any]:
    """Mean seconds per turn: wall, held, queued, prefill, decode, other; plus counts."""
    turns = [t for r in runs for t in r.turn_records]
    out: dict[str, Any] = {"turns": len(turns), "wall_s": _r(_mean([t.wall_s for t in turns]))}
    for name in BREAKDOWN:
        if name == "other_s":
            vals = [t.other_s for t in turns]
        else:
            vals = [v for t in turns if (v := getattr(t, name)) is not None]
        # A part nobody reported stays None (e.g. held_s without luftpause in the path).
        out[name] = _r(_mean(vals)) if vals else None
    return out


def closed_loop_rate(agents: int, durations: Sequence[float]) -> float | None:
    """Runs per minute of ``agents`` closed-loop agents whose runs took ``durations``."""
    if agents < 1:
        raise ValueError(f"agents must be at least 1, got {agents}")
    mean = _mean(durations)
    return None if not mean else agents * 60.0 / mean


def summarise_runs(
    runs: Sequence[RunRecord],
    errors: Sequence[ErrorRecord],
    window_s: float,
    agents: int | None = None,
) -> dict[str, Any]:
    """``agents``: how many closed-loop agents produced ``runs`` (None: not a closed loop)."""
    durations = [r.duration_s for r in runs]
    tool_s = [r.tool_s for r in runs]
    turn_s = [r.turn_s for r in runs if r.turn_s is not None]
    closed = closed_loop_rate(agents, durations) if agents else None
    return {
        "runs": len(runs),
        "runs_per_min": round(runs_per_min(len(runs), window_s), 3),
        "runs_per_min_closed": _r(closed),
        "run_s": {
            "p50": _r(percentile(durations, 50)),
            "p95": _r(percentile(durations, 95)),
            "mean": _r(_mean(durations)),
            "min": _r(min(durations) if durations else None),
            "max": _r(max(durations) if durations else None),
        },
        "turns_per_run": _r(_mean([float(r.turns) for r in runs])),
        "tool_calls_per_run": _r(_mean([float(r.tool_calls) for r in runs])),
        "tool_s_per_run": _r(_mean(tool_s)),
        "turn_s_per_run": _r(_mean(turn_s)) if turn_s else None,
        "cached_share": _r(cached_share(runs), 4),
        "turn": turn_breakdown(runs),
        "errors": dict(sorted(Counter(e.kind for e in errors).items())),
        "error_count": len(errors),
    }


def in_window(run: RunRecord, start_s: float, end_s: float) -> bool:
    return start_s <= run.end_s <= end_s


def summarise_turns(turns: Sequence[EndedTurn], window_s: float) -> dict[str, Any]:
    """Turns that ended inside a window of ``window_s`` seconds (already filtered)."""
    walls = [t.turn.wall_s for t in turns]
    tokens = sum(t.turn.completion_tokens or 0 for t in turns)
    return {
        "turns": len(turns),
        "turns_per_min": round(runs_per_min(len(turns), window_s), 3),
        "wall_s": {
            "p50": _r(percentile(walls, 50)),
            "p90": _r(percentile(walls, 90)),
            "p95": _r(percentile(walls, 95)),
        },
        "completion_tokens_per_min": round(runs_per_min(tokens, window_s), 1),
    }


def summarise(
    runs: Sequence[RunRecord],
    errors: Sequence[ErrorRecord],
    window: tuple[float, float],
    groups: Sequence[tuple[str, str]] = (),
    agents: Mapping[str, int] | None = None,
    turns: Sequence[EndedTurn] | None = None,
    turn_groups: Collection[str] | None = None,
) -> dict[str, Any]:
    """Per class and per group (``groups``: (name, class) pairs, in order).

    ``agents``: agents per closed-loop group name; a class's count is the sum over
    its groups, and only a class whose every group is listed gets
    ``runs_per_min_closed``. ``turns``: every turn the load logged as it ended (None:
    it logged none); each class and group then gets ``turns_ended`` - only the groups
    named in ``turn_groups`` and the classes with one of them, where given (the others'
    turns are not logged: sub-agents' turns are the runtime's). Only turns that
    completed are logged: a failed turn fails its run and counts under ``errors``.
    """
    start, end = window
    agents = agents or {}
    counted = [r for r in runs if in_window(r, start, end)]
    span = end - start
    classes = sorted({r.cls for r in runs} | {e.cls for e in errors} | {c for _, c in groups})

    def class_agents(c: str) -> int | None:
        names = {g for g, gc in groups if gc == c} | {r.group for r in counted if r.cls == c}
        if not names or any(n not in agents for n in names):
            return None
        return sum(agents[n] for n in names)

    by_class = {
        c: summarise_runs(
            [r for r in counted if r.cls == c],
            [e for e in errors if e.cls == c],
            span,
            class_agents(c),
        )
        for c in sorted(classes, key=lambda c: (CLASSES.index(c) if c in CLASSES else 9, c))
    }
    by_group = {
        name: summarise_runs(
            [r for r in counted if r.group == name],
            [e for e in errors if e.group == name],
            span,
            agents.get(name),
        )
        for name, _ in groups
    }
    if turns is not None:
        ended = [t for t in turns if start <= t.end_s <= end]
        logged = set(by_group) if turn_groups is None else set(turn_groups)
        logging_classes = {c for g, c in groups if g in logged} | {t.cls for t in ended}
        for c, s in by_class.items():
            if turn_groups is None or c in logging_classes:
                s["turns_ended"] = summarise_turns([t for t in ended if t.cls == c], span)
        for name, s in by_group.items():
            if name in logged:
                s["turns_ended"] = summarise_turns([t for t in ended if t.group == name], span)
    return {
        "window_s": round(span, 3),
        "classes": by_class,
        "groups": by_group,
        "errors": dict(sorted(Counter(e.kind for e in errors).items())),
        "error_count": len(errors),
        "runs_outside_window": len(runs) - len(counted),
    }


def run_json(run: RunRecord) -> dict[str, Any]:
    out = {
        "group": run.group,
        "class": run.cls,
        "kind": run.kind,
        "start_s": round(run.start_s, 3),
        "duration_s": round(run.duration_s, 3),
        "turns": run.turns,
        "tool_calls": run.tool_calls,
        "tool_s": round(run.tool_s, 3),
        "prompt_tokens": run.prompt_tokens,
        "cached_tokens": run.cached_tokens,
        "replicas": run.replicas(),
    }
    if run.turn_records:
        out["turn_records"] = [
            {
                k: (round(v, 4) if isinstance(v, float) else v)
                for k, v in asdict(t).items()
                if v is not None or not k.startswith("planned_")
            }
            for t in run.turn_records
        ]
    if run.turn_s is not None:
        out["turn_s"] = round(run.turn_s, 3)
    if run.subagents:
        out["subagents"] = run.subagents
    return out


def error_json(error: ErrorRecord) -> dict[str, Any]:
    return {
        "group": error.group,
        "class": error.cls,
        "kind": error.kind,
        "at_s": round(error.at_s, 3),
        "message": error.message[:500],
    }


# ------------------------------------------------------------------ table


def _fmt(value: Any, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "-"
    if pct:
        return f"{value * 100:.0f}%"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(summary: dict[str, Any]) -> str:
    """The final table: one row per class, then one per group if there are several."""
    head = (
        "| | runs | runs/min | agents×60/mean | p50 s | p95 s | turns | cached | held s | "
        "queued s | prefill s | decode s | other s | tool s/run | errors |"
    )
    lines = [head, "|" + "---|" * 15]

    def row(name: str, s: dict[str, Any]) -> str:
        t = s["turn"]
        errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "0"
        cells = [
            name,
            str(s["runs"]),
            _fmt(s["runs_per_min"]),
            _fmt(s.get("runs_per_min_closed")),
            _fmt(s["run_s"]["p50"]),
            _fmt(s["run_s"]["p95"]),
            _fmt(s["turns_per_run"]),
            _fmt(s["cached_share"], pct=True),
            _fmt(t["held_s"], 2),
            _fmt(t["queued_s"], 2),
            _fmt(t["prefill_s"], 2),
            _fmt(t["decode_s"], 2),
            _fmt(t["other_s"], 2),
            _fmt(s["tool_s_per_run"], 2),
            errs,
        ]
        return "| " + " | ".join(cells) + " |"

    for name, s in summary["classes"].items():
        lines.append(row(name, s))
    if len(summary["groups"]) > 1:
        for name, s in summary["groups"].items():
            lines.append(row(f"group {name}", s))
    return "\n".join(lines)


def turns_table(summary: dict[str, Any]) -> str | None:
    """The turns that ended inside the window, whether their run finished or not (None
    when the load did not log turns)."""
    rows = [(name, s) for name, s in summary["classes"].items() if "turns_ended" in s]
    if len(summary["groups"]) > 1:
        rows += [(f"group {n}", s) for n, s in summary["groups"].items() if "turns_ended" in s]
    if not rows:
        return None
    lines = [
        "| turns ended in the window | turns | turns/min | turn p50 s | turn p95 s | "
        "reply tokens/min |",
        "|" + "---|" * 6,
    ]
    for name, s in rows:
        t = s["turns_ended"]
        cells = [
            name,
            str(t["turns"]),
            _fmt(t["turns_per_min"]),
            _fmt(t["wall_s"]["p50"], 2),
            _fmt(t["wall_s"]["p95"], 2),
            _fmt(t["completion_tokens_per_min"], 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
