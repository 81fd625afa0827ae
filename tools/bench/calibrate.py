"""Calibration checks of the fake engine model (H1), in virtual time.

Two replicas of ``EngineModel`` (default parameters: Llama-3.2-1B on half of an
8 GB RTX 4060 Laptop each) are driven by closed-loop agents without sockets: a
run is a conversation whose turns are sent to the agent's replica; a turn that
ends in a tool call is followed, after the tool's latency (~1 s), by the next
turn with the tool result appended; a run that answers ends and is replaced by a
new run at once. Agents are spread over the two replicas (agent i -> replica
i mod 2), as a round-robin router would.

Scenarios (regimes of the original measurements, not targets to tune to):

* ``saturated``: ~8,000-character contexts, 48 batch + 4 interactive agents,
  replies capped at 256 tokens -> the engines should queue most of the time.
* ``light``: ~2,000-character contexts, 24 batch + 4 interactive agents -> no queue.
* ``uncapped``: as saturated, no reply cap (engine default = context - prompt):
  SGLang reserves room for the longest reply, and the default 1 answer in 4
  runs away to the context limit -> batch throughput should drop ~7x.
* ``uncapped, no runaway``: as uncapped with no runaway answers: SGLang's
  reservation rule alone.

Prints a table; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from luftpause.fakes.engine.model import EngineModel, EngineParams, EngineRequest
from luftpause.fakes.engine.results import StepKind
from luftpause.fakes.engine.script import ReplyKind, ScriptOptions, plan_reply
from luftpause.fakes.engine.tokens import filler_tokens, render_messages

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
TOOL_RESULT_CHARS = 600
REPLICAS = 2


@dataclass(frozen=True)
class Scenario:
    name: str
    context_chars: int
    batch_agents: int
    interactive_agents: int
    max_tokens: int | None
    runaway_per_mille: int = 0


_DEFAULT_RUNAWAY = ScriptOptions().runaway_per_mille

SCENARIOS = (
    Scenario("saturated", 8000, 48, 4, 256, _DEFAULT_RUNAWAY),
    Scenario("light", 2000, 24, 4, 256, _DEFAULT_RUNAWAY),
    Scenario("uncapped", 8000, 48, 4, None, _DEFAULT_RUNAWAY),
    Scenario("uncapped, no runaway", 8000, 48, 4, None, 0),
)


@dataclass
class _Run:
    agent: int
    klass: str
    started: float
    tool_calls_wanted: int
    messages: list[dict[str, Any]]
    turns: int = 0


@dataclass
class Result:
    scenario: str
    queued_fraction: float  # share of time a replica had waiting > 0 (mean over replicas)
    mean_running: float  # time-averaged running requests per replica
    mean_waiting: float
    batch_runs_per_min: float
    interactive_runs_per_min: float
    interactive_p50_s: float
    batch_p50_s: float
    turn_p50_s: float
    cached_share: float  # cached prompt tokens / prompt tokens
    retractions: int
    completion_tokens_per_s: float
    extra: dict[str, float] = field(default_factory=dict)


def simulate(scenario: Scenario, params: EngineParams, seed: int, duration_s: float) -> Result:
    rng = random.Random(seed)
    engines = [EngineModel(params) for _ in range(REPLICAS)]
    options = ScriptOptions(tool_results=3, runaway_per_mille=scenario.runaway_per_mille, seed=seed)
    warmup = min(60.0, duration_s / 4)
    events: list[tuple[float, int, int, str, Any]] = []
    seq = 0

    def push(t: float, order: int, kind: str, data: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (t, order, seq, kind, data))
        seq += 1

    runs: dict[int, _Run] = {}
    pending: dict[str, tuple[int, _Run]] = {}  # request id -> (replica, run)
    engine_busy = [False] * REPLICAS
    counters = {"run": 0, "req": 0}
    finished_runs: list[tuple[str, float, float]] = []  # class, end, duration
    turn_times: list[float] = []
    submit_times: dict[str, float] = {}
    prompt_tokens = 0
    cached_tokens = 0
    completion_tokens = 0
    area_waiting_flag = [0.0] * REPLICAS
    area_running = [0.0] * REPLICAS
    area_waiting = [0.0] * REPLICAS
    measured = [0.0] * REPLICAS

    def new_run(agent: int, klass: str, now: float) -> None:
        counters["run"] += 1
        n = counters["run"]
        task = "".join(filler_tokens(scenario.context_chars // 4, f"{seed}/task/{n}"))
        run = _Run(
            agent=agent,
            klass=klass,
            started=now,
            tool_calls_wanted=rng.randint(1, 3),
            messages=[
                {"role": "system", "content": "You are a careful research agent."},
                {"role": "user", "content": f"Task {n}: {task}"},
            ],
        )
        runs[agent] = run
        push(now, 0, "submit", agent)

    def submit(agent: int, now: float) -> None:
        run = runs[agent]
        replica = agent % REPLICAS
        prompt = render_messages(run.messages, TOOLS)
        plan = plan_reply(
            run.messages,
            TOOLS,
            options,
            prompt_text=prompt,
            tool_results=run.tool_calls_wanted,
        )
        counters["req"] += 1
        rid = f"q{counters['req']}"
        engines[replica].submit(
            EngineRequest(rid, prompt, plan.reply_tokens, scenario.max_tokens), now
        )
        pending[rid] = (replica, run)
        submit_times[rid] = now
        run.turns += 1
        run_plan[rid] = plan
        if not engine_busy[replica]:
            engine_busy[replica] = True
            push(now, 1, "step", replica)

    run_plan: dict[str, Any] = {}
    agents = [("batch", i) for i in range(scenario.batch_agents)]
    agents += [
        ("interactive", scenario.batch_agents + i) for i in range(scenario.interactive_agents)
    ]
    for klass, agent in agents:
        # Stagger the first turns over the first second, as agents would start.
        new_run(agent, klass, rng.uniform(0.0, 1.0))
    klass_of = dict((a, k) for k, a in agents)

    while events:
        now, _, _, kind, data = heapq.heappop(events)
        if now > duration_s:
            break
        if kind == "submit":
            submit(int(data), now)
            continue
        if kind == "new_run":
            new_run(int(data), klass_of[int(data)], now)
            continue
        replica = int(data)
        engine = engines[replica]
        step = engine.step(now)
        if step.kind is StepKind.IDLE:
            engine_busy[replica] = False
            continue
        # The state during the step: after admission, requests still waiting were
        # refused a slot (those that arrive mid-step get their chance next step).
        before = engine.metrics()
        if now >= warmup:
            span = min(step.end, duration_s) - now
            measured[replica] += span
            area_running[replica] += before.running * span
            area_waiting[replica] += before.waiting * span
            if before.waiting > 0:
                area_waiting_flag[replica] += span
        for done in step.finished:
            _, run = pending.pop(done.request_id)
            plan = run_plan.pop(done.request_id)
            if step.end >= warmup:
                turn_times.append(step.end - submit_times[done.request_id])
                prompt_tokens += done.prompt_tokens
                cached_tokens += done.cached_tokens
                completion_tokens += done.completion_tokens
            submit_times.pop(done.request_id, None)
            if plan.kind is ReplyKind.TOOL_CALL and done.reason.value == "stop":
                call = plan.tool_call
                run.messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                        ],
                    }
                )
                result = "".join(filler_tokens(TOOL_RESULT_CHARS // 4, f"{call.id}/result"))
                run.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                push(step.end + rng.uniform(0.5, 1.5), 0, "submit", run.agent)
            else:
                if step.end >= warmup:
                    finished_runs.append((run.klass, step.end, step.end - run.started))
                push(step.end, 0, "new_run", run.agent)
        push(step.end, 1, "step", replica)

    window_min = max(1e-9, (duration_s - warmup) / 60.0)
    batch = [d for k, _, d in finished_runs if k == "batch"]
    inter = [d for k, _, d in finished_runs if k == "interactive"]
    total_measured = sum(measured) or 1e-9
    return Result(
        scenario=scenario.name,
        queued_fraction=sum(area_waiting_flag) / total_measured,
        mean_running=sum(area_running) / total_measured,
        mean_waiting=sum(area_waiting) / total_measured,
        batch_runs_per_min=len(batch) / window_min,
        interactive_runs_per_min=len(inter) / window_min,
        interactive_p50_s=statistics.median(inter) if inter else float("nan"),
        batch_p50_s=statistics.median(batch) if batch else float("nan"),
        turn_p50_s=statistics.median(turn_times) if turn_times else float("nan"),
        cached_share=cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        retractions=sum(e.metrics().retractions for e in engines),
        completion_tokens_per_s=completion_tokens / max(1e-9, duration_s - warmup),
    )


def format_table(results: list[Result]) -> str:
    header = (
        "| scenario | queued time | running/replica | waiting/replica | batch runs/min "
        "| interactive runs/min | interactive p50 s | batch p50 s | turn p50 s "
        "| cached share | retractions | tokens/s |"
    )
    lines = [header, "|" + "---|" * 12]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.queued_fraction:.0%} | {r.mean_running:.1f} | "
            f"{r.mean_waiting:.1f} | {r.batch_runs_per_min:.1f} | "
            f"{r.interactive_runs_per_min:.1f} | {r.interactive_p50_s:.1f} | "
            f"{r.batch_p50_s:.1f} | {r.turn_p50_s:.1f} | {r.cached_share:.0%} | "
            f"{r.retractions} | {r.completion_tokens_per_s:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="calibrate",
        description=(
            "Drive two fake-engine model replicas with closed-loop agents in virtual time and "
            "print how the model behaves in the regimes of the original measurements."
        ),
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    parser.add_argument(
        "--duration-s",
        type=float,
        default=300.0,
        help="virtual seconds per scenario; the first quarter (at most 60 s) is warm-up "
        "(default: 300)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this scenario (repeatable; default: all)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.duration_s > 0:
        parser.error("--duration-s must be positive")
    params = EngineParams()
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    results = [simulate(s, params, args.seed, args.duration_s) for s in chosen]
    print(f"seed {args.seed}, {args.duration_s:g} virtual s per scenario, 2 replicas")
    print(format_table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "seed": args.seed,
                    "duration_s": args.duration_s,
                    "params": asdict(params),
                    "results": [asdict(r) for r in results],
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
