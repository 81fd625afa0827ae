"""The simulator next to the real-time flood it models: the same load points, side by side.

    python tools/bench/sim_fidelity.py     # against the recorded load sweep (--flood's default)
    python tools/bench/sim_fidelity.py --flood other.json --out docs/benchmarks/fidelity.md
    python tools/bench/sim_fidelity.py --flood docs/benchmarks/results/2026-12-05-flood-smg.json \
        --out docs/benchmarks/fidelity.md --part smg    # the SGLang Model Gateway's arms too
    python tools/bench/sim_fidelity.py --flood docs/benchmarks/results/2026-12-05-flood-ts2.json \
        --seeds 5 --out docs/benchmarks/fidelity.md --part ts2  # each point over 5 seeds
    python tools/bench/sim_fidelity.py \
        --flood docs/benchmarks/results/2026-12-04-flood-coding.json \
        --out docs/benchmarks/fidelity.md --part coding    # the coding-agent flood
    python tools/bench/sim_fidelity.py \
        --flood docs/benchmarks/results/2026-12-05-flood-mcp-smg.json \
        --out docs/benchmarks/fidelity.md --part mcp --seeds 10   # sub-agents over MCP
    python tools/bench/sim_fidelity.py --flood both.json --bench mcp   # a flood of several

Reads the raw results of an own-loop flood (``tools/bench/flood.py --json``: every
arm at every load point, in real seconds at the flood's time scale) and runs
``luftpause sim`` with the same plan: 4 interactive agents beside N batch agents,
8,000-character contexts, 3 tool calls per run, the flood's warm-up, ramp and
window for that N (``flood.Plan``). For each load point, arm and class it prints
the closed-loop runs/min and the p50 run time of both, in the engine model's time,
and the simulator's difference. With ``--out`` the table replaces the part of that
file between ``<!-- fidelity:start -->`` and ``<!-- fidelity:end -->`` (with
``--part NAME``, ``<!-- fidelity-NAME:start -->`` …). Every arm of the flood that the
simulator has is compared: luftpause, router, engine-prio, and SMG's (``smg``,
``smg-capC``, ``smg-fifoC``).

A coding-agent flood (``flood.py --benches coding``: runs sampled from the
``coding-agent`` profile, 2 interactive agents beside N batch agents, long-context
engines) is compared by what that flood reports instead: per class, the p50 time of
the turns that ended in the window and the reply tokens per minute. Each of its
repetitions is simulated once, with the runs it drew: the simulator's ``--plan-seed``
set to what the repetition's load generator drew them from (its ``plan_seed``, or its
``seed`` in a flood from before ``--plan-seed``), so the two play the same runs slot
for slot. They still differ in a run's lengths a little: the load generator asks for
a tool turn's reply rounded up to a power of two (``docs/guides/workloads.md``), the
simulator serves the planned length. ``--seeds`` and ``--seed`` do not apply to such a
flood.

A flood of sub-agents over MCP (``flood.py --benches mcp``) has the own-loop flood's plan:
the same agents, tasks, tool delays and windows, run by the runtime instead of the load
generator. The simulator has no runtime: it plays them as own-loop agents, so what the
runtime adds to a run (MCP round trips, the journal) is the difference it cannot show.
Before ``RUNTIME_STREAMS`` the runtime's turns went unstreamed and the decode pace never
timed them, so the luftpause arm of such a flood is simulated with the pace off.

Before ``FIRST_TOKEN_ALONE`` the fake engines sent a reply's first token in the flood's
first chunk (``--chunk-tokens``, 8), so the dataplane saw it seven decode steps late
and the decode pace read replies as faster than they were. The simulator's replicas
show the first token as late for such a flood (``SimConfig.first_chunk_tokens``).

SMG's arms are simulated with the placement policy the flood gave SMG (its plan's
``smg_policy``, ``cache_aware`` where the flood did not record one) and the load poll it
gave SMG: the ``--load-monitor-interval`` of the ``smg launch`` command each repetition
recorded, SMG's default of 10 seconds where it passed none, times the flood's time scale
(a flood before ``e8ceada`` left SMG reading every 10 real seconds: 50 model seconds at
time scale 5, 100 at 10). vLLM's router arms are simulated with the router's own
clock at the flood's time scale (``SimConfig.vllm_clock_scale``): the flood speeds up
the engines and tools, not vLLM's router. Where the flood
recorded how many requests each engine got, a second table sets the busiest engine's
share of the requests in each repetition beside the simulator's: which engine is the
busy one is a matter of which run came first, so the share is compared, not the engine.

The flood's figures are one run of the real stack (the mean of its repetitions);
the simulator's are one seed, or with ``--seeds N`` the mean of N seeds with their
lowest and highest beside it: with 4 interactive agents a window holds a few dozen
interactive runs, whose rate moves by about 13 % and p50 by 10–30 % from seed to
seed, so one seed against one repetition cannot tell a model's error from the draw.
An own-loop flood from ``PLAN_KEYS`` on, and a sub-agent flood from ``PLAN_MARKERS``
on, drew its replies from plan keys (the load generator's ``--plan-seed``, one per
repetition): each repetition of an arm whose keys reached the engines is then
simulated with its plan seed (under ``--seeds N`` seeds each, for what else is
random: tool delays, placement), so both play the same tool counts and replies run
for run, and what is left between them is the model, not the draw. Such a flood is
simulated with the groups its load generator ran (a plan key names its group).
Nothing is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from luftpause.fakes.engine.model import EngineParams
from luftpause.measure.mix import Group, MixError, parse_mix
from luftpause.sim.arms import ABLATED_ARMS, ARMS, VLLM_ROUTER_ARMS
from luftpause.sim.placement import SMG_LOAD_POLL_S
from luftpause.sim.run import SimConfig, simulate, sized_arm
from tools.bench.arms.plan import CODING_CONTEXT, CODING_INTERACTIVE, CODING_KV_TOKENS
from tools.bench.flood_report import turn_figure
from tools.bench.stats import range_text

ROOT = Path(__file__).resolve().parents[2]
# The recorded load sweep (flood.py --time-scale 5 --reps 3 --benches own,mcp) and the page
# whose marked parts hold the tables (--out).
DEFAULT_FLOOD = "docs/benchmarks/results/2026-12-05-flood-load-sweep.json"
FIDELITY_PAGE = "docs/benchmarks/fidelity.md"
CLASSES = ("interactive", "batch")
INTERACTIVE_AGENTS = 4


def markers(part: str) -> tuple[str, str]:
    name = f"fidelity-{part}" if part else "fidelity"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def simulated(arm: str) -> bool:
    """The simulator has this flood arm (``luftpause-no-pk`` and the like it has not)."""
    return (
        arm in ARMS or arm in ABLATED_ARMS or arm in VLLM_ROUTER_ARMS or sized_arm(arm) is not None
    )


def plan_for(plan: dict[str, Any], load: int) -> tuple[float, float, float]:
    """Warm-up, ramp and window (model seconds) the flood used at ``load`` batch agents."""
    warmup = max(plan["warmup_s"], 1.0 * load)
    return warmup, warmup / 2, max(plan["window_s"], 1.5 * load)


def real_figures(reps: list[dict[str, Any]], scale: float) -> dict[str, tuple[float, float]]:
    """Per class: mean closed-loop runs/min and mean p50 run time, in model time."""
    out = {}
    for cls in CLASSES:
        rates = [r["classes"][cls]["runs_per_min_closed"] for r in reps if cls in r["classes"]]
        p50s = [r["classes"][cls]["run_s"]["p50"] for r in reps if cls in r["classes"]]
        if rates and p50s and None not in rates and None not in p50s:
            out[cls] = (statistics.fmean(rates) / scale, statistics.fmean(p50s) * scale)
    return out


def sim_figures(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    out = {}
    for cls in CLASSES:
        c = result["classes"].get(cls)
        if c and c["runs_per_min_closed"] is not None and c["run_s"]["p50"] is not None:
            out[cls] = (c["runs_per_min_closed"], c["run_s"]["p50"])
    return out


CODING_ENGINE = EngineParams(
    priority_scheduling=True, context_length=CODING_CONTEXT, kv_tokens=CODING_KV_TOKENS
)


def real_turn_figures(reps: list[dict[str, Any]], scale: float) -> dict[str, tuple[float, float]]:
    """Per class: mean reply tokens/min and mean turn p50 (turns that ended in the
    window), in model time; a class with a repetition that ended no turn is left out."""
    out = {}
    for cls in CLASSES:
        tokens = [turn_figure(r, cls, "tokens") for r in reps]
        p50 = [turn_figure(r, cls, "p50") for r in reps]
        if reps and None not in p50 and None not in tokens:
            out[cls] = (
                statistics.fmean(t for t in tokens if t is not None) / scale,
                statistics.fmean(p for p in p50 if p is not None) * scale,
            )
    return out


def sim_turn_figures(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The simulator's own figures (model time already), as ``real_turn_figures``."""
    return real_turn_figures([result], 1.0)


def coding_config(plan: dict[str, Any], load: int, seed: int) -> SimConfig:
    """The coding flood's plan at ``load`` batch agents, for the simulator."""
    warmup = plan["coding_warmup_s"]
    return SimConfig(
        groups=(
            Group("people", CODING_INTERACTIVE, "interactive", "people", profile="coding-agent"),
            Group("crowd", load, "batch", "crowd", profile="coding-agent"),
        ),
        duration_s=plan["coding_window_s"],
        warmup_s=warmup,
        ramp_s=warmup / 2 if plan.get("ramp", True) else 0.0,
        seed=seed,
        engine=CODING_ENGINE,
    )


def flood_groups(arms: dict[str, list[dict[str, Any]]]) -> tuple[Group, ...]:
    """The groups a flood's load generator ran at one point, as its repetitions recorded
    them (``groups_config``): a plan key names its group, so a simulation paired with the
    flood's draws needs the flood's group names. Raises ``ValueError`` where none did."""
    for reps in arms.values():
        for rep in reps:
            if rep.get("groups_config"):
                tables = [
                    {k: v for k, v in group.items() if v is not None}
                    for group in rep["groups_config"]
                ]
                try:  # sub-agents are played as own-loop agents (the simulator has no runtime)
                    return tuple(replace(g, kind="agents") for g in parse_mix({"group": tables}))
                except MixError as exc:
                    raise ValueError(f"unreadable groups_config: {exc}") from None
    raise ValueError("no repetition recorded its groups (groups_config)")


def plan_seed_of(rep: dict[str, Any]) -> str | None:
    """What a coding repetition drew its runs from: its load generator's ``plan_seed``,
    or its ``seed`` where it recorded none (before ``--plan-seed``, the seed drew them)."""
    seed = rep.get("plan_seed") or rep.get("seed")
    return None if seed is None else str(seed)


def smg_poll_s(reps: list[dict[str, Any]], scale: float) -> float:
    """The model seconds between SMG's load reads in a flood arm's repetitions: the
    ``--load-monitor-interval`` their ``smg launch`` commands passed (SMG's default where
    none did) at the flood's time scale; an arm whose repetitions differ is refused."""
    polls = set()
    for rep in reps:
        words = str(rep.get("setup", "")).split()
        poll = SMG_LOAD_POLL_S
        if "--load-monitor-interval" in words:
            at = words.index("--load-monitor-interval") + 1
            try:
                poll = float(words[at])
            except (IndexError, ValueError):
                raise ValueError(
                    f"unreadable --load-monitor-interval in {rep.get('setup')!r}"
                ) from None
        polls.add(poll)
    if len(polls) > 1:
        raise ValueError(f"repetitions polled SMG at different intervals: {sorted(polls)}")
    return (polls.pop() if polls else SMG_LOAD_POLL_S) * scale


def busiest_share(counts: list[int]) -> float | None:
    """The largest of ``counts`` as a share of their sum (None for no requests)."""
    total = sum(counts)
    return max(counts) / total if total else None


def real_shares(reps: list[dict[str, Any]]) -> list[float]:
    """The busiest engine's share of the requests, per repetition that recorded them."""
    shares = []
    for rep in reps:
        engines = (rep.get("engine_side") or {}).get("engines") or []
        share = busiest_share([e.get("requests", 0) for e in engines])
        if share is not None:
            shares.append(share)
    return shares


# The commit that turned the decode pace on by default. A flood of code before it ran
# luftpause without the pace, so the simulator's luftpause arm is run with it off too.
PACE_ON = "b9088b7a5d16e989f34eb8a8acc3b22933f2c6a2"
# The commit from which the runtime streams its turns. Before it the pace never timed a
# sub-agent's reply (it reads streamed ones), so an MCP flood ran luftpause without it.
RUNTIME_STREAMS = "cb2cd77d59de85b59733e2d232e5fd10c46062dc"
# The commit from which the fake engine streams a reply's first token alone. Before it a
# flood's engines (--chunk-tokens 8) sent it with the next seven, so the dataplane saw
# it seven decode steps late and the pace read replies as faster than they were.
FIRST_TOKEN_ALONE = "47dc5bba5b9ddc535478a21b3ecc2f0ab654e17c"


# Since this commit the load generator sends each own-loop run's plan key (from its
# --plan-seed) and the fake engines draw the replies from it, so the simulator, given
# a repetition's plan seed, plays that repetition's tool counts and replies run for run.
PLAN_KEYS = "2e5121566870c80c6ab96cafc0cb4a97b47e4d6c"


# Floods from PLAN_KEYS on whose engines did not yet count the requests that came with a
# plan key: the arms whose requests reach the engines with the load generator's custom
# headers. The luftpause dataplane passes them on (tests/integration/test_loadgen.py)
# and the engine-priority arm has no proxy; sglang-router 0.3.2 and SMG 1.13 drop them
# (a chat completion with x-fake-plan-key sent through `smg launch` reached its fake
# engine without it: /debug/state's plan_keyed stayed 0), so their engines drew from
# each conversation.
HEADERS_REACH_ENGINES = ("luftpause", "engine-prio")


def keys_reached(arm: str, reps: list[dict[str, Any]]) -> bool:
    """Whether every request of a flood arm reached the engines with its plan key: as the
    engines counted them (``engine_side.plan_keyed_share``, at least 99 % in every
    repetition), or, where they did not count, by the arm (``HEADERS_REACH_ENGINES``)."""
    shares: list[float | None] = [
        (r.get("engine_side") or {}).get("plan_keyed_share") for r in reps
    ]
    counted = [float(share) for share in shares if share is not None]
    if reps and len(counted) == len(shares):
        return min(counted) >= 0.99
    return arm.split("-", 1)[0] == "luftpause" or arm in HEADERS_REACH_ENGINES


# Since this commit the load generator writes each run's plan key into its task, where
# every proxy passes it on, sub-agents' tasks through the runtime included: a flood of
# sub-agents over MCP is then paired as an own-loop one is.
PLAN_MARKERS = "c060d75f94d618ec308709300a020e7f58504fc7"


class UnknownCommit(ValueError):
    pass


def ran_since(code: str, since: str) -> bool:
    """Whether the flood's commit (``flood["code"]``, "abc1234 (working tree clean)")
    has ``since`` in its history. Raises :class:`UnknownCommit` where git cannot tell
    (no commit recorded, or one this clone does not have): what the simulator models
    depends on it."""
    commit = code.split()[0] if code.split() else ""
    if not commit:
        raise UnknownCommit("the flood recorded no commit (its JSON has no 'code')")
    answer = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", since, commit],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if answer.returncode not in (0, 1):  # 0: an ancestor; 1: not
        raise UnknownCommit(
            f"git cannot place the flood's commit {commit} beside {since[:7]} in this "
            f"clone: {answer.stderr.strip() or 'exit status ' + str(answer.returncode)}"
        )
    return answer.returncode == 0


def replica_means(figures: list[dict[str, Any]], key: str) -> str:
    """``key`` per replica (in name order), the mean of each reading's median; – where no
    reading had one."""
    names = sorted(
        {name for f in figures for name in f.get("replicas", {})},
        key=lambda name: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)],
    )  # engine-2 before engine-10
    out = []
    for name in names:
        values = [
            f["replicas"][name][key]
            for f in figures
            if f["replicas"].get(name, {}).get(key) is not None
        ]
        out.append(mean_cell(values))
    return " / ".join(out)


def mean_cell(values: list[float], percent: bool = False) -> str:
    """A table cell: the mean of ``values`` (as a percentage of 1), – where there are none."""
    if not values:
        return "–"
    mean = statistics.fmean(values)
    return f"{100 * mean:.0f} %" if percent else f"{mean:.1f}"


def pct(sim: float, real: float) -> str:
    return f"{(sim - real) / real * 100:+.0f} %" if real else "–"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--flood",
        type=Path,
        default=ROOT / DEFAULT_FLOOD,
        help=f"raw flood results (tools/bench/flood.py --json; default: {DEFAULT_FLOOD})",
    )
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed (default: 0)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="simulate each point with this many seeds (--seed, --seed + 1, ...) and compare "
        "the flood with their mean, showing their range (default: 1)",
    )
    parser.add_argument(
        "--bench",
        choices=("own", "coding", "mcp"),
        help="which of the flood's benches to compare, where it ran several (default: "
        "own, else coding, else mcp: the first it has)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"write the table into this file's marked part (the tables' page: {FIDELITY_PAGE})",
    )
    parser.add_argument(
        "--part", default="", help="with --out: the part marked <!-- fidelity-PART:start -->"
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    start_mark, end_mark = markers(args.part)
    try:
        flood = json.loads(args.flood.read_text())
        plan, results = flood["plan"], flood["results"]
        bench = args.bench or next((b for b in ("own", "coding", "mcp") if b in results), "own")
        coding = bench == "coding"
        own = results[bench]
        if coding:
            missing = [
                f"{load}/{arm}" for load, arms in own.items() for arm, reps in arms.items()
                if simulated(arm) and any(plan_seed_of(rep) is None for rep in reps)
            ]  # fmt: skip
            if missing:
                raise ValueError(f"no recorded seed in repetitions of {', '.join(missing)}")
    except (OSError, ValueError, KeyError) as exc:
        print(
            f"sim_fidelity: cannot read own-loop, coding or MCP flood results from {args.flood}: "
            f"{exc}"
        )
        return 2
    if coding and (args.seeds > 1 or args.seed):
        print(
            "sim_fidelity: a coding flood is simulated once per repetition, with the runs "
            "it drew; --seeds and --seed do not apply"
        )
        return 2
    scale = plan["time_scale"]
    most_reps = max((len(reps) for arms in own.values() for reps in arms.values()), default=0)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "unknown"  # fmt: skip
    code = str(flood.get("code", ""))
    try:  # git calls: each asked once
        pace_on = ran_since(code, PACE_ON)
        paced = pace_on and (bench != "mcp" or ran_since(code, RUNTIME_STREAMS))
        # what the flood's fake engines put in a reply's first streamed chunk
        first_chunk = 1 if ran_since(code, FIRST_TOKEN_ALONE) else int(plan.get("chunk_tokens", 8))
        # runs with plan keys: each repetition simulated with the replies it drew
        paired = (bench == "own" and ran_since(code, PLAN_KEYS)) or (
            bench == "mcp" and ran_since(code, PLAN_MARKERS)
        )
    except UnknownCommit as exc:
        print(f"sim_fidelity: {args.flood}: {exc}")
        return 2
    # the arms of such a flood whose plan keys reached the engines: simulated paired
    keyed = {
        (load, arm) for load, arms in own.items() for arm, reps in arms.items()
        if paired and simulated(arm) and keys_reached(arm, reps)
    }  # fmt: skip
    missing = [
        f"{load}/{arm}" for load, arm in sorted(keyed)
        if any(rep.get("plan_seed") is None for rep in own[load][arm])
    ]  # fmt: skip
    if missing:
        print(f"sim_fidelity: no recorded plan seed in repetitions of {', '.join(missing)}")
        return 2
    unkeyed = sorted({arm for load, arms in own.items() for arm in arms
                      if paired and simulated(arm) and (load, arm) not in keyed})  # fmt: skip
    sims_per_arm = 0  # the most simulations behind one sim cell
    rows = []
    splits: list[tuple[str, str, list[float], float]] = []
    # luftpause arms: the flood's scheduler figures (per repetition) and the simulator's
    schedulers: list[tuple[str, str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    # every arm: the engines' prefill share and decode batch, the flood's and the sim's
    engines: list[tuple[str, str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    polls: set[float] = set()  # model seconds between SMG's load reads, as the flood had it
    vllm_clock = False  # a vLLM router arm simulated with its clock at the flood's scale
    started = time.perf_counter()
    loads = sorted(own, key=int)
    for k, load in enumerate(loads, 1):
        warmup, ramp, window = plan_for(plan, int(load))
        config = SimConfig(
            groups=(
                Group("interactive", INTERACTIVE_AGENTS, "interactive", "interactive"),
                Group("batch", int(load), "batch", "batch"),
            ),
            duration_s=window,
            warmup_s=warmup,
            ramp_s=ramp,
            seed=args.seed,
        )
        if coding:
            config = coding_config(plan, int(load), args.seed)
        elif any(key[0] == load for key in keyed):  # the flood's groups: their plan keys
            try:
                config = replace(config, groups=flood_groups(own[load]))
            except ValueError as exc:
                print(f"sim_fidelity: {load} batch agents: {exc}")
                return 2
        config = replace(
            config,
            smg_policy=plan.get("smg_policy", "cache_aware"),
            first_chunk_tokens=first_chunk,
        )
        for arm in own[load]:
            if not simulated(arm):
                continue
            print(f"[{k}/{len(loads)}] {load} batch agents: {arm}", file=sys.stderr, flush=True)
            # the luftpause arm as the flood ran it: without the pace before it was on
            sim_arm = arm if paced or arm != "luftpause" else "luftpause-no-pace"
            arm_config = config
            if arm.startswith("smg"):
                try:
                    poll = smg_poll_s(own[load][arm], scale)
                except ValueError as exc:
                    print(f"sim_fidelity: {load} batch agents, {arm}: {exc}")
                    return 2
                polls.add(poll)
                arm_config = replace(config, smg_load_poll_s=poll)
            if arm in VLLM_ROUTER_ARMS or arm.startswith("vllm-prog-kv"):
                # the flood runs vLLM's router in real seconds, its engines ``scale`` faster
                arm_config = replace(config, vllm_clock_scale=scale)
                vllm_clock = True
            if coding or (load, arm) in keyed:
                # each repetition's own runs (coding: one seed) or replies, under --seeds seeds
                results = [
                    simulate(
                        replace(arm_config, plan_seed=plan_seed_of(rep), seed=args.seed + i),
                        sim_arm,
                    )
                    for rep in own[load][arm]
                    for i in range(args.seeds)
                ]
            else:
                results = [
                    simulate(replace(arm_config, seed=args.seed + i), sim_arm)
                    for i in range(args.seeds)
                ]
            sims_per_arm = max(sims_per_arm, len(results))
            if coding:
                real = real_turn_figures(own[load][arm], scale)
                sims = [sim_turn_figures(result) for result in results]
            else:
                real = real_figures(own[load][arm], scale)
                sims = [sim_figures(result) for result in results]
            measured = real_shares(own[load][arm])
            shares = [
                busiest_share(list(result["requests_by_replica"].values())) for result in results
            ]
            known = [share for share in shares if share is not None]
            if measured and known:
                splits.append((load, arm, measured, statistics.fmean(known)))
            flood_engines = [r["engine_side"] for r in own[load][arm] if r.get("engine_side")]
            sim_engines = [r["engines"] for r in results if r.get("engines")]
            if flood_engines and sim_engines:
                engines.append((load, arm, flood_engines, sim_engines))
            flood_sched = [r["scheduler"] for r in own[load][arm] if r.get("scheduler")]
            sim_sched = [r["scheduler"] for r in results if r.get("scheduler")]
            if flood_sched and sim_sched:
                schedulers.append((load, arm, flood_sched, sim_sched))
            for cls in CLASSES:
                seen = [sim[cls] for sim in sims if cls in sim]
                if cls in real and seen:
                    rows.append((load, arm, cls, real[cls], seen))
    flood_path = args.flood.relative_to(ROOT) if args.flood.is_relative_to(ROOT) else args.flood
    if coding:
        seeds_text = "each repetition simulated once, with the runs it drew (its plan seed)" + (
            ": each sim cell is their mean, with their lowest and highest in brackets"
            if most_reps > 1
            else ""
        )
    elif keyed:
        under = (
            f"seed {args.seed}"
            if args.seeds == 1
            else f"seeds {args.seed}–{args.seed + args.seeds - 1}"
        )
        seeds_text = (
            f"each repetition simulated with the tool counts and replies it drew (its plan "
            f"seed), under {under}"
            + (
                f"; {', '.join(unkeyed)}, whose proxy kept the plan keys from the engines: {under}"
                if unkeyed
                else ""
            )
            + (
                ": each sim cell is their mean, with their lowest and highest in brackets"
                if sims_per_arm > 1
                else ""
            )
        )
    else:
        seeds_text = (
            f"seed {args.seed}"
            if args.seeds == 1
            else f"seeds {args.seed}–{args.seed + args.seeds - 1}: each sim cell is their "
            "mean, with their lowest and highest in brackets"
        )
    elapsed = time.perf_counter() - started
    lines = [
        f"Command: `python tools/bench/sim_fidelity.py --flood {flood_path}"
        + (f" --bench {args.bench}" if args.bench else "")
        + (f" --part {args.part}" if args.part else "")
        + (f" --seeds {args.seeds}" if args.seeds > 1 else "")
        + (f" --seed {args.seed}" if args.seed else "")
        + f"` (simulator at "
        f"{commit}, {seeds_text}, {elapsed:.0f} s); flood: `{flood.get('command', '?')}` "
        f"at commit {flood.get('code', '?')}, time scale {scale:g}, "
        + (
            "one repetition. "
            if plan.get("reps") == 1
            else f"mean of {plan.get('reps', '?')} repetitions. "
        )
        + (
            "Sub-agents over MCP: the simulator plays them as own-loop agents with the same "
            "plan (3 `lookup` calls, the fake tool's delays, 256-token replies); what the "
            "runtime adds (MCP round trips to it and to the tool server, its journal) is not "
            "modelled. "
            if bench == "mcp"
            else ""
        )
        + (
            ""
            if paced
            else "That flood ran luftpause without the decode pace ("
            + (
                f"the runtime sent its turns unstreamed before {RUNTIME_STREAMS[:7]}, and the "
                "pace times streamed replies"
                if bench == "mcp" and pace_on
                else f"on by default since {PACE_ON[:7]}"
            )
            + "), so the simulator's luftpause arm runs with it off, as the flood's did. "
        )
        + (
            f"Its fake engines sent a reply's first token in a chunk of {first_chunk} "
            f"(before {FIRST_TOKEN_ALONE[:7]}), so its dataplane saw it {first_chunk - 1} "
            "decode steps late and the decode pace read replies as that much faster; the "
            "simulator's replicas show it as late. "
            if paced and first_chunk > 1
            else ""
        )
        + (
            f"SMG read the engines' load every {' / '.join(f'{p:g}' for p in sorted(polls))} "
            "model seconds, in the flood and in the simulator. "
            if polls
            else ""
        )
        + (
            f"vLLM's router kept real seconds in the flood (its metrics read, progress TTL "
            f"and timeouts), {scale:g} model seconds each: so in the simulator. "
            if vllm_clock
            else ""
        )
        + (
            "Coding-agent runs: reply tokens/min and the p50 of the turns that ended in the "
            "window, in the engine model's time."
            if coding
            else "Rates are closed-loop runs/min (agents × 60 / mean run time) in the engine "
            "model's time."
        ),
        "",
        (
            "| batch agents | arm | class | reply tokens/min: flood | sim | diff "
            "| turn p50 s: flood | sim | diff |"
            if coding
            else "| batch agents | arm | class | runs/min: flood | sim | diff "
            "| run p50 s: flood | sim | diff |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    within: list[bool] = []
    inside: list[bool] = []
    for load, arm, cls, (real_rate, real_p50), seen in rows:
        rates, p50s = [rate for rate, _ in seen], [p50 for _, p50 in seen]
        sim_rate, sim_p50 = statistics.fmean(rates), statistics.fmean(p50s)
        lines.append(
            f"| {load} | {arm} | {cls} | {real_rate:.1f} | {range_text(rates)} | "
            f"{pct(sim_rate, real_rate)} | {real_p50:.1f} | {range_text(p50s)} | "
            f"{pct(sim_p50, real_p50)} |"
        )
        if real_rate and real_p50:
            within.append(
                abs(sim_rate - real_rate) / real_rate <= 0.10
                and abs(sim_p50 - real_p50) / real_p50 <= 0.10
            )
            inside.append(
                min(rates) <= real_rate <= max(rates) and min(p50s) <= real_p50 <= max(p50s)
            )
    metric = "reply tokens/min" if coding else "runs/min"
    lines += [
        "",
        f"Within ±10 % on both {metric} and p50: {sum(within)} of {len(within)} rows"
        + (
            f"; the flood inside the {'seeds' if not (coding or keyed) else 'simulations'}' "
            f"range on both: {sum(inside)} of {len(inside)}."
            if sims_per_arm > 1
            else "."
        ),
    ]
    if splits:
        lines += [
            "",
            f"Placement (SMG's `--policy {plan.get('smg_policy', 'cache_aware')}`): the busiest "
            "engine's share of the requests.",
            "",
            "| batch agents | arm | flood, per repetition | sim |",
            "|---|---|---|---|",
        ]
        for load, arm, measured, share in splits:
            lines.append(
                f"| {load} | {arm} | {', '.join(f'{100 * m:.0f} %' for m in measured)} | "
                f"{100 * share:.0f} % |"
            )
    if engines:
        lines += [
            "",
            "The engines over the window, both replicas together (the flood's engines as "
            "their counters read; the mean over repetitions, seeds): the share of their busy "
            "time spent prefilling, and the decode batch (sequences per decode step).",
            "",
            "| batch agents | arm | prefill share: flood | sim | decode batch: flood | sim |",
            "|---|---|---|---|---|---|",
        ]
        for load, arm, flood_engines, sim_engines in engines:
            cells = []
            for key, percent in (("prefill_share", True), ("decode_batch", False)):
                for side in (flood_engines, sim_engines):
                    values = [e[key] for e in side if e.get(key) is not None]
                    cells.append(mean_cell(values, percent))
            lines.append(f"| {load} | {arm} | " + " | ".join(cells) + " |")
    if schedulers:
        lines += [
            "",
            "The luftpause scheduler over the window, as the flood read its `/status` every "
            "second and the simulator its core: medians, then the mean over repetitions "
            "(seeds); per replica; a batch limit from the decode pace over the readings that "
            "had one.",
            "",
            "| batch agents | arm | cap: flood | sim | batch limit from the pace: flood | sim "
            "| in flight: flood | sim | held: flood | sim |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for load, arm, flood_sched, sim_sched in schedulers:
            cells = []
            for key in ("capacity", "batch_limit_from_pace", "in_flight"):
                cells += [replica_means(flood_sched, key), replica_means(sim_sched, key)]
            cells += [
                mean_cell([f["held"] for f in side if f.get("held") is not None])
                for side in (flood_sched, sim_sched)
            ]
            lines.append(f"| {load} | {arm} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        text = args.out.read_text() if args.out.exists() else f"{start_mark}\n{end_mark}\n"
        if start_mark not in text or end_mark not in text:
            print(f"sim_fidelity: {args.out} has no {start_mark} … {end_mark} part to replace")
            return 2
        head, rest = text.split(start_mark, 1)
        _, tail = rest.split(end_mark, 1)
        args.out.write_text(f"{head}{start_mark}\n{table}\n{end_mark}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
