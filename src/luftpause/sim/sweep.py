"""Capacity planning: the same load on 1, 2, 4, … replicas (``luftpause sim --sweep``);
and the interactive target's frontier (``--sweep target=1.2,1.5,2``).

``--sweep replicas=1,2,4,8`` runs every arm at every replica count; the table
gives interactive and batch run times and rates per point, and with
``--target-p50 S`` the fewest replicas whose interactive runs take at most ``S``
seconds at the median, per arm; ``--target-turn-p50 S`` the same for interactive
*turns* (those that ended in the window: for runs that outlast it, such as the
coding-agent profile's, the only time there is). ``--plot FILE.svg`` draws
interactive p50 and batch runs/min against replicas (interactive turn p50 and batch
reply tokens/min where a point finished no run of a class or the target is a turn's),
one line per arm (a plain SVG file: no plotting library needed to make or view it).

``--sweep target=1.2,1.5,2`` adds a luftpause arm per interactive target (a slowdown
over the floor: ``luftpause-x1.2`` …) to the arms given, runs them all under the same
load, and ``--plot`` draws the frontier: interactive against batch runs/min, one point
per arm, luftpause's points and each capped peer's joined by a line (B7).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from luftpause.measure import plot
from luftpause.measure.mix import MixError
from luftpause.sim.run import SimConfig, cell, slowdown_arm

SWEEPABLE = ("replicas", "target")
COLOURS = {"luftpause": "#1b6ac9", "router": "#d1495b", "engine-prio": "#8c8c8c"}


def parse_sweep(text: str) -> tuple[str, list[int] | list[str]]:
    """``replicas=1,2,4`` -> ("replicas", [1, 2, 4]) (sorted, unique, each at least 1);
    ``target=1.5,1.2`` -> ("target", ["1.2", "1.5"]) (slowdowns above 1, as arm names
    write them)."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEPABLE:
        raise MixError(f"--sweep takes replicas=N,N,... or target=S,S,..., got {text!r}")
    if name == "target":
        slowdowns: dict[float, str] = {}
        for v in (v.strip() for v in values.split(",") if v.strip()):
            value = slowdown_arm(f"luftpause-x{v}")
            if value is None:
                raise MixError(f"--sweep target takes slowdowns above 1, such as 1.3, got {v!r}")
            slowdowns.setdefault(value, v)
        if not slowdowns:
            raise MixError(f"--sweep target needs at least one slowdown, got {values!r}")
        return name, [slowdowns[k] for k in sorted(slowdowns)]
    try:
        counts = sorted({int(v) for v in values.split(",") if v.strip()})
    except ValueError:
        raise MixError(f"--sweep replicas must be whole numbers, got {values!r}") from None
    if not counts or counts[0] < 1:
        raise MixError(f"--sweep replicas must be at least 1, got {values!r}")
    return name, counts


def target_arms(arms: list[str], slowdowns: list[str]) -> list[str]:
    """The arms given, luftpause first, then a luftpause arm per target."""
    swept = [f"luftpause-x{s}" for s in slowdowns]
    return list(dict.fromkeys(["luftpause", *arms, *swept]))


def frontier_svg(results: list[dict[str, Any]], title: str) -> str:
    """Interactive (y) against batch (x) runs/min, closed loop, one point per arm:
    luftpause's default and target points joined by a line, and each swept peer's
    (``smg-capC``, ``smg-fifoC``) by its own (luftpause.measure.plot draws it)."""

    def family(arm: str) -> str:
        if arm == "luftpause" or arm.startswith("luftpause-x"):
            return "luftpause"
        for prefix in ("smg-cap", "smg-fifo", "vllm-prog-kv"):
            if arm.startswith(prefix) and arm != prefix:
                return prefix
        return arm

    marks = []
    for r in results:
        batch, inter = row(r, "batch")[0], row(r, "interactive")[0]
        if batch is not None and inter is not None:
            marks.append(plot.Mark(batch, inter, family(r["arm"]), label=r["arm"]))
    marks.sort(key=lambda m: m.x)  # each family's line runs left to right
    families = list(dict.fromkeys(m.kind for m in marks))
    colour = {"luftpause": "#d62728", "smg-cap": "#1f77b4", "smg-fifo": "#ff7f0e"}
    styles = {f: plot.Style(colour.get(f, "#555555")) for f in families}
    panel = plot.Panel("", marks, "batch runs/min", "interactive runs/min")
    return plot.svg([panel], title, styles, {f: f for f in families}, joined=families)


def points(config: SimConfig, counts: list[int]) -> list[SimConfig]:
    return [replace(config, replicas=n) for n in counts]


def row(result: dict[str, Any], cls: str) -> tuple[float | None, float | None]:
    """(runs/min closed loop, run p50 s) of a class, or Nones when it finished no run."""
    c = result["classes"].get(cls)
    if c is None:
        return None, None
    return c["runs_per_min_closed"], c["run_s"]["p50"]


def turn_row(result: dict[str, Any], cls: str) -> tuple[float | None, float | None]:
    """(reply tokens/min, turn p50 s) of a class's turns that ended in the window."""
    t = result["classes"].get(cls, {}).get("turns_ended")
    if t is None:
        return None, None
    return t["completion_tokens_per_min"], t["wall_s"]["p50"]


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| replicas | arm | interactive runs/min | interactive p50 s | batch runs/min "
        "| batch p50 s | interactive turn p50 s | batch reply tokens/min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = []
        for cls in ("interactive", "batch"):
            rate, p50 = row(r, cls)
            cells += [cell(rate), cell(p50)]
        cells += [cell(turn_row(r, "interactive")[1], 2), cell(turn_row(r, "batch")[0], 0)]
        lines.append(f"| {r['replicas']} | {r['arm']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def interactive_p50(result: dict[str, Any], of: str) -> float | None:
    """The interactive p50 of ``of`` = ``"run"`` or ``"turn"``."""
    return row(result, "interactive")[1] if of == "run" else turn_row(result, "interactive")[1]


def plotted(results: list[dict[str, Any]], turn_target: bool) -> str:
    """What the plot draws: ``"turn"`` figures where the target is a turn's or a point
    finished no run of a class (a run figure would leave a hole), else ``"run"``."""
    if turn_target:
        return "turn"
    holes = any(row(r, "interactive")[1] is None or row(r, "batch")[0] is None for r in results)
    return "turn" if holes else "run"


def fewest(
    results: list[dict[str, Any]], target_s: float, of: str = "run"
) -> dict[str, int | None]:
    """Per arm: the fewest replicas whose interactive p50 (of runs, or of ``of="turn"``
    turns) is at most ``target_s``."""
    out: dict[str, int | None] = {}
    for r in sorted(results, key=lambda r: r["replicas"]):
        out.setdefault(r["arm"], None)
        p50 = interactive_p50(r, of)
        if out[r["arm"]] is None and p50 is not None and p50 <= target_s:
            out[r["arm"]] = r["replicas"]
    return out


def svg(results: list[dict[str, Any]], title: str, of: str = "run") -> str:
    """Two panels against replicas: interactive p50 (s) of runs and batch runs/min, or
    (``of="turn"``) interactive turn p50 and batch reply tokens/min; a line per arm
    (luftpause.measure.plot draws it)."""
    arms = list(dict.fromkeys(r["arm"] for r in results))

    def value_of(r: dict[str, Any], cls: str) -> float | None:
        if cls == "interactive":
            return interactive_p50(r, of)
        return row(r, cls)[0] if of == "run" else turn_row(r, cls)[0]

    work = "batch runs/min" if of == "run" else "batch reply tokens/min"
    panels = []
    for cls, label in (("interactive", f"interactive {of} p50 (s)"), ("batch", work)):
        marks = [
            plot.Mark(float(r["replicas"]), value, r["arm"])
            for r in sorted(results, key=lambda r: r["replicas"])
            if (value := value_of(r, cls)) is not None
        ]
        panels.append(plot.Panel(label, marks, "replicas", label))
    styles = {arm: plot.Style(COLOURS.get(arm, "#000000")) for arm in arms}
    return plot.svg(panels, title, styles, {arm: arm for arm in arms}, joined=arms)
