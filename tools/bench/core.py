"""Throughput of the pure scheduling core (S1): events/s of ``decide`` in steady state.

For each cell (runs × replicas) the benchmark builds a realistic state through
``decide`` itself: every replica probed healthy with a cap, N runs pre-populated
(each asked for one turn: admitted and finished, some paused on a tool, the rest
idle; or, where the core held it, abandoned), ~32 callers, both service classes.
It then drives a steady-state mix for a warm-up and times a fixed number of
events: a turn is requested (admitted or held), started, gets its first token,
finishes (sometimes paused on a tool, sometimes failed); runs end and new ones
start; replicas are probed and the clock ticks now and then. Only the time spent
inside ``decide`` is counted; the workload generator is outside the timer.

Goals (SPEC S1: per-event cost must not grow with the number of runs):
  * >= 100,000 events/s at 10k runs x 64 replicas, on one core (issue #18; it was
    50,000 while the core measured ~35,000);
  * per-event cost from 1k to 100k runs grows by at most 2x, per replica count.

Where the time goes (``--profile``): the persistent-map updates and the few frozen
records each event rebuilds (the new State, the turn, the run, the replica's
counters; see the end of ``state.py`` for how they are built quickly). Time is
shared machines' time: run it on a quiet machine, or compare runs interleaved.

The compiled core (docs/development "The compiled core"): the table says which build
of ``luftpause.scheduler.core`` it timed, pure Python or compiled by mypyc. With
``--compiled-venv .venv-mypyc`` (``make test-compiled`` builds it) the same cells are
then timed again by that venv's python, which loads the compiled build, and the two
builds' figures are printed side by side; its goal: >= 250,000 events/s at 10k runs x 64
replicas (issue #42).

Usage: ``python tools/bench/core.py [--quick] [--json PATH] [--profile]
[--compiled-venv DIR]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    EndpointKind,
    FirstTokenReceived,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    RunEnded,
    ServiceClass,
    State,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    decide,
    initial_state,
)
from luftpause.scheduler.core.events import Event
from luftpause.scheduler.core.state import COMPILED

RUNS = (1_000, 10_000, 100_000)
REPLICAS = (8, 64, 512)
MODELS = 4  # replica i serves model i % MODELS
CALLERS = 32
ACTIVE = 240  # outstanding turns (held + in flight), the same in every cell
PAUSED_AT_START = 200  # runs paused on a tool when timing starts (the rest are idle)
CHUNKS = 7  # the timed events are split in chunks; the median chunk is reported
GOAL_EVENTS_PER_S = 100_000.0
GOAL_COMPILED_EVENTS_PER_S = 250_000.0  # the compiled build (issue #42)
BUILD = "compiled (mypyc)" if COMPILED else "pure Python"
GOAL_CELL = (10_000, 64)
GOAL_GROWTH = 2.0
STEP_S = 0.001  # simulated time between events


@dataclass
class Cell:
    runs: int
    replicas: int
    cap: int
    events: int
    seconds: float  # inside decide only, all chunks
    us_per_event: float  # median over the chunks
    events_per_s: float  # from the median
    chunk_us_per_event: list[float]
    held_at_end: int
    in_flight_at_end: int
    admits: int


class Workload:
    """A steady-state event source that reacts to the core's actions like a host would."""

    def __init__(self, n_runs: int, n_replicas: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n_replicas = n_replicas
        self.specs = tuple(
            ReplicaSpec(f"r{i:03d}", EndpointKind.GENERATIVE, frozenset({f"m{i % MODELS}"}))
            for i in range(n_replicas)
        )
        self.state: State = initial_state(self.specs, Params())
        self.now = 0.0
        self.seq = 0
        # run -> (model, class, caller); runs with a turn outstanding are busy
        self.runs: dict[str, tuple[str, ServiceClass, str]] = {}
        self.run_ids: list[str] = []
        self.paused: list[str] = []  # runs last seen paused on a tool (may be stale)
        self.busy: set[str] = set()
        self.turn_run: dict[str, str] = {}
        self.stage: dict[str, int] = {}  # admitted turn -> 0 admitted, 1 started, 2 first token
        self.in_flight: list[str] = []  # admitted turns, for O(1) random picks
        self.slot: dict[str, int] = {}
        self.held = 0
        self.admits = 0
        self.timed_ns = 0
        # The active load is the same whatever the number of runs, so that the cells of
        # one replica count differ only in how many (idle or paused) runs the state
        # holds. Caps are sized so the pool runs just below the load (some turns are
        # held) where the replica count allows; 512 replicas at cap 1 are not saturated.
        self.cap = max(1, int(ACTIVE * 0.95) // n_replicas)
        self.target = ACTIVE
        self.max_paused_interactive = max(1, n_replicas * self.cap // 8)

    # ----------------------------------------------------------------- plumbing

    def feed(self, ev: Event) -> None:
        t0 = time.perf_counter_ns()
        self.state, actions = decide(self.state, ev)
        self.timed_ns += time.perf_counter_ns() - t0
        for a in actions:
            if isinstance(a, Admit):
                self.admits += 1
                if a.turn_id not in self.stage:
                    self.held -= 1
                    self._track(a.turn_id)
            else:  # Reject, DropTurn, ForgetRun: not expected in this mix
                turn_id = getattr(a, "turn_id", None)
                if isinstance(turn_id, str) and turn_id in self.stage:
                    self._untrack(turn_id)

    def _track(self, turn_id: str) -> None:
        self.stage[turn_id] = 0
        self.slot[turn_id] = len(self.in_flight)
        self.in_flight.append(turn_id)

    def _untrack(self, turn_id: str) -> None:
        del self.stage[turn_id]
        i = self.slot.pop(turn_id)
        last = self.in_flight.pop()
        if last != turn_id:
            self.in_flight[i] = last
            self.slot[last] = i
        self.busy.discard(self.turn_run.pop(turn_id))

    def tick_clock(self) -> None:
        self.now += STEP_S

    def new_run(self) -> str:
        self.seq += 1
        run_id = f"run-{self.seq}"
        model = f"m{self.rng.randrange(min(MODELS, self.n_replicas))}"
        interactive = self.rng.random() < 0.3
        cls = ServiceClass.INTERACTIVE if interactive else ServiceClass.BATCH
        self.runs[run_id] = (model, cls, f"caller-{self.rng.randrange(CALLERS)}")
        self.run_ids.append(run_id)
        return run_id

    def request(self, run_id: str) -> None:
        model, cls, caller = self.runs[run_id]
        self.seq += 1
        turn_id = f"turn-{self.seq}"
        self.turn_run[turn_id] = run_id
        self.busy.add(run_id)
        self.held += 1  # until its Admit arrives (maybe in this very event)
        self.feed(TurnRequested(self.now, turn_id, run_id, model, cls, caller))

    # ------------------------------------------------------------------ phases

    def populate(self, n_runs: int) -> None:
        """Probe every replica (with its cap), then give each of n_runs one finished turn."""
        for spec in self.specs:
            self.feed(ReplicaProbed(self.now, spec.name, True, self.cap, 1, 0.5))
        paused_interactive = 0
        # the same number of paused runs in every cell: only the idle ones scale with N
        paused_runs = set(self.rng.sample(range(n_runs), min(n_runs, PAUSED_AT_START)))
        for i in range(n_runs):
            run_id = self.new_run()
            self.request(run_id)
            turn_id = f"turn-{self.seq}"
            _, cls, _ = self.runs[run_id]
            pause = i in paused_runs
            if pause and cls is ServiceClass.INTERACTIVE:
                pause = paused_interactive < self.max_paused_interactive
                paused_interactive += pause
            if turn_id in self.stage:
                self._untrack(turn_id)
                self.feed(TurnFinished(self.now, turn_id, paused_on_tool=pause))
                if pause:
                    self.paused.append(run_id)
            else:
                # Held (prefix keeping holds new batch runs back on a replica full of
                # runs): its client gives up. Left held, one such turn per run piled up,
                # and the 100k-run cells timed a core holding ~15,000 turns with the
                # workload generator stalled behind them.
                self.held -= 1
                self.busy.discard(self.turn_run.pop(turn_id))
                self.feed(TurnAbandoned(self.now, turn_id))
            self.tick_clock()

    def step(self) -> None:
        """One event of the steady-state mix."""
        self.tick_clock()
        r = self.rng.random()
        if r < 0.002:
            spec = self.specs[self.rng.randrange(len(self.specs))]
            waiting = 1 if self.rng.random() < 0.5 else 0
            self.feed(ReplicaProbed(self.now, spec.name, True, self.cap, waiting, 0.5))
            return
        if r < 0.003:
            self.feed(ClockTicked(self.now))
            return
        if r < 0.006 and self.run_ids:
            # a run ends; a new one replaces it below when requests come
            run_id = self.run_ids[self.rng.randrange(len(self.run_ids))]
            if run_id not in self.busy:
                self.feed(RunEnded(self.now, run_id))
                return
        outstanding = len(self.in_flight) + self.held
        if outstanding < self.target or not self.in_flight:
            self.request(self.pick_run())
            return
        turn_id = self.in_flight[self.rng.randrange(len(self.in_flight))]
        stage = self.stage[turn_id]
        if stage == 0:
            self.stage[turn_id] = 1
            self.feed(TurnStarted(self.now, turn_id))
        elif stage == 1:
            self.stage[turn_id] = 2
            self.feed(FirstTokenReceived(self.now, turn_id))
        else:
            run_id = self.turn_run[turn_id]
            self._untrack(turn_id)
            x = self.rng.random()
            if x < 0.01:
                self.feed(TurnFailed(self.now, turn_id, "engine error"))
            else:
                pause = x < 0.45
                self.feed(TurnFinished(self.now, turn_id, paused_on_tool=pause))
                if pause:
                    self.paused.append(run_id)

    def pick_run(self) -> str:
        """A paused run coming back from its tool, an existing idle run, or a new run."""
        x = self.rng.random()
        if x < 0.6:
            while self.paused:
                run_id = self.paused.pop(self.rng.randrange(len(self.paused)))
                if run_id not in self.busy and run_id in self.runs:
                    return run_id
        if x < 0.95:
            for _ in range(4):
                run_id = self.run_ids[self.rng.randrange(len(self.run_ids))]
                if run_id not in self.busy:
                    return run_id
        return self.new_run()


def measure(n_runs: int, n_replicas: int, events: int, warmup: int, seed: int = 1) -> Cell:
    w = Workload(n_runs, n_replicas, seed)
    w.populate(n_runs)
    for _ in range(warmup):
        w.step()
    w.admits = 0
    per_chunk = max(1, events // CHUNKS)
    chunks: list[float] = []
    total_ns = 0
    for _ in range(CHUNKS):
        w.timed_ns = 0
        for _ in range(per_chunk):
            w.step()
        total_ns += w.timed_ns
        chunks.append(w.timed_ns / per_chunk / 1e3)
    us = statistics.median(chunks)
    return Cell(
        runs=n_runs,
        replicas=n_replicas,
        cap=w.cap,
        events=per_chunk * CHUNKS,
        seconds=total_ns / 1e9,
        us_per_event=us,
        events_per_s=1e6 / us if us > 0 else float("inf"),
        chunk_us_per_event=[round(c, 3) for c in chunks],
        held_at_end=len(w.state.held),
        in_flight_at_end=len(w.state.turns),
        admits=w.admits,
    )


def profile(n_runs: int, n_replicas: int, events: int, warmup: int) -> str:
    """cProfile of the timed phase of one cell, top functions by own time."""
    w = Workload(n_runs, n_replicas, seed=1)
    w.populate(n_runs)
    for _ in range(warmup):
        w.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(events):
        w.step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Events/s of the scheduling core's decide() for runs x replicas.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer timed events per cell")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write results as JSON")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the table, cProfile the 10k runs x 64 replicas cell",
    )
    parser.add_argument(
        "--compiled-venv",
        metavar="DIR",
        type=Path,
        help="then time the compiled build installed in DIR (make test-compiled: .venv-mypyc) "
        "and print both builds side by side",
    )
    args = parser.parse_args(argv)
    if args.compiled_venv is not None and COMPILED:
        parser.error("--compiled-venv: run this with the pure build's python (.venv)")
    events = 4_000 if args.quick else 20_000
    warmup = 1_000 if args.quick else 3_000

    print(f"luftpause scheduler core: decide() throughput, one core, {events} timed events/cell")
    print(f"build: {BUILD}, luftpause.scheduler.core from {Path(core_file()).parent}")
    print(
        f"python {sys.version.split()[0]}; {ACTIVE} outstanding turns; {CALLERS} callers; "
        f"{MODELS} models; us/event = median of {CHUNKS} chunks, time inside decide() only"
    )
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print()
    header = (
        f"{'runs':>8} {'replicas':>9} {'cap':>4} {'us/event':>9} {'events/s':>10} "
        f"{'held':>5} {'admits':>7}  chunks us/event"
    )
    print(header)
    print("-" * len(header))
    cells: list[Cell] = []
    for n_replicas in REPLICAS:
        for n_runs in RUNS:
            c = measure(n_runs, n_replicas, events, warmup)
            cells.append(c)
            spread = " ".join(f"{x:.1f}" for x in c.chunk_us_per_event)
            print(
                f"{c.runs:>8} {c.replicas:>9} {c.cap:>4} {c.us_per_event:>9.2f} "
                f"{c.events_per_s:>10,.0f} {c.held_at_end:>5} {c.admits:>7}  {spread}",
                flush=True,
            )
    print()
    by = {(c.runs, c.replicas): c for c in cells}
    growth: dict[str, float] = {}
    print(f"per-event cost growth {RUNS[0]:,} -> {RUNS[-1]:,} runs (goal <= {GOAL_GROWTH:.1f}x):")
    growth_ok = True
    for n_replicas in REPLICAS:
        g = by[(RUNS[-1], n_replicas)].us_per_event / by[(RUNS[0], n_replicas)].us_per_event
        growth[str(n_replicas)] = g
        ok = g <= GOAL_GROWTH
        growth_ok = growth_ok and ok
        print(f"  {n_replicas:>4} replicas: {g:5.2f}x  {'met' if ok else 'MISSED'}")
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    goal = by[GOAL_CELL]
    rate_ok = goal.events_per_s >= GOAL_EVENTS_PER_S
    print(
        f"throughput at {GOAL_CELL[0]:,} runs x {GOAL_CELL[1]} replicas: "
        f"{goal.events_per_s:,.0f} events/s (goal >= {GOAL_EVENTS_PER_S:,.0f})  "
        f"{'met' if rate_ok else 'MISSED'}"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "build": BUILD,
                    "events_per_cell": events,
                    "cells": [asdict(c) for c in cells],
                    "growth_1k_to_100k": growth,
                    "goals": {
                        "events_per_s_at_10k_x_64": GOAL_EVENTS_PER_S,
                        "max_growth": GOAL_GROWTH,
                        "throughput_met": rate_ok,
                        "growth_met": growth_ok,
                    },
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    if args.profile:
        print()
        print(profile(GOAL_CELL[0], GOAL_CELL[1], events, warmup))
    if args.compiled_venv is not None:
        return side_by_side(cells, args.compiled_venv, args.quick)
    return 0


def core_file() -> str:
    return str(sys.modules["luftpause.scheduler.core.decide"].__file__)


def side_by_side(pure: list[Cell], venv: Path, quick: bool) -> int:
    """Time the same cells with ``venv``'s python (the compiled build) and print both."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"--compiled-venv {venv}: no {python} (make test-compiled builds it)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compiled.json"
        cmd = [str(python), __file__, "--json", str(out), *(["--quick"] if quick else [])]
        print()
        print("the compiled build, timed by", python, flush=True)
        subprocess.run(cmd, check=True)
        other = json.loads(out.read_text())
    if other.get("build") != "compiled (mypyc)":
        print(f"{python} loaded the {other.get('build')} build, not the compiled one")
        return 2
    by = {(c["runs"], c["replicas"]): c for c in other["cells"]}
    print()
    print("both builds (us/event and events/s; speedup = pure / compiled us/event):")
    header = (
        f"{'runs':>8} {'replicas':>9} {'pure us':>8} {'pure ev/s':>10} "
        f"{'mypyc us':>9} {'mypyc ev/s':>11} {'speedup':>8}"
    )
    print(header)
    print("-" * len(header))
    ratios = []
    for c in pure:
        m = by[(c.runs, c.replicas)]
        ratio = c.us_per_event / m["us_per_event"]
        ratios.append(ratio)
        print(
            f"{c.runs:>8} {c.replicas:>9} {c.us_per_event:>8.2f} {c.events_per_s:>10,.0f} "
            f"{m['us_per_event']:>9.2f} {m['events_per_s']:>11,.0f} {ratio:>7.2f}x"
        )
    print(f"speedup, geometric mean over the cells: {statistics.geometric_mean(ratios):.2f}x")
    goal = by[GOAL_CELL]["events_per_s"]
    print(
        f"compiled throughput at {GOAL_CELL[0]:,} runs x {GOAL_CELL[1]} replicas: "
        f"{goal:,.0f} events/s (goal >= {GOAL_COMPILED_EVENTS_PER_S:,.0f})  "
        f"{'met' if goal >= GOAL_COMPILED_EVENTS_PER_S else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
