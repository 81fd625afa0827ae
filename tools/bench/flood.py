"""Side-by-side benchmarks of luftpause against the SGLang Model Gateway, the SGLang router,
vLLM's router and engine priority (H4).

    python tools/bench/flood.py --quick      # time-scaled engines, fewer points: ~11 min
    python tools/bench/flood.py              # full: every load point, 2 repetitions (~4.5 h)
    python tools/bench/flood.py --benches own,light --reps 1 --time-scale 4
    python tools/bench/flood.py --benches own --reps 3 --time-scale 5 \\
        --smg-caps 8,16,24,32 --smg-fifo-caps 16,32 \\
        --plot docs/benchmarks/results/YYYY-MM-DD-flood-smg.svg
    python tools/bench/flood.py --quick --benches own --loads 24 --vllm-router \\
        --arms luftpause,vllm-router,vllm-prog,vllm-prog-kv

Every arm runs on the same two fake engines (``--priority-scheduling`` on, as in
the original testbed), in one run, arms alternated and repeated:

1. ``own``: own-loop flood - 4 interactive agents beside N batch agents,
   ~8,000-character contexts, 3 tool calls per run; arms (a) ``router``: the
   SGLang router (``cache_aware``), no class headers; (b) ``luftpause``: the
   dataplane, class headers set; (c) ``engine-prio``: straight to the engines,
   agent *i* pinned to engine *i* mod 2, ``priority`` in the body (interactive
   10, batch 0); (d) ``smg``: the SGLang Model Gateway (PyPI ``smg``) with its
   priority scheduler, ``x-smg-priority`` interactive/bulk, sticky sessions keyed by
   the run ID and the same body priorities; with ``--smg-caps`` also ``smg-capC``
   (that scheduler given C slots) and with ``--smg-fifo-caps`` ``smg-fifoC`` (SMG's
   FIFO ``--max-concurrent-requests C``): SMG's frontier beside luftpause's point
   (``--plot``); with ``--vllm-router`` also vLLM's router (PyPI ``vllm-router``) in
   front of two more fake engines serving vLLM's metric names (``--metrics vllm``):
   ``vllm-router`` plain, ``vllm-prog`` with its program scheduling (a run is a
   program, named by the run ID in the body's ``vllm_xargs.agentic_context``, sent by
   ``luftpause loadgen --program-context xargs``), ``vllm-prog-kv`` the same with
   ``token_capacity_per_target`` set to the engines' KV pool; each arm's final
   ``/scheduling/diagnostics`` is kept in the JSON. A load sweep over N.
2. ``mcp``: the same mix as sub-agents through the runtime; arms: runtime →
   router, runtime → dataplane, and runtime → SMG (the runtime sending each turn as
   the own-loop ``smg`` arm's load generator does: ``runtime.class_headers``,
   ``run_id_headers`` and ``class_priority``); same sweep.
3. ``light``: ~2,000-character contexts, 24 batch + 4 interactive, the own-loop
   arms (SMG without the capacity sweeps; vLLM's router with ``--vllm-router``): they
   should tie.
4. ``routing``: 8 concurrent sub-agents (no saturation): luftpause affinity vs
   router ``cache_aware`` vs router ``round_robin``: runs/min and cached share.
5. ``fanout``: 16 sub-agents spawned together vs one after another, through
   luftpause and through the router.
6. ``coding``: runs shaped like real coding-agent traces (``--profile coding-agent``,
   docs/guides/workloads.md: ~30 turns, contexts growing to tens of thousands of tokens,
   tool gaps of ~5 s with a heavy tail, parallel sub-agents), 2 interactive agents
   beside N batch agents, the own-loop arms with SMG's priority scheduler. Its runs
   outlast any window a flood can afford, so it is judged by the turns that ended in
   the window: interactive turn p50/p95 and batch reply tokens per minute. Its engines
   need a long context (``--context-length 131072 --kv-tokens 1000000``), so it runs
   alone (``--benches coding``).

``--arms NAME,...`` keeps only the named arms at every point (e.g. luftpause and the
vLLM router arms).

How arms are ordered, repeated, warmed up and summarised (Williams Latin square order,
mean ± 95 % t-intervals, ratios per repetition): ``docs/benchmarks/methodology.md``, the
one place that says it; the statistics are ``tools/bench/stats.py``. The report names the
commit it measured and whether the working tree differed.

The floor: one interactive agent alone on an idle engine, a few runs per
context size; each arm's p50 is divided by it ("slowdown").

Time: the engines, the fake tools and the scheduler's probe period all run
``--time-scale`` times faster than real time; every time and rate in the report
is converted back to the engine model's time (seconds × scale, runs/min ÷ scale)
so quick and full runs read alike. The engine model's calibration is untouched.

Where a turn's time went: own-loop arms report it per class from the loadgen
(held in luftpause, engine queue, prefill, decode); sub-agent arms report the
engine's side from ``/debug/state`` (all classes together) and luftpause's held
time per class from the dataplane's ``/metrics``.

This machine's cores are shared by every process (engines, proxy, router,
load generator); the report records the load average of every arm.

The report is written to ``docs/benchmarks/results/YYYY-MM-DD-flood.md`` unless ``--out``
says otherwise (that day's UTC date; rename it to say what it measured and list it in
``docs/benchmarks/archive.md``). It states what is particular to the run (command, commit,
date, machine, load, engines, time scale, every arm's command line) and links
``docs/benchmarks/methodology.md`` for the rest: arms, repetitions, intervals, window and
columns are explained there once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from luftpause.cliargs import positive_float
from luftpause.measure.progress import ArmClock
from luftpause.sim.run import slowdown_arm
from tools.bench.arms.plan import BENCHES, CODING_ENGINE_ARGS, FULL, QUICK, ROOT, Arm
from tools.bench.arms.schedule import (
    coding_arms,
    fanout_arms,
    mcp_arms,
    own_arms,
    routing_arms,
    select_arms,
)
from tools.bench.arms.smg import SMG_INTERACTIVE_RESERVED
from tools.bench.arms.stack import floor, run_loadgen, start_stack
from tools.bench.flood_report import code_version, machine, render, render_plot
from tools.bench.stats import arm_order

# ------------------------------------------------------------------ main


def _caps(least: int) -> Any:
    """An argparse type: a comma list of distinct whole numbers, each at least ``least``,
    ascending."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            caps = sorted({int(x) for x in text.split(",") if x.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected whole numbers, got {text!r}") from None
        if not caps or caps[0] < least:
            raise argparse.ArgumentTypeError(f"expected numbers of at least {least}, got {text!r}")
        return tuple(caps)

    return parse


def _seconds(least: float, strict: bool) -> Any:
    """An argparse type: seconds above (``strict``) or at least ``least``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if value < least or (strict and value == least) or value != value:
            bound = "more than" if strict else "at least"
            raise argparse.ArgumentTypeError(f"expected {bound} {least:g} s, got {text!r}")
        return value

    return parse


positive = _seconds(0.0, strict=True)
non_negative = _seconds(0.0, strict=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="time-scaled, fewer points (~11 min)")
    parser.add_argument(
        "--benches",
        default=",".join(b for b in BENCHES if b != "coding"),
        help=f"comma list of {', '.join(BENCHES)} (default: all but coding, which runs alone)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        help="repetitions per arm and load point (default: 1 quick, 2 full); each cell shows "
        "mean ± its 95 %% t-interval, so 3 or more give usable intervals",
    )
    parser.add_argument("--loads", help="batch agents per load point, e.g. 24,48,96,144")
    parser.add_argument("--time-scale", type=float, help="engine/tool speed-up")
    parser.add_argument("--window-s", type=float, help="measured window, model seconds")
    parser.add_argument("--warmup-s", type=float, help="warm-up, model seconds")
    parser.add_argument(
        "--no-ramp",
        action="store_true",
        help="floods from idle: every agent starts at once instead of over the warm-up's "
        "first half",
    )
    parser.add_argument(
        "--ablate-prefix-keeping",
        action="store_true",
        help="floods also run a luftpause arm with keep_prefixes = false (luftpause-no-pk)",
    )
    parser.add_argument(
        "--luftpause-targets",
        metavar="S,S,...",
        default="",
        help="own-loop and coding floods: one more luftpause arm per S (luftpause-xS), "
        'its scheduler given interactive_target = "Sx" (a slowdown over the floor, S > 1), '
        "e.g. 1.2,1.5,2: luftpause's frontier (default: none)",
    )
    parser.add_argument(
        "--luftpause-pack-targets",
        metavar="S,S,...",
        default="",
        help="the same with packing (luftpause-pack-xS: target_packing = true beside the "
        "target; default: none)",
    )
    parser.add_argument(
        "--luftpause-wset",
        action="store_true",
        help="own-loop and coding floods: one more luftpause arm with working-set admission "
        'instead of prefix keeping\'s run limit (luftpause-wset: working_set = "replace")',
    )
    parser.add_argument(
        "--ablate-pace",
        action="store_true",
        help="floods also run a luftpause arm with interactive_pace_ms = 0 (luftpause-no-pace)",
    )
    parser.add_argument(
        "--smg-caps",
        type=_caps(SMG_INTERACTIVE_RESERVED + 1),
        metavar="C,C,...",
        help="own-loop and coding floods: one more SMG arm per C (smg-capC), its priority "
        f"scheduler given C slots over both engines ({SMG_INTERACTIVE_RESERVED} reserved for "
        f"interactive, so C > {SMG_INTERACTIVE_RESERVED}); sweeps SMG's frontier, e.g. "
        "8,12,16 (default: none)",
    )
    parser.add_argument(
        "--smg-policy",
        # SMG 1.13 refuses power_of_two without --worker-urls, as the capped arms start.
        choices=("cache_aware", "round_robin", "random"),
        help="SMG's --policy, where a run's first turn goes (sticky sessions keep the rest "
        "there); default cache_aware, SMG's own. On runs with long shared prefixes "
        "cache_aware can put every run on one engine: round_robin spreads them",
    )
    parser.add_argument(
        "--smg-load-poll-s",
        type=positive_float,
        metavar="S",
        help="SMG's --load-monitor-interval in model seconds (default: 10, SMG's own), passed "
        "÷ the time scale and rounded up to whole seconds like SMG's other times: how often "
        "SMG reads the engines' load, which cache_aware scores a run's first turn by",
    )
    parser.add_argument(
        "--smg-fifo-caps",
        type=_caps(1),
        metavar="C,C,...",
        help="own-loop and coding floods: one more SMG arm per C (smg-fifoC): no priority "
        "scheduler, --max-concurrent-requests C with a FIFO queue - a class-blind router queue cap "
        "(default: none)",
    )
    parser.add_argument(
        "--vllm-router",
        action="store_true",
        help="own-loop floods (own, light, coding): also vLLM's router (PyPI vllm-router) "
        "in front of two more fake engines with vLLM's metric names: vllm-router (plain), "
        "vllm-prog (program scheduling), vllm-prog-kv (program scheduling given the "
        "engines' KV pool as token_capacity_per_target)",
    )
    parser.add_argument(
        "--arms",
        metavar="NAME,...",
        help="run only these arms at every point, e.g. luftpause,vllm-prog (default: all)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.svg",
        help="also write the own-loop flood's frontier (interactive against batch runs/min "
        "per arm, SMG's caps as lines, 95 %% intervals as whiskers) as an SVG file; for a "
        "coding flood alone, interactive turn p50 against batch reply tokens/min",
    )
    parser.add_argument(
        "--coding-loads",
        type=_caps(1),
        metavar="N,N,...",
        help="coding flood: batch agents per point (default: "
        + ",".join(map(str, FULL.coding_loads))
        + ")",
    )
    parser.add_argument(
        "--coding-window-s",
        type=positive,
        help=f"coding flood: measured window, model seconds (default {FULL.coding_window_s:g})",
    )
    parser.add_argument(
        "--coding-warmup-s",
        type=non_negative,
        help=f"coding flood: warm-up, model seconds (default {FULL.coding_warmup_s:g})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT
        / "docs/benchmarks/results"
        / f"{time.strftime('%Y-%m-%d', time.gmtime())}-flood.md",
        help="write the report here (default: docs/benchmarks/results/YYYY-MM-DD-flood.md, "
        "today's UTC date)",
    )
    parser.add_argument("--json", type=Path, help="also write every raw result here")
    parser.add_argument(
        "--report-from", type=Path, metavar="JSON", help="only re-render a --json file's report"
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.reps:
        overrides["reps"] = args.reps
    if args.loads:
        loads = tuple(int(x) for x in args.loads.split(","))
        overrides["loads"] = loads
        overrides["mcp_loads"] = loads
    if args.time_scale:
        overrides["time_scale"] = args.time_scale
    if args.window_s:
        overrides["window_s"] = args.window_s
    if args.warmup_s is not None:
        overrides["warmup_s"] = args.warmup_s
    if args.no_ramp:
        overrides["ramp"] = False
    if args.smg_caps:
        overrides["smg_caps"] = args.smg_caps
    if args.smg_fifo_caps:
        overrides["smg_fifo_caps"] = args.smg_fifo_caps
    if args.smg_policy:
        overrides["smg_policy"] = args.smg_policy
    if args.smg_load_poll_s is not None:
        overrides["smg_load_poll_s"] = args.smg_load_poll_s
    if args.coding_loads:
        overrides["coding_loads"] = args.coding_loads
    if args.coding_window_s is not None:
        overrides["coding_window_s"] = args.coding_window_s
    if args.coding_warmup_s is not None:
        overrides["coding_warmup_s"] = args.coding_warmup_s
    if args.vllm_router:
        overrides["vllm_router"] = True
    if args.luftpause_wset:
        overrides["luftpause_wset"] = True
    for flag in ("luftpause_targets", "luftpause_pack_targets"):
        if getattr(args, flag):
            targets = tuple(t.strip() for t in getattr(args, flag).split(",") if t.strip())
            for t in targets:
                if slowdown_arm(f"luftpause-x{t}") is None:
                    option = "--" + flag.replace("_", "-")
                    parser.error(f"{option} takes slowdowns above 1, not {t!r}")
            overrides[flag] = targets
    if args.arms:
        overrides["arms"] = tuple(
            dict.fromkeys(a.strip() for a in args.arms.split(",") if a.strip())
        )
    if overrides:
        from dataclasses import replace

        plan = replace(plan, **overrides)
    if args.report_from:
        saved = json.loads(args.report_from.read_text())
        saved.setdefault("machine", machine())  # a run saved before the JSON kept it
        text = render(saved, rendered="python tools/bench/flood.py " + " ".join(sys.argv[1:]))
        args.out.write_text(text)
        print(text)
        svg = render_plot(saved) if args.plot else None
        if args.plot and svg is not None:
            args.plot.write_text(svg)
            print(f"plot: {args.plot}", file=sys.stderr)
        return 0
    benches = {b.strip() for b in args.benches.split(",") if b.strip()}
    unknown = benches - set(BENCHES)
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    if "coding" in benches and len(benches) > 1:
        parser.error(
            "--benches coding runs alone: its engines need a long context "
            f"({' '.join(CODING_ENGINE_ARGS)}), which would change every other bench"
        )
    command = "python tools/bench/flood.py " + " ".join(sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    code = code_version()
    load_before = os.getloadavg()
    t0 = time.monotonic()
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {}
    floors: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="luftpause-flood-") as tmp_name:
        tmp = Path(tmp_name)
        out = tmp / "results"
        out.mkdir()
        print(f"starting the stack (logs in {tmp})", file=sys.stderr)
        ablate = frozenset(
            name
            for name, on in (
                ("prefix-keeping", args.ablate_prefix_keeping),
                ("pace", args.ablate_pace),
            )
            if on
        )
        stack = start_stack(plan, tmp, benches, ablate=ablate)
        routers = dict(stack.router_info)
        try:
            schedule: list[tuple[str, int, list[Arm]]] = []
            if "own" in benches:
                schedule += [("own", n, own_arms(stack, "own", n, 8000)) for n in plan.loads]
            if "light" in benches:
                schedule.append(
                    ("light", plan.light_batch, own_arms(stack, "light", plan.light_batch, 2000))
                )
            if stack.runtimes:
                if "mcp" in benches:
                    schedule += [("mcp", n, mcp_arms(stack, n, 8000)) for n in plan.mcp_loads]
                if "routing" in benches:
                    schedule.append(("routing", plan.routing_agents, routing_arms(stack)))
                if "fanout" in benches:
                    schedule.append(("fanout", plan.fanout_n, fanout_arms(stack)))
            if "coding" in benches:
                schedule += [("coding", n, coding_arms(stack, n)) for n in plan.coding_loads]
            try:
                schedule = select_arms(schedule, plan.arms)
            except ValueError as exc:
                parser.error(str(exc))
            contexts = sorted(
                {8000 for b in benches if b in ("own", "mcp", "routing")}
                | ({2000} if "light" in benches else set())
            )
            for ctx in contexts:
                f = floor(stack, ctx, out)
                floors[ctx] = f["classes"]["interactive"]["run_s"]["p50"] * plan.time_scale
            clock = ArmClock(plan.reps * sum(len(arms) for _, _, arms in schedule))
            for rep in range(plan.reps):
                for index, (bench, load, arms) in enumerate(schedule):
                    # A Williams Latin square's row per repetition, shifted by the point:
                    # no arm keeps its position from one repetition (or neighbouring
                    # point) to the next, and over len(arms) repetitions every arm runs
                    # once in every position.
                    order = [arms[i] for i in arm_order(len(arms), rep + index)]
                    for arm in order:
                        print(
                            f"[{clock.start()}] {arm.bench} load {arm.load} {arm.name} rep {rep}",
                            file=sys.stderr,
                            flush=True,
                        )
                        r = run_loadgen(stack, arm, rep, out)
                        clock.finished()
                        results.setdefault(bench, {}).setdefault(load, {}).setdefault(
                            arm.name, []
                        ).append(r)
                # Keep the arms' display order stable whatever order they ran in.
                for bench, load, arms in schedule:
                    by = results.get(bench, {}).get(load, {})
                    results[bench][load] = {a.name: by[a.name] for a in arms if a.name in by}
        finally:
            stack.stop()
    minutes = (time.monotonic() - t0) / 60
    saved = {
        "plan": plan.__dict__,
        "results": results,
        "floors": floors,
        "command": command,
        "started": started,
        "minutes": minutes,
        "load_before": list(load_before),
        "code": code,
        "routers": routers,  # vLLM router arms: version, command line, configuration
        "machine": machine(),
    }
    if args.json:
        args.json.write_text(json.dumps(saved, indent=1))
    text = render(saved)
    args.out.write_text(text)
    print(text)
    svg = render_plot(saved) if args.plot else None
    if args.plot and svg is not None:
        args.plot.write_text(svg)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
