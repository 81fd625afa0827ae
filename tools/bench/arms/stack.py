"""The flood's stack: the fake engines, the SGLang router, SMG, vLLM's router, the
runtimes; what the engines did over an arm; one arm's load generator run; the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from luftpause.loadgen import main as loadgen
from luftpause.procs import (
    launch_sglang_router,
    launch_smg,
)
from tools.bench.arms.luftpause import (
    StatusSampler,
    _config,
    _luftpause,
    held_totals,
    runtime_available,
    window_figures,
    window_start,
)
from tools.bench.arms.plan import (
    CODING_ENGINE_ARGS,
    MODEL,
    OWN_LOOP,
    TOOL_CALLS,
    Arm,
    Plan,
    Stack,
    probe_period,
)
from tools.bench.arms.schedule import RUNTIME_BEHIND_SMG
from tools.bench.arms.smg import smg_arms_config, smg_command, smg_scheduler_yaml, smg_wait_totals
from tools.bench.arms.vllm import VLLM_ENGINE_ARGS, read_diagnostics, start_vllm_routers


def start_engines(s: Stack, extra: tuple[str, ...] = (), vllm: bool = False) -> None:
    """The two fake engines (priority scheduling on, as in every arm) and the fake tools;
    ``extra``: more engine flags (the coding flood's long context); ``vllm``: also the
    vLLM router arms' two engines, the same but with vLLM's metric names."""
    ts = f"{s.plan.time_scale:g}"
    pairs = [(("engine-a", "engine-b"), extra, s.engines)]
    if vllm:
        pairs.append((("vllm-engine-a", "vllm-engine-b"), extra + VLLM_ENGINE_ARGS, s.vllm_engines))
    for names, flags, urls in pairs:
        for name in names:
            svc = s.start(
                "fake-engine", "--name", name, "--port", "0", "--time-scale", ts,
                "--priority-scheduling", "--chunk-tokens", str(s.plan.chunk_tokens),
                "--tool-results", str(TOOL_CALLS), "--log-level", "WARNING", *flags,
                name=name,
            )  # fmt: skip
            urls.append(svc.urls["http"])
    tools = s.start(
        "fake-mcp", "--port", "0", "--time-scale", ts, "--log-level", "WARNING", name="fake-mcp"
    )
    s.tools_url = f"{tools.urls['http']}/mcp"


def start_stack(
    plan: Plan, tmp: Path, benches: set[str], ablate: frozenset[str] = frozenset()
) -> Stack:
    """``ablate``: "prefix-keeping" and/or "pace", a luftpause arm each with it off."""
    s = Stack(tmp, plan)
    vllm = plan.vllm_router and bool(benches & OWN_LOOP)
    start_engines(s, CODING_ENGINE_ARGS if "coding" in benches else (), vllm=vllm)
    probe_s = probe_period(plan)
    s.dataplane = _luftpause(s, _config(tmp / "stack.toml", s, probe_s), "")
    if "prefix-keeping" in ablate:
        config = _config(tmp / "stack-no-pk.toml", s, probe_s, keep_prefixes=False)
        s.ablations["luftpause-no-pk"] = _luftpause(s, config, "-no-pk")
    if "pace" in ablate:
        config = _config(tmp / "stack-no-pace.toml", s, probe_s, pace=False)
        s.ablations["luftpause-no-pace"] = _luftpause(s, config, "-no-pace")
    if plan.luftpause_wset:
        config = _config(tmp / "stack-wset.toml", s, probe_s, working_set="replace")
        s.ablations["luftpause-wset"] = _luftpause(s, config, "-wset")
    for slowdown in plan.luftpause_targets:
        config = _config(tmp / f"stack-x{slowdown}.toml", s, probe_s, target=slowdown)
        s.ablations[f"luftpause-x{slowdown}"] = _luftpause(s, config, f"-x{slowdown}")
    for slowdown in plan.luftpause_pack_targets:
        path = tmp / f"stack-pack-x{slowdown}.toml"
        config = _config(path, s, probe_s, target=slowdown, packing=True)
        arm = f"luftpause-pack-x{slowdown}"
        s.ablations[arm] = _luftpause(s, config, f"-pack-x{slowdown}")
    s.routers["cache_aware"] = launch_sglang_router(
        s.engines, "cache_aware", tmp / "router-cache_aware.log", MODEL
    )
    if benches & {"own", "light", "mcp", "coding"}:
        yaml_path = tmp / "smg-priority.yaml"
        yaml_path.write_text(smg_scheduler_yaml(plan.time_scale))
        for name, (flags, capacity) in smg_arms_config(plan, yaml_path).items():
            if name != "smg" and not benches & {"own", "coding"}:
                continue  # the capacity sweeps run in the own-loop and coding floods only
            labels = [{"max_running_requests": str(c)} for c in capacity] if capacity else None
            s.routers[name] = launch_smg(
                s.engines, plan.smg_policy, tmp / f"{name}.log", MODEL,
                extra_args=flags, worker_labels=labels,
            )  # fmt: skip
            shown = [yaml_path.name if f == str(yaml_path) else f for f in flags]
            s.setups[name] = smg_command(shown, capacity, plan.smg_policy)
    if vllm:
        start_vllm_routers(s)
    if "routing" in benches:
        s.routers["round_robin"] = launch_sglang_router(
            s.engines, "round_robin", tmp / "router-round_robin.log", MODEL
        )
    if benches & {"mcp", "routing", "fanout"}:
        if not runtime_available():
            print("runtime not installed: skipping mcp, routing and fanout", file=sys.stderr)
        else:
            upstreams = {"luftpause": s.dataplane, "router": s.routers["cache_aware"].url}
            if "round_robin" in s.routers:
                upstreams["router-rr"] = s.routers["round_robin"].url
            if "mcp" in benches and "smg" in s.routers:
                upstreams["smg"] = s.routers["smg"].url
            for arm, url in upstreams.items():
                cfg = tmp / f"runtime-{arm}.toml"
                cfg.write_text(
                    f'[runtime]\ndataplane_url = "{url}"\nstate_dir = "{tmp / ("state-" + arm)}"\n'
                    f'default_model = "{MODEL}"\n'
                    + (RUNTIME_BEHIND_SMG if arm == "smg" else "")
                    + f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{s.tools_url}"\n'
                )
                rt = s.start(
                    "runtime", "--config", str(cfg), "--port", "0", "--log-level", "WARNING",
                    name=f"runtime-{arm}",
                )  # fmt: skip
                s.runtimes[arm] = f"{rt.urls['http']}/mcp"
    return s


# ------------------------------------------------------------------ observation


def wait_idle(stack: Stack, timeout_s: float = 120.0, engines: list[str] | None = None) -> None:
    """Until both engines (``engines``: these, else the stack's) run and queue nothing
    (the previous arm's requests are gone)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as c:
        while time.monotonic() < deadline:
            busy = 0
            for url in engines or stack.engines:
                load = c.get(f"{url}/get_load").json()
                busy += sum(int(x.get("num_reqs", 0)) for x in load)
            if busy == 0:
                return
            time.sleep(0.2)
    print("warning: engines still busy after the idle wait", file=sys.stderr)


# Step counters every fake engine keeps (``/debug/state``): model seconds busy, seconds
# steps started late, model seconds of prefill, decode steps and their summed batch size;
# and the requests it took, and those with the load generator's plan key (a proxy that
# drops custom headers leaves the engines drawing replies from each conversation).
COUNTERS = (
    "busy_s", "late_s", "prefill_s", "decode_steps", "decode_seqs", "submitted", "plan_keyed",
)  # fmt: skip


class EngineWatch:
    """Collects every request the engines finish (``/debug/state`` recent) while it runs."""

    def __init__(self, engines: list[str], period_s: float = 0.25) -> None:
        self.engines = engines
        self.period_s = period_s
        self.seen: dict[str, dict[str, Any]] = {}
        self.before: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start: list[dict[str, float]] = []
        self.each: list[dict[str, float]] = []  # each engine's step counters over the arm
        self.counters = dict.fromkeys(COUNTERS, 0.0)  # the same, summed over the engines

    def _poll(self, c: httpx.Client) -> tuple[list[dict[str, Any]], list[dict[str, float]]]:
        """The engines' recently finished requests (each with ``engine``: its engine's
        index), and each engine's step counters (zeros for one that did not answer)."""
        rows: list[dict[str, Any]] = []
        each: list[dict[str, float]] = []
        for i, url in enumerate(self.engines):
            own = dict.fromkeys(COUNTERS, 0.0)
            each.append(own)
            try:
                state = c.get(f"{url}/debug/state").json()
            except (httpx.HTTPError, ValueError):
                continue
            rows.extend({**r, "engine": i} for r in state.get("recent", []))
            for k in COUNTERS:
                own[k] = float(state.get(k, 0.0))
        return rows, each

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                for r in self._poll(c)[0]:
                    if r["request_id"] not in self.before:
                        self.seen.setdefault(r["request_id"], r)
                self._stop.wait(self.period_s)

    def __enter__(self) -> EngineWatch:
        # The engines' recent list still holds earlier arms' requests: not this arm's.
        with httpx.Client(timeout=5) as c:
            rows, self._start = self._poll(c)
        self.before = {r["request_id"] for r in rows}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with httpx.Client(timeout=5) as c:
            _, end = self._poll(c)
        pairs = zip(self._start, end, strict=True)
        self.each = [{k: e[k] - s[k] for k in COUNTERS} for s, e in pairs]
        self.counters = {k: sum(e[k] for e in self.each) for k in COUNTERS}

    def summary(self, scale: float) -> dict[str, Any]:
        rows = list(self.seen.values())
        prompt = sum(int(r["prompt_tokens"]) for r in rows)
        cached = sum(int(r["cached_tokens"]) for r in rows)

        c = self.counters
        busy, late = c["busy_s"], c["late_s"]

        def mean(key: str) -> float | None:
            vals = [float(r["timing"][key]) * scale for r in rows]
            return statistics.fmean(vals) if vals else None

        return {
            "requests": len(rows),
            "cached_share": cached / prompt if prompt else None,
            "queued_s": mean("queued_s"),
            "prefill_s": mean("prefill_s"),
            "decode_s": mean("decode_s"),
            # The share of the engines' busy wall time lost to steps starting late (the
            # host's CPU could not keep up with the model): 0 when the model ran exactly.
            "behind": late / (busy + late) if busy else None,
            "prefill_share": c["prefill_s"] / busy if busy else None,
            "decode_batch": c["decode_seqs"] / c["decode_steps"] if c["decode_steps"] else None,
            # The share of the arm's requests whose plan key reached the engines
            "plan_keyed_share": c["plan_keyed"] / c["submitted"] if c["submitted"] else None,
            # Engine by engine: how the arm spread the work (a router that piles runs on
            # one engine shows here, not in the sums above).
            "engines": [
                {
                    "requests": sum(1 for r in rows if r.get("engine") == i),
                    "decode_batch": e["decode_seqs"] / e["decode_steps"]
                    if e["decode_steps"]
                    else None,
                }
                for i, e in enumerate(self.each)
            ],
        }


@contextmanager
def held_delta(
    into: dict[str, Any], totals: Callable[[], dict[str, tuple[float, float]]]
) -> Iterator[None]:
    """Per class, the mean held seconds per turn over the block, from ``totals``
    (cumulative seconds and turns)."""
    before = totals()
    yield
    after = totals()
    for cls, (s, n) in after.items():
        s0, n0 = before.get(cls, (0.0, 0.0))
        if n - n0 > 0:
            into[cls] = {"turns": n - n0, "held_s": (s - s0) / (n - n0)}


def loadgen_seeds(arm: Arm, rep: int) -> tuple[str, str]:
    """The load generator's ``--seed`` for one arm's repetition, which names its runs
    and their prompt text (its own, so no arm finds another's prompts cached in the
    shared engines), and its ``--plan-seed``, which draws a coding run's shape (turns,
    tokens, tool gaps, sub-agents) and an own-loop run's or a sub-agent's tool count and
    replies (its plan key, in its task), and is the same for every arm of a repetition:
    the arms are compared on the same runs, slot for slot (common random numbers)."""
    seed = f"{arm.bench}{arm.load}{arm.name}{rep}".replace("-", "")
    return seed, f"{arm.bench}{arm.load}rep{rep}"


def run_loadgen(stack: Stack, arm: Arm, rep: int, out: Path) -> dict[str, Any]:
    """One arm: ``luftpause loadgen`` with the arm's flags, run in this process (the same
    code as the command; saves a start-up per arm)."""
    plan = stack.plan
    path = out / f"{arm.bench}-{arm.load}-{arm.name}-{rep}.json"
    seed, plan_seed = loadgen_seeds(arm, rep)
    argv = [
        *arm.argv, "--json", str(path), "--quiet", "--seed", seed, "--plan-seed", plan_seed,
        "--label", f"{arm.bench}/{arm.name}/{arm.load}/{rep}",
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="luftpause loadgen")
    loadgen.add_arguments(parser)
    held: dict[str, Any] = {}
    # a luftpause arm: its scheduler's caps, pace limits and held turns over the window
    status_url = (
        stack.statuses.get(arm.dataplane or stack.dataplane, "")
        if arm.name.startswith("luftpause")
        else ""
    )
    engines = arm.engines or stack.engines
    # every engine the flood runs, not only this arm's: the previous arm may have run on
    # the other pair, and its requests still share this machine's cores
    wait_idle(stack, engines=[*stack.engines, *stack.vllm_engines])
    t0 = time.monotonic()
    with (
        StatusSampler(status_url) if status_url else contextlib.nullcontext() as sampler,
        EngineWatch(engines) as watch,
        held_delta(
            held,
            (lambda: smg_wait_totals(arm.smg_metrics))
            if arm.smg_metrics
            else (lambda: held_totals(arm.dataplane or stack.dataplane)),
        ),
        contextlib.redirect_stdout(io.StringIO()) as table,
    ):
        rc = loadgen.main(parser.parse_args(argv))
    elapsed = time.monotonic() - t0
    if rc not in (0, 3) or not path.exists():  # 3: it ran, some runs failed (counted)
        raise RuntimeError(
            f"loadgen failed for {arm.bench}/{arm.name}/{arm.load} (rc {rc}):\n"
            f"{table.getvalue()[-3000:]}"
        )
    result = dict(json.loads(path.read_text()))
    result["engine_side"] = watch.summary(plan.time_scale)
    if isinstance(sampler, StatusSampler):
        result["scheduler"] = window_figures(sampler.samples, window_start(result))
    result["held_by_class"] = held
    result["wall_s"] = elapsed
    result["rep"] = rep
    if arm.name in stack.setups:
        result["setup"] = stack.setups[arm.name]
    if arm.name in stack.router_info:
        result["router"] = stack.router_info[arm.name]
    if arm.diagnostics:
        result["router_diagnostics"] = read_diagnostics(arm.diagnostics)
    if arm.smg_metrics:
        result["held_in_other"] = True  # the client saw SMG's wait as part of the turn
    print(
        f"  {arm.bench:8} load {arm.load:3} {arm.name:12} rep {rep}: "
        + "; ".join(
            f"{c} {s['runs']} runs, {s['runs_per_min'] / plan.time_scale:.1f}/min, "
            f"p50 {(s['run_s']['p50'] or 0) * plan.time_scale:.1f} s"
            for c, s in result["classes"].items()
        )
        + (f"; errors {result['errors']}" if result["error_count"] else "")
        + f" (load avg {result['load_avg'][0]})",
        file=sys.stderr,
        flush=True,
    )
    return result


def floor(stack: Stack, context: int, out: Path) -> dict[str, Any]:
    """One interactive agent alone on an idle engine: the run time nothing can beat."""
    plan = stack.plan
    arm = Arm(
        "floor",
        f"ctx{context}",
        1,
        [
            "--target", stack.engines[0], "--no-class-headers", "--agents", "1",
            "--class", "interactive", "--tools-url", stack.tools_url,
            "--context-chars", str(context), "--tool-calls", str(TOOL_CALLS),
            "--max-runs", str(plan.floor_runs), "--duration-s", f"{plan.real(600):g}",
        ],
    )  # fmt: skip
    return run_loadgen(stack, arm, 0, out)
