"""``luftpause loadgen``: closed-loop agent load, sub-agent fan-out, a table and JSON.

Own-loop agents (one group) against the local stack (``luftpause up``)::

    luftpause loadgen --agents 8 --duration-s 60 --class batch --caller me

Several groups in one invocation (``--group N:class[:caller[:kind]]``, repeatable,
or ``--mix FILE``; see ``luftpause.measure.mix``)::

    luftpause loadgen --group 48:batch:crowd --group 4:interactive:people \\
        --duration-s 180 --json out.json

``--target URL[,URL...]``: the dataplane (default: the local stack's, port 8080),
the SGLang router or an engine (with or without ``/v1``); with several, agent *i*
is pinned to target *i* mod n.
``--no-class-headers`` sends no luftpause headers (router / engine arms);
``--priority interactive=10,batch=0`` adds ``priority`` to every body (engines
with ``--priority-scheduling``); ``--smg-priority interactive=interactive,batch=bulk``
sends the SGLang Model Gateway's ``x-smg-priority`` by class and
``--routing-key-header x-smg-routing-key`` the run ID as its sticky-session key;
``--program-context xargs|headers`` names each run as a program to vllm-router's
program scheduling (``agents.turn_body``, ``agents.run_headers``).

Runs shaped like real coding-agent traces (``--profile coding-agent``), and replay
of a trace of your own (``--trace FILE``, JSONL, one run per line); see
docs/guides/workloads.md for the profile's parameters and what a replay reproduces::

    luftpause loadgen --group 2:interactive --group 8:batch --profile coding-agent
    luftpause loadgen --trace my-runs.jsonl --time-scale 5

Sub-agents through the runtime (``--runtime URL`` of its ``/mcp``; default: the
local stack's, port 7000)::

    luftpause loadgen --spawn 16 [--sequential]
    luftpause loadgen --group 48:batch:crowd:subagents --duration-s 180

Progress is one line redrawn in place while the load runs, on a terminal only; a
pipe or a log file gets the table alone.

With ``LUFTPAUSE_TOKEN`` set on the stack (D9, X2), pass the same token: ``--token``
(default: the ``LUFTPAUSE_TOKEN`` environment variable) is sent as
``Authorization: Bearer`` to every ``--target`` and to ``--runtime``. A token the
dataplane or the runtime refuses stops the load before it starts, with one line
saying so.

Exit status: 0 the load ran without a failed run; 3 it ran and some runs failed
(counted by kind in the table and the JSON); 2 bad usage or nothing could start
(a refused token included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import math
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
import openai

from luftpause.cliargs import non_negative_float as _non_negative_float
from luftpause.cliargs import positive_float as _positive_float
from luftpause.cliargs import positive_int as _positive_int
from luftpause.loadgen import agents, shaped, spawn
from luftpause.loadgen.pool import TokenRefused
from luftpause.measure import content, stats
from luftpause.measure.cli import add_run_shape, add_trace_argument, build_groups
from luftpause.measure.mix import CLASSES, Group, MixError
from luftpause.measure.progress import LiveLine
from luftpause.measure.trace import TraceRun, load_trace, trace_groups
from luftpause.measure.workload import PROFILES, plan_key, run_rng

DEFAULT_MODEL = "llama-3.2-1b"
# The stack `luftpause up` (and `make run`) starts, on its default ports.
DEFAULT_TARGET = "http://127.0.0.1:8080/v1"
DEFAULT_RUNTIME = "http://127.0.0.1:7000/mcp"
DEFAULT_TOOLS_URL = "http://127.0.0.1:9000/mcp"
ERROR_BACKOFF_S = 0.5  # a failed run's agent waits this long before its next run
DEFAULT_DURATION_S = 60.0


# ------------------------------------------------------------------ arguments


def parse_priority(text: str) -> dict[str, int]:
    """``interactive=10,batch=0`` -> {"interactive": 10, "batch": 0}."""
    out: dict[str, int] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in CLASSES:
            raise argparse.ArgumentTypeError(
                f"--priority takes class=N pairs for interactive/batch, got {part!r}"
            )
        try:
            out[name] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--priority: {value!r} is not an integer") from None
    if not out:
        raise argparse.ArgumentTypeError("--priority needs at least one class=N pair")
    return out


SMG_CLASSES = ("system", "interactive", "default", "bulk")


def parse_smg_priority(text: str) -> dict[str, str]:
    """``interactive=interactive,batch=bulk`` -> {"interactive": "interactive", "batch": "bulk"}:
    the ``x-smg-priority`` class (SGLang Model Gateway) each luftpause class sends."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep or name not in CLASSES or value.lower() not in SMG_CLASSES:
            raise argparse.ArgumentTypeError(
                "--smg-priority takes class=SMG_CLASS pairs (classes interactive/batch, SMG "
                f"classes {'/'.join(SMG_CLASSES)}), got {part!r}"
            )
        out[name] = value.lower()
    if not out:
        raise argparse.ArgumentTypeError("--smg-priority needs at least one class=SMG_CLASS pair")
    return out


def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    load = parser.add_argument_group("load")
    load.add_argument(
        "--target",
        metavar="URL[,URL...]",
        default=DEFAULT_TARGET,
        help="OpenAI-compatible base URL(s) for own-loop agents: the dataplane, a router or "
        f"engines (several: agents pinned round robin; default: {DEFAULT_TARGET}, the "
        "dataplane of `luftpause up`)",
    )
    load.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token for luftpause (its LUFTPAUSE_TOKEN), sent as 'Authorization: "
        "Bearer TOKEN' to every --target and to --runtime (default: $LUFTPAUSE_TOKEN; "
        "--token '' sends none)",
    )
    load.add_argument("--agents", type=_positive_int, help="own-loop agents in one group")
    load.add_argument(
        "--subagents",
        type=_positive_int,
        help="closed-loop sub-agents over MCP through --runtime, in one group",
    )
    load.add_argument(
        "--class",
        dest="cls",
        choices=CLASSES,
        help="service class of the --agents/--subagents group (default: batch) or of the "
        "--spawn sub-agents (default: the runtime's, interactive)",
    )
    load.add_argument("--caller", help="caller of the --agents group (default: the group name)")
    load.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="N:CLASS[:CALLER[:KIND]]",
        help="a group of N agents (KIND agents or subagents; repeatable)",
    )
    load.add_argument("--mix", type=Path, metavar="FILE", help="TOML file of [[group]] tables")
    add_trace_argument(load)
    load.add_argument(
        "--duration-s",
        type=_positive_float,
        help="measured window (default: 60; a --trace without groups: until its last run ends)",
    )
    load.add_argument(
        "--warmup-s",
        type=_non_negative_float,
        default=0.0,
        help="run this long before the window opens; runs ending in it are not counted "
        "(default: 0)",
    )
    load.add_argument(
        "--ramp-s",
        type=_non_negative_float,
        default=0.0,
        help="start each group's agents spread evenly over this many seconds instead of all "
        "at once, so their runs do not finish in waves (default: 0; keep it inside --warmup-s)",
    )
    load.add_argument(
        "--max-runs",
        type=_positive_int,
        help="stop once this many runs have finished in the window (all groups together)",
    )
    shape = parser.add_argument_group("runs")
    add_run_shape(shape, "tool calls per run (sent as x-fake-tool-results; default: 3)")
    shape.add_argument(
        "--max-turns",
        type=_positive_int,
        default=10,
        help="a run that has not answered after this many turns fails (default: 10; a "
        "--profile or --trace run has the turns of its plan)",
    )
    shape.add_argument(
        "--model", help=f"model name (default: the target's first model, else {DEFAULT_MODEL})"
    )
    shape.add_argument(
        "--tools-url",
        default=DEFAULT_TOOLS_URL,
        help=f"MCP tool server answering the agents' tool calls (default: {DEFAULT_TOOLS_URL})",
    )
    shape.add_argument(
        "--tools",
        default="lookup",
        help="comma-separated tools to offer, or 'all' (default: lookup)",
    )
    shape.add_argument(
        "--no-class-headers",
        action="store_true",
        help="send no x-luftpause-* headers (baseline arms straight to a router or engine)",
    )
    shape.add_argument(
        "--priority",
        type=parse_priority,
        metavar="interactive=N,batch=M",
        help="add 'priority' to each request body by class (engines with priority scheduling)",
    )
    shape.add_argument(
        "--smg-priority",
        type=parse_smg_priority,
        metavar="interactive=C,batch=C",
        help="send x-smg-priority by class (the SGLang Model Gateway's priority scheduler; "
        "classes system/interactive/default/bulk), e.g. interactive=interactive,batch=bulk",
    )
    shape.add_argument(
        "--routing-key-header",
        metavar="NAME",
        default="",
        help="send the run ID in this header on every turn (a router's sticky-session key, "
        "e.g. x-smg-routing-key for SMG's --routing-key-headers)",
    )
    shape.add_argument(
        "--program-context",
        choices=agents.PROGRAM_CONTEXTS,
        default="none",
        help="name each run as a program to vllm-router's program scheduling: xargs sends "
        "vllm_xargs.agentic_context (program_id = run ID, priority interactive=1 batch=0, "
        "expected_resume false on the last turn, a sub-agent's parent); headers sends "
        "Claude Code's session headers (default: none)",
    )
    shape.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="--profile and --trace: divide tool times and start times by this, to match "
        "engines run with --time-scale (default: 1)",
    )
    shape.add_argument(
        "--turn-timeout-s",
        type=_positive_float,
        default=600.0,
        help="client timeout per turn (default: 600)",
    )
    shape.add_argument(
        "--seed",
        help="names the runs (run IDs and prompt text), and draws their replies unless "
        "--plan-seed does; default: random, so no two loads share cached prompts",
    )
    shape.add_argument(
        "--plan-seed",
        metavar="TEXT",
        help="what the runs are drawn from (default: --seed): a --profile group's runs, and "
        "the fake engine's replies to an own-loop agent's or a sub-agent's turns (its plan "
        "key, written into its task as [plan:KEY]); two loads with the same plan seed play "
        "the same runs, slot for slot, whatever their --seed names them (luftpause sim "
        "--plan-seed draws the same ones)",
    )
    mcp = parser.add_argument_group("sub-agents over MCP")
    mcp.add_argument(
        "--runtime",
        metavar="URL",
        default=DEFAULT_RUNTIME,
        help=f"the runtime's MCP URL (default: {DEFAULT_RUNTIME}, the runtime of `luftpause up`)",
    )
    mcp.add_argument(
        "--spawn",
        type=_positive_int,
        metavar="N",
        help="fan N sub-agents out, await them all, report (no closed loop)",
    )
    mcp.add_argument(
        "--sequential", action="store_true", help="with --spawn: spawn and await one at a time"
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write the full result as JSON")
    out.add_argument("--label", default="", help="free text stored in the JSON (e.g. the arm)")
    out.add_argument(
        "--runs-in-json",
        action="store_true",
        help="include every run (and its turns) in the JSON",
    )
    out.add_argument(
        "--quiet",
        action="store_true",
        help="no live progress line (it is drawn only when stderr is a terminal)",
    )


# ------------------------------------------------------------------ recording


@dataclass
class Recorder:
    t0: float = field(default_factory=time.monotonic)
    window: tuple[float, float] = (0.0, 0.0)
    max_runs: int | None = None
    runs: list[stats.RunRecord] = field(default_factory=list)
    errors: list[stats.ErrorRecord] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def add_run(self, run: stats.RunRecord) -> None:
        self.runs.append(run)
        if self.max_runs is not None and self.counted() >= self.max_runs:
            self.done.set()

    def add_error(self, group: Group, failure: agents.RunFailed) -> None:
        self.errors.append(
            stats.ErrorRecord(group.name, group.cls, failure.kind, self.clock(), str(failure))
        )

    def counted(self) -> int:
        start, end = self.window
        return sum(1 for r in self.runs if stats.in_window(r, start, end))

    def progress(self) -> str:
        now = self.clock()
        start, end = self.window
        phase = "warm-up" if now < start else "window"
        done = Counter(r.cls for r in self.runs if stats.in_window(r, start, end))
        kinds = Counter(e.kind for e in self.errors)
        per_class = ", ".join(f"{c} {done.get(c, 0)}" for c in CLASSES)
        errs = (
            f"errors {len(self.errors)} ({', '.join(f'{k} {v}' for k, v in kinds.items())})"
            if self.errors
            else "errors 0"
        )
        until = f"/{end:.0f}" if math.isfinite(end) else ""
        return (
            f"[{now:6.1f}{until} s {phase}] runs done: {per_class}; {errs}; "
            f"in flight {self.in_flight}"
        )


# ------------------------------------------------------------------ driving


async def _closed_loop(
    rec: Recorder,
    group: Group,
    index: int,
    once: Runner,
    nonce: str,
    ramp_s: float = 0.0,
) -> None:
    """One slot of a group: run after run until cancelled; slot ``index`` of ``count``
    starts ``group.start_s + index / count * ramp_s`` seconds in."""
    if ramp_s > 0 or group.start_s > 0:
        await asyncio.sleep(group.start_s + ramp_s * index / group.count)
    number = 0
    while True:
        key = f"{nonce}-{group.name}-{index}-{number}"
        rec.in_flight += 1
        try:
            run = await once(key, number)
        except agents.RunFailed as failure:
            rec.in_flight -= 1
            rec.add_error(group, failure)
            await asyncio.sleep(ERROR_BACKOFF_S)
        except asyncio.CancelledError:
            rec.in_flight -= 1
            raise
        except Exception as exc:  # never lose an error silently
            rec.in_flight -= 1
            rec.add_error(group, agents.classify_error(exc))
            await asyncio.sleep(ERROR_BACKOFF_S)
        else:
            rec.in_flight -= 1
            rec.add_run(run)
        number += 1


Runner = Callable[[str, int], Coroutine[Any, Any, stats.RunRecord]]


def _agent_runner(
    client: openai.AsyncOpenAI,
    pool: agents.ToolPool,
    tools: list[dict[str, Any]],
    group: Group,
    index: int,
    options: agents.AgentOptions,
    clock: Callable[[], float],
) -> Runner:
    """Runs of own-loop agent slot ``index``, each with its plan key from the plan seed."""

    def once(key: str, number: int) -> Coroutine[Any, Any, stats.RunRecord]:
        plan = plan_key(options.plan_seed, group.name, index, number)
        return agents.run_once(client, pool, tools, group, key, number, options, clock, plan)

    return once


def _subagent_runner(
    pool: spawn.SessionPool,
    group: Group,
    index: int,
    plan_seed: str,
    options: spawn.SpawnOptions,
    clock: Callable[[], float],
) -> Runner:
    """Sub-agents of slot ``index``, each with its plan key from the plan seed."""
    session = pool.pick()

    def once(key: str, number: int) -> Coroutine[Any, Any, stats.RunRecord]:
        plan = plan_key(plan_seed, group.name, index, number)
        return spawn.subagent_once(pool, session, group, key, options, clock, plan)

    return once


def _shaped_runner(
    client: openai.AsyncOpenAI,
    group: Group,
    index: int,
    options: agents.AgentOptions,
    clock: Callable[[], float],
    time_scale: float,
) -> Runner:
    """Runs of ``group.profile``, each sampled from the plan seed, the group, the slot and
    its number, from 0 (so a load with the same plan seed plays the same runs)."""
    assert group.profile is not None
    profile = PROFILES[group.profile]

    def once(key: str, number: int) -> Coroutine[Any, Any, stats.RunRecord]:
        plan = profile.sample(run_rng(options.plan_seed, group.name, index, number))
        return shaped.play(client, plan, group, key, options, clock, time_scale)

    return once


async def _replay_one(
    rec: Recorder,
    run: TraceRun,
    group: Group,
    client: openai.AsyncOpenAI,
    options: agents.AgentOptions,
    time_scale: float,
) -> None:
    """One run of a trace, started at its ``start_s``."""
    await asyncio.sleep(max(0.0, run.start_s / time_scale - rec.clock()))
    rec.in_flight += 1
    try:
        record = await shaped.play(
            client,
            run.plan,
            group,
            f"{options.nonce}-trace-{run.id}",
            options,
            rec.clock,
            time_scale,
        )
    except agents.RunFailed as failure:
        rec.add_error(group, failure)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # never lose an error silently
        rec.add_error(group, agents.classify_error(exc))
    else:
        rec.add_run(record)
    finally:
        rec.in_flight -= 1


async def _models_of(target: str, token: str | None) -> list[str]:
    """``GET {target}/models``: the model names, or ``[]`` when the target does not say.

    Raises :class:`TokenRefused` on a 401, so a load with the wrong token (or none) stops
    before it starts instead of failing every run.
    """
    try:
        async with httpx.AsyncClient(timeout=5.0, headers=agents.auth_headers(token)) as c:
            r = await c.get(f"{target}/models")
    except httpx.HTTPError:
        return []  # unreachable: the load runs and counts the failures
    if r.status_code == 401:
        raise TokenRefused("dataplane", target, token_sent=bool(token))
    try:
        data = r.json().get("data") or []
        return [str(m["id"]) for m in data] if r.status_code == 200 else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def _tool_names(text: str) -> list[str] | None:
    if text.strip() == "all":
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


async def run_load(
    args: argparse.Namespace,
    groups: list[Group],
    stderr: TextIO,
    token: str | None = None,
    trace: list[TraceRun] | None = None,
) -> dict[str, Any]:
    """The load ``args`` describe, and the runs of ``trace`` replayed beside it; ``token``
    goes to the targets and the runtime."""
    nonce = args.seed or secrets.token_hex(4)
    targets = [base_url(u) for u in (args.target or "").split(",") if u.strip()]
    own = [g for g in groups if g.kind == "agents"]
    subs = [g for g in groups if g.kind == "subagents"]
    trace = trace or []
    replayed = trace_groups(trace)
    clash = sorted({g.name for g in replayed} & {g.name for g in groups})
    if clash:
        raise MixError(f"trace caller(s) {', '.join(clash)} also name a group; rename one")
    if (own or trace) and not targets:
        raise MixError("own-loop agents and --trace need --target")
    if (subs or args.spawn) and not args.runtime:
        raise MixError("sub-agents need --runtime (the runtime's MCP URL)")
    if args.spawn and (groups or trace):
        raise MixError("--spawn is a one-shot fan-out; run it without closed-loop groups")
    listed = await asyncio.gather(*(_models_of(t, token) for t in targets)) if own or trace else []
    model = args.model or (listed[0][0] if listed and listed[0] else None)
    tool_names = _tool_names(args.tools)
    options = agents.AgentOptions(
        model=model or DEFAULT_MODEL,
        tool_names=tool_names,
        class_headers=not args.no_class_headers,
        priority=args.priority or {},
        smg_priority=args.smg_priority or {},
        routing_key_header=args.routing_key_header,
        program_context=args.program_context,
        turn_timeout_s=args.turn_timeout_s,
        max_turns=args.max_turns,
        nonce=nonce,
        plan_seed=args.plan_seed or nonce,
        token=token,
    )
    spawn_options = spawn.SpawnOptions(tool_names=tool_names, model=args.model)
    rec = Recorder(max_runs=args.max_runs)
    duration = args.duration_s
    if duration is None:  # a trace alone plays to its end
        duration = math.inf if trace and not groups else DEFAULT_DURATION_S
    rec.window = (args.warmup_s, args.warmup_s + duration)
    result: dict[str, Any] = {}
    total_own = sum(g.count for g in own)
    classic = [g for g in own if g.profile is None]
    # Plans start sub-agents (up to 4 at a time), each with its own connection.
    shaped_runs = sum(g.count for g in own if g.profile is not None) + len(trace)
    connections = total_own + 4 * shaped_runs + 16
    runtime_headers = agents.auth_headers(token)
    async with agents.clients(targets, options, connections) as openai_clients:
        pool: agents.ToolPool | None = None
        sessions: dict[str, spawn.SessionPool] = {}
        # One exit stack: MCP clients hold anyio cancel scopes that must close in LIFO order.
        stack = contextlib.AsyncExitStack()
        try:
            if classic:
                total_classic = sum(g.count for g in classic)
                pool = await stack.enter_async_context(
                    agents.ToolPool(args.tools_url, min(8, max(1, total_classic // 8)))
                )
            tools = content.openai_tools(pool.tools, tool_names) if pool is not None else []
            for g in subs:
                headers = agents.auth_headers(g.key) if g.key else runtime_headers
                sessions[g.name] = await stack.enter_async_context(
                    spawn.SessionPool(args.runtime, min(8, g.count), headers=headers)
                )
            if args.spawn:
                fan_group = Group(
                    name="fan-out",
                    count=args.spawn,
                    cls=args.cls or "interactive",
                    caller=args.caller or "fan-out",
                    kind="subagents",
                    context_chars=args.context_chars,
                    tool_calls=args.tool_calls,
                    max_tokens=args.max_tokens,
                )
                async with spawn.SessionPool(
                    args.runtime, 1, headers=runtime_headers
                ) as fan_sessions:
                    fan = await spawn.fan_out(
                        fan_sessions.clients[0],
                        fan_group,
                        args.spawn,
                        args.sequential,
                        spawn_options,
                        nonce,
                        rec.clock,
                    )
                rec.runs.extend(fan.records)
                for failure in fan.failures:
                    rec.add_error(fan_group, failure)
                rec.window = (0.0, max(rec.clock(), 1e-3))
                result["fan_out"] = fan.to_json()
                groups = [*groups, fan_group]
            tasks: list[asyncio.Task[None]] = []
            slot = 0
            for g in groups:
                if g.name == "fan-out" and args.spawn:
                    continue
                for i in range(g.count):
                    if g.kind == "agents" and g.profile is not None:
                        once = _shaped_runner(
                            openai_clients[slot % len(openai_clients)],
                            g,
                            i,
                            options,
                            rec.clock,
                            args.time_scale,
                        )
                        slot += 1
                    elif g.kind == "agents":
                        assert pool is not None
                        once = _agent_runner(
                            openai_clients[slot % len(openai_clients)],
                            pool,
                            tools,
                            g,
                            i,
                            options,
                            rec.clock,
                        )
                        slot += 1
                    else:
                        once = _subagent_runner(
                            sessions[g.name], g, i, options.plan_seed, spawn_options, rec.clock
                        )
                    tasks.append(
                        asyncio.create_task(_closed_loop(rec, g, i, once, nonce, args.ramp_s))
                    )
            by_name = {g.name: g for g in replayed}
            replays = [
                asyncio.create_task(
                    _replay_one(
                        rec,
                        run,
                        by_name[run.group],
                        openai_clients[(slot + j) % len(openai_clients)],
                        options,
                        args.time_scale,
                    )
                )
                for j, run in enumerate(trace)
            ]
            if replays and not tasks:  # nothing else to wait for: done when the trace is

                async def replayed_all() -> None:
                    await asyncio.gather(*replays, return_exceptions=True)
                    rec.done.set()

                tasks.append(asyncio.create_task(replayed_all()))
            tasks.extend(replays)
            groups = [*groups, *replayed]
            if tasks:
                rec.t0 = time.monotonic()
                live = LiveLine(_Silent() if args.quiet else stderr, rec.progress)
                with live:
                    deadline = rec.window[1] if math.isfinite(rec.window[1]) else None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(rec.done.wait(), timeout=deadline)
                    end = min(rec.clock(), rec.window[1])
                    rec.window = (rec.window[0], max(end, rec.window[0] + 1e-3))
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                # Sub-agents cut off by the deadline would keep loading the engines, and
                # own-loop runs cut off while paused would keep interactive slots reserved.
                for pool_ in sessions.values():
                    await pool_.cancel_live()
                await agents.end_runs(options)
        finally:
            # Tool calls cut off by the deadline make the MCP client log their late replies.
            logging.getLogger("mcp").setLevel(logging.CRITICAL)
            await stack.aclose()
    # A --spawn fan-out is one-shot (it admits no closed-loop groups): no agent counts; nor
    # is a replayed trace a closed loop.
    closed_loop = {} if args.spawn else {g.name: g.count for g in groups if g not in replayed}
    summary = stats.summarise(
        rec.runs,
        rec.errors,
        rec.window,
        [(g.name, g.cls) for g in groups],
        closed_loop,
        # Own-loop and replayed groups log their turns; sub-agents' turns are the runtime's.
        turns=options.ended,
        turn_groups=[g.name for g in groups if g.kind == "agents"],
    )
    result.update(
        {
            "version": 1,
            "label": args.label,
            "seed": nonce,
            "plan_seed": options.plan_seed,
            "targets": targets,
            "runtime": args.runtime,
            "model": options.model,
            "class_headers": options.class_headers,
            "priority": options.priority,
            "smg_priority": options.smg_priority,
            "routing_key_header": options.routing_key_header,
            "program_context": options.program_context,
            "groups_config": [
                {
                    "name": g.name,
                    "count": g.count,
                    "class": g.cls,
                    "caller": g.caller,
                    "kind": g.kind,
                    "context_chars": g.context_chars,
                    "tool_calls": str(g.tool_calls),
                    "max_tokens": g.max_tokens,
                    "profile": g.profile,
                }
                for g in groups
            ],
            "trace": {"file": str(args.trace), "runs": len(trace)} if trace else None,
            "time_scale": args.time_scale,
            "warmup_s": rec.window[0],
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            **summary,
        }
    )
    if args.runs_in_json:
        result["runs"] = [stats.run_json(r) for r in rec.runs]
    result["error_samples"] = [stats.error_json(e) for e in rec.errors[:50]]
    return result


def render(result: dict[str, Any]) -> str:
    lines = []
    if "fan_out" in result:
        f = result["fan_out"]
        lines.append(
            f"fan-out: {f['n']} sub-agents {f['mode']}: {f['wall_s']:.1f} s wall, "
            f"{f['completed']} completed, {f['failed']} failed, per sub-agent p50 "
            f"{f['subagent_s']['p50']} s, p95 {f['subagent_s']['p95']} s"
        )
    lines.append(
        f"window {result['window_s']:.1f} s, load average "
        f"{' '.join(str(x) for x in result['load_avg'])}"
    )
    lines.append(stats.table(result))
    turns = stats.turns_table(result)
    if turns:
        lines += ["", turns]
    if result["error_count"]:
        lines.append(
            "errors: "
            + ", ".join(f"{k} {v}" for k, v in result["errors"].items())
            + (
                f"; first: {result['error_samples'][0]['message']}"
                if result["error_samples"]
                else ""
            )
        )
    return "\n".join(lines)


class _Silent(io.StringIO):
    """Where ``--quiet`` sends progress: nowhere (it is no terminal)."""


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def main(args: argparse.Namespace) -> int:
    # The one place the environment is read: library code gets the token passed in.
    token = args.token if args.token is not None else os.environ.get("LUFTPAUSE_TOKEN")
    try:
        groups = build_groups(args)
        trace = load_trace(args.trace) if args.trace is not None else None
    except MixError as exc:  # a bad trace too (TraceError): its line and field
        print(f"luftpause loadgen: {exc}", file=sys.stderr)
        return 2
    if not groups and not args.spawn and not trace:
        print(
            "luftpause loadgen: nothing to run: give --agents, --subagents, --group, --mix, "
            "--trace or --spawn",
            file=sys.stderr,
        )
        return 2
    try:
        result = asyncio.run(run_load(args, groups, sys.stderr, token or None, trace=trace))
    except (MixError, TokenRefused) as exc:
        print(f"luftpause loadgen: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. the tool server or runtime cannot be reached
        leaves = _leaves(exc)
        refused = next((e for e in leaves if isinstance(e, TokenRefused)), None)
        if refused is not None:
            print(f"luftpause loadgen: {refused}", file=sys.stderr)
        else:
            reasons = "; ".join(dict.fromkeys(repr(e) for e in leaves))
            print(f"luftpause loadgen: could not start: {reasons}", file=sys.stderr)
        return 2
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 3 if result["error_count"] else 0
