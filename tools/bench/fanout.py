"""Fan-out benchmark for the runtime (R2, R3, R5): spawn x N + await all vs one after another.

Starts a fake engine, fake MCP tools with a *fixed* lookup delay (default 2 s,
not time-scaled: the tool is the slow part, as in the reference measurement)
and the runtime, all on loopback with ``--port 0``. Then:

1. sequential: for each of N sub-agents, spawn it and await it before the next;
2. fan-out: spawn all N, then one ``await`` for all of them;
3. memory: spawn ``--concurrent`` sub-agents (default 1,000) whose tool never
   returns during the measurement, wait until every one is inside its tool call,
   and read the runtime's RSS (``/proc/<pid>/status``).

Each sub-agent makes at most ``--max-tool-calls`` (default 3) calls. Prints a
table (and writes JSON with ``--json``). Goals: fan-out >= 5x faster than
sequential; 1,000 concurrent runs under 500 MB RSS. Not a test: it asserts
nothing, it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from mcp import Client

from luftpause.measure.progress import ArmClock
from luftpause.procs import ServiceProcess, launch, stop_all

FANOUT_GOAL = 5.0
RSS_GOAL_MB = 500.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fanout.py",
        description="Runtime fan-out benchmark: N sub-agents together vs one after another, "
        "and the runtime's RSS with many concurrent sub-agents.",
    )
    p.add_argument("--runs", type=int, default=16, help="sub-agents per arm (default: 16)")
    p.add_argument(
        "--tool-delay-s", type=float, default=2.0, help="fixed lookup delay (default: 2)"
    )
    p.add_argument(
        "--max-tool-calls", type=int, default=3, help="tool calls per sub-agent (default: 3)"
    )
    p.add_argument(
        "--engine-time-scale",
        type=float,
        default=10.0,
        help="fake engine speed-up (default: 10; the tool delay is not scaled)",
    )
    p.add_argument(
        "--concurrent",
        type=int,
        default=1000,
        help="sub-agents alive at once for the RSS measurement (default: 1000; 0 skips it)",
    )
    p.add_argument("--skip-sequential", action="store_true", help="only run the fan-out arm")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return p.parse_args(argv)


def start(name: str, args: list[str], tmp: Path, started: list[ServiceProcess]) -> ServiceProcess:
    svc = launch(
        args,
        name=name,
        ready_file=tmp / f"{name}.ready.json",
        stderr=tmp / f"{name}.stderr",
    )
    started.append(svc)
    svc.wait_ready(60.0)
    return svc


def runtime_config(path: Path, dataplane: str, tools: str, state: Path) -> Path:
    path.write_text(
        f'[runtime]\ndataplane_url = "{dataplane}"\nstate_dir = "{state}"\n'
        f'[[runtime.tool_servers]]\nname = "tools"\nurl = "{tools}/mcp"\n'
    )
    return path


def start_runtime(
    suffix: str, engine: str, tool_delay_s: float, tmp: Path, started: list[ServiceProcess]
) -> tuple[ServiceProcess, ServiceProcess]:
    """Fake tools with a fixed lookup delay, and a runtime using them and ``engine``."""
    tools = start(
        f"fake-mcp{suffix}",
        [
            "fake-mcp",
            "--port",
            "0",
            "--lookup-delay-s",
            str(tool_delay_s),
            "--log-level",
            "WARNING",
        ],
        tmp,
        started,
    )
    cfg = runtime_config(
        tmp / f"rt{suffix}.toml", engine, tools.urls["http"], tmp / f"state{suffix}"
    )
    rt = start(
        f"runtime{suffix}",
        ["runtime", "--config", str(cfg), "--port", "0", "--log-level", "WARNING"],
        tmp,
        started,
    )
    return tools, rt


def payload(result: Any) -> dict[str, Any]:
    if result.is_error:
        raise SystemExit(f"tool error: {result.content[0].text}")
    return dict(json.loads(result.content[0].text))


async def spawn(c: Client, task: str, max_tool_calls: int) -> str:
    args = {"task": task, "tools": ["lookup"], "maxToolCalls": max_tool_calls}
    return str(payload(await c.call_tool("spawn", args))["handle"])


async def await_all(c: Client, handles: list[str]) -> list[dict[str, Any]]:
    while True:
        out = payload(await c.call_tool("await", {"handles": handles, "timeout": 600}))
        if out["finished"]:
            return list(out["results"])


async def sequential(url: str, n: int, calls: int) -> tuple[float, list[dict[str, Any]]]:
    results = []
    async with Client(url, mode="legacy", read_timeout_seconds=900) as c:
        started = time.monotonic()
        for i in range(n):
            handle = await spawn(c, f"sequential sub-agent {i}: research topic {i}", calls)
            results.extend(await await_all(c, [handle]))
        return time.monotonic() - started, results


async def fanout(url: str, n: int, calls: int) -> tuple[float, list[dict[str, Any]]]:
    async with Client(url, mode="legacy", read_timeout_seconds=900) as c:
        started = time.monotonic()
        handles = [
            await spawn(c, f"fan-out sub-agent {i}: research topic {i}", calls) for i in range(n)
        ]
        results = await await_all(c, handles)
        return time.monotonic() - started, results


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def memory(url: str, tools_url: str, pid: int, n: int) -> dict[str, Any]:
    before = rss_mb(pid)
    async with Client(url, mode="legacy", read_timeout_seconds=900) as c:
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> str:
            async with gate:
                return await spawn(c, f"memory sub-agent {i}", 1)

        handles = await asyncio.gather(*(one(i) for i in range(n)))
        deadline = time.monotonic() + 300
        async with httpx.AsyncClient(timeout=10) as http:
            while True:
                counts = (await http.get(f"{tools_url}/counts")).json()
                if counts["total_started"] >= n:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {counts['total_started']}/{n} runs reached their tool")
                await asyncio.sleep(0.2)
        peak = rss_mb(pid)
        for h in handles:
            await c.call_tool("cancel", {"handle": h})
    return {"concurrent": n, "rss_before_mb": round(before, 1), "rss_mb": round(peak, 1)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started: list[ServiceProcess] = []
    out: dict[str, Any] = {
        "runs": args.runs,
        "tool_delay_s": args.tool_delay_s,
        "max_tool_calls": args.max_tool_calls,
    }
    with tempfile.TemporaryDirectory(prefix="luftpause-fanout-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            engine = start(
                "fake-engine",
                [
                    "fake-engine",
                    "--port",
                    "0",
                    "--time-scale",
                    str(args.engine_time_scale),
                    "--tool-results",
                    str(args.max_tool_calls),
                    "--log-level",
                    "WARNING",
                ],
                tmp,
                started,
            )
            _tools, rt = start_runtime("", engine.urls["http"], args.tool_delay_s, tmp, started)
            url = rt.urls["http"] + "/mcp"
            clock = ArmClock(1 + (not args.skip_sequential) + (args.concurrent > 0))
            if not args.skip_sequential:
                print(f"[{clock.start()}] sequential x{args.runs}", file=sys.stderr, flush=True)
                wall, results = await sequential(url, args.runs, args.max_tool_calls)
                clock.finished()
                out["sequential_s"] = round(wall, 2)
                out["sequential_completed"] = sum(r["state"] == "Completed" for r in results)
            print(f"[{clock.start()}] fan-out x{args.runs}", file=sys.stderr, flush=True)
            wall, results = await fanout(url, args.runs, args.max_tool_calls)
            clock.finished()
            out["fanout_s"] = round(wall, 2)
            out["fanout_completed"] = sum(r["state"] == "Completed" for r in results)
            out["tool_calls_per_run"] = sorted({r["toolCalls"] for r in results})
            if "sequential_s" in out:
                out["speedup"] = round(out["sequential_s"] / out["fanout_s"], 2)
            if args.concurrent > 0:
                print(f"[{clock.start()}] memory: {args.concurrent} alive", file=sys.stderr)
                slow, rt2 = start_runtime("-memory", engine.urls["http"], 3600.0, tmp, started)
                out["memory"] = await memory(
                    rt2.urls["http"] + "/mcp", slow.urls["http"], rt2.pid, args.concurrent
                )
        finally:
            stop_all(started)
    return out


def table(out: dict[str, Any]) -> str:
    rows = [("arm", "runs", "wall s", "vs sequential", "goal")]
    if "sequential_s" in out:
        rows.append(
            (
                "sequential (spawn, await, next)",
                str(out["runs"]),
                f"{out['sequential_s']:.1f}",
                "1.0x",
                "",
            )
        )
    speed = f"{out['speedup']:.1f}x" if "speedup" in out else "-"
    rows.append(
        (
            "fan-out (spawn x N, await all)",
            str(out["runs"]),
            f"{out['fanout_s']:.1f}",
            speed,
            f">= {FANOUT_GOAL:.0f}x",
        )
    )
    if "memory" in out:
        m = out["memory"]
        rows.append(
            (
                f"RSS, {m['concurrent']} concurrent runs",
                str(m["concurrent"]),
                f"{m['rss_mb']:.0f} MB",
                f"idle {m['rss_before_mb']:.0f} MB",
                f"< {RSS_GOAL_MB:.0f} MB",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = asyncio.run(main_async(args))
    print(table(out))
    print(
        f"tool delay {out['tool_delay_s']:g} s fixed, <= {out['max_tool_calls']} calls per "
        f"sub-agent; tool calls per run: {out.get('tool_calls_per_run')}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
