"""Which arms run at each point of each bench (own, light, mcp, routing, fanout,
coding), with their load generator flags; ``--arms`` keeps only some.
"""

from __future__ import annotations

from tools.bench.arms.plan import (
    CODING_INTERACTIVE,
    INTERACTIVE_AGENTS,
    PRIORITY,
    TOOL_CALLS,
    Arm,
    Stack,
)
from tools.bench.arms.smg import SMG_KEY_HEADER, SMG_PRIORITY
from tools.bench.arms.vllm import VLLM_PROGRAM_FLAGS


def own_flags(stack: Stack, bench: str, load: int, context: int) -> list[str]:
    """The load generator's flags every own-loop arm shares at one point: the classic
    flood's runs of ``context`` characters, its groups, warm-up, ramp and window."""
    plan = stack.plan
    window = plan.light_window_s if bench == "light" else plan.window_for(load)
    return [
        "--tools-url", stack.tools_url, "--context-chars", str(context),
        "--tool-calls", str(TOOL_CALLS), "--group", f"{load}:batch:crowd",
        "--group", f"{INTERACTIVE_AGENTS}:interactive:people",
        "--warmup-s", f"{plan.real(plan.warmup_for(load)):g}",
        "--ramp-s", f"{plan.real(plan.ramp_for(load)):g}",
        "--duration-s", f"{plan.real(window):g}",
    ]  # fmt: skip


def own_arms(
    stack: Stack, bench: str, load: int, context: int, common: list[str] | None = None
) -> list[Arm]:
    """The own-loop arms at one point; ``common``: the load generator's flags every arm
    shares (default: ``own_flags``)."""
    common = common or own_flags(stack, bench, load, context)
    router = stack.routers["cache_aware"].url
    engines = ",".join(stack.engines)
    ablation = [
        Arm(bench, name, load, ["--target", url, *common], dataplane=url)
        for name, url in stack.ablations.items()
    ]
    # SMG arms: its priority classes and the run ID as sticky key by header, and the same
    # engine priorities in the body as luftpause sends (SMG forwards a body's priority).
    smg_flags = [
        "--no-class-headers", "--priority", PRIORITY, "--smg-priority", SMG_PRIORITY,
        "--routing-key-header", SMG_KEY_HEADER,
    ]  # fmt: skip
    smg = [
        Arm(
            bench,
            name,
            load,
            ["--target", r.url, *smg_flags, *common],
            smg_metrics="" if name.startswith("smg-fifo") else r.metrics_url,
        )
        for name, r in stack.routers.items()
        if name == "smg" or (bench in ("own", "coding") and name.startswith("smg-"))
    ]
    # vLLM router arms: no class headers or priorities (as the SGLang router arm), the run
    # ID as the program's name (VLLM_PROGRAM_FLAGS), on their own engines.
    vllm = [
        Arm(
            bench,
            name,
            load,
            ["--target", r.url, "--no-class-headers", *VLLM_PROGRAM_FLAGS, *common],
            engines=stack.vllm_engines,
            # only a router with program scheduling serves it (404 without)
            diagnostics=f"{r.url}/scheduling/diagnostics"
            if stack.router_info[name].get("program_scheduling") is not None
            else "",
        )
        for name, r in stack.routers.items()
        if name in stack.router_info
    ]
    return [
        Arm(bench, "router", load, ["--target", router, "--no-class-headers", *common]),
        Arm(bench, "luftpause", load, ["--target", stack.dataplane, *common]),
        *ablation,
        Arm(
            bench,
            "engine-prio",
            load,
            ["--target", engines, "--no-class-headers", "--priority", PRIORITY, *common],
        ),
        *smg,
        *vllm,
    ]


def coding_arms(stack: Stack, load: int) -> list[Arm]:
    """The coding-agent flood at one point: the own-loop arms (SMG's caps with ``--smg-caps``),
    every run sampled from the ``coding-agent`` profile; its tool times run
    ``--time-scale`` faster, like the engines."""
    plan = stack.plan
    sc = f"{plan.time_scale:g}"
    common = [
        "--tools-url", stack.tools_url, "--profile", "coding-agent", "--time-scale", sc,
        "--group", f"{load}:batch:crowd",
        "--group", f"{CODING_INTERACTIVE}:interactive:people",
        "--warmup-s", f"{plan.real(plan.coding_warmup_s):g}",
        "--ramp-s", f"{plan.real(plan.coding_warmup_s / 2 if plan.ramp else 0.0):g}",
        "--duration-s", f"{plan.real(plan.coding_window_s):g}",
    ]  # fmt: skip
    return own_arms(stack, "coding", load, 0, common)


# The runtime in front of SMG: each turn as the own-loop SMG arm sends it (SMG_PRIORITY
# by class, the run ID as sticky key, the engine priorities of PRIORITY in the body).
RUNTIME_BEHIND_SMG = (
    f'run_id_headers = ["{SMG_KEY_HEADER}"]\n'
    "class_priority = {"
    + ", ".join(f"{c} = {p}" for c, p in (kv.split("=") for kv in PRIORITY.split(",")))
    + "}\n"
    "[runtime.class_headers]\n"
    + "".join(
        f'{c} = {{"x-smg-priority" = "{p}"}}\n'
        for c, p in (kv.split("=") for kv in SMG_PRIORITY.split(","))
    )
)


def mcp_arms(stack: Stack, load: int, context: int) -> list[Arm]:
    plan = stack.plan
    common = [
        "--context-chars", str(context), "--group", f"{load}:batch:crowd:subagents",
        "--group", f"{INTERACTIVE_AGENTS}:interactive:people:subagents",
        "--warmup-s", f"{plan.real(plan.warmup_for(load)):g}",
        "--ramp-s", f"{plan.real(plan.ramp_for(load)):g}",
        "--duration-s", f"{plan.real(plan.window_for(load)):g}",
    ]  # fmt: skip
    return [
        Arm("mcp", "router", load, ["--runtime", stack.runtimes["router"], *common], "subagents"),
        *(
            [
                Arm(
                    "mcp",
                    "smg",
                    load,
                    ["--runtime", stack.runtimes["smg"], *common],
                    "subagents",
                    smg_metrics=stack.routers["smg"].metrics_url,
                )
            ]
            if "smg" in stack.runtimes
            else []
        ),
        Arm(
            "mcp",
            "luftpause",
            load,
            ["--runtime", stack.runtimes["luftpause"], *common],
            "subagents",
        ),
    ]


def routing_arms(stack: Stack) -> list[Arm]:
    plan = stack.plan
    common = [
        "--context-chars", "8000", "--subagents", str(plan.routing_agents), "--class", "batch",
        "--warmup-s", f"{plan.real(plan.warmup_s / 2):g}",
        "--ramp-s", f"{plan.real(plan.warmup_s / 4):g}",
        "--duration-s", f"{plan.real(plan.routing_window_s):g}",
    ]  # fmt: skip
    return [
        Arm("routing", "luftpause", plan.routing_agents,
            ["--runtime", stack.runtimes["luftpause"], *common], "subagents"),
        Arm("routing", "router-cache", plan.routing_agents,
            ["--runtime", stack.runtimes["router"], *common], "subagents"),
        Arm("routing", "router-rr", plan.routing_agents,
            ["--runtime", stack.runtimes["router-rr"], *common], "subagents"),
    ]  # fmt: skip


def fanout_arms(stack: Stack) -> list[Arm]:
    n = str(stack.plan.fanout_n)
    out = []
    for name in ("luftpause", "router"):
        base = ["--runtime", stack.runtimes[name], "--spawn", n, "--context-chars", "11000"]
        out.append(Arm("fanout", name, int(n), base, "subagents", fan=True))
    # One after another, as the original measured it (through luftpause; on an idle pool the
    # path does not matter).
    base = ["--runtime", stack.runtimes["luftpause"], "--spawn", n, "--context-chars", "11000"]
    out.append(Arm("fanout", "sequential", int(n), [*base, "--sequential"], "subagents", fan=True))
    return out


def select_arms(
    schedule: list[tuple[str, int, list[Arm]]], wanted: tuple[str, ...]
) -> list[tuple[str, int, list[Arm]]]:
    """Only the ``wanted`` arms at every point (empty: all), points left without an arm
    dropped. Raises ValueError naming any wanted arm that is at no point."""
    if not wanted:
        return schedule
    names = {a.name for _, _, arms in schedule for a in arms}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(
            f"no arm named {', '.join(unknown)} in this run (arms: {', '.join(sorted(names))})"
        )
    kept = [(b, n, [a for a in arms if a.name in wanted]) for b, n, arms in schedule]
    return [(b, n, arms) for b, n, arms in kept if arms]
