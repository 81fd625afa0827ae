"""Sub-agents over MCP: the runtime's ``spawn`` and ``await`` tools (R2, R3).

Two uses:

* **closed loop** (``kind = "subagents"`` groups): each slot spawns one
  sub-agent, awaits it, records it and spawns the next;
* **fan-out** (``--spawn N``): N sub-agents spawned at once and awaited together,
  or (``--sequential``) spawned and awaited one after another.

A sub-agent's turns happen inside the runtime, so only what ``await`` returns is
known here: state, turns, tool calls, the runtime's own turn and tool seconds,
prompt tokens (and cached tokens if the runtime reports them).

The caller the dataplane sees is the MCP session (R4): each slot group shares a
few sessions.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp import Client

from luftpause.loadgen.agents import RunFailed
from luftpause.loadgen.pool import ClientPool
from luftpause.measure import content
from luftpause.measure.mix import Group
from luftpause.measure.stats import RunRecord, percentile

AWAIT_TIMEOUT_S = 60.0


@dataclass
class SpawnOptions:
    tool_names: list[str] | None = None
    model: str | None = None
    max_await_s: float = 1800.0  # give up on one sub-agent after this long


def tool_payload(result: Any) -> dict[str, Any]:
    """The JSON object an MCP tool answered with; RunFailed for an error or no object."""
    if result.is_error:
        text = " ".join(str(getattr(b, "text", "")) for b in result.content)
        raise RunFailed("mcp_tool_error", text[:300] or "the runtime returned an error")
    if isinstance(result.structured_content, dict):
        return dict(result.structured_content)
    for block in result.content:
        raw = getattr(block, "text", None)
        if raw:
            data = json.loads(raw)
            if isinstance(data, dict):
                return data
    raise RunFailed("mcp_bad_reply", "the runtime's reply holds no JSON object")


def spawn_args(
    group: Group, run_key: str, options: SpawnOptions, plan: str | None = None
) -> dict[str, Any]:
    """The ``spawn`` tool's arguments for one sub-agent; ``plan``: its plan key, written
    into its task (the fake engine draws the sub-agent's replies from it)."""
    args: dict[str, Any] = {
        "task": content.task(group.context_chars, run_key, plan),
        "system": content.preamble(group.context_chars),
        "serviceClass": group.cls,
        "maxTokens": group.max_tokens,
    }
    if options.tool_names is not None:
        args["tools"] = options.tool_names
    if options.model:
        args["model"] = options.model
    return args


async def spawn(
    client: Client, group: Group, run_key: str, options: SpawnOptions, plan: str | None = None
) -> str:
    return str(
        tool_payload(await client.call_tool("spawn", spawn_args(group, run_key, options, plan)))[
            "handle"
        ]
    )


async def await_runs(
    client: Client, handles: list[str], options: SpawnOptions
) -> list[dict[str, Any]]:
    """``await`` (mode all) until every handle has finished; the runs' final JSON."""
    deadline = time.monotonic() + options.max_await_s
    while True:
        out = tool_payload(
            await client.call_tool(
                "await", {"handles": handles, "mode": "all", "timeout": AWAIT_TIMEOUT_S}
            )
        )
        if out.get("finished"):
            return list(out.get("results") or [])
        if time.monotonic() > deadline:
            raise RunFailed(
                "await_timeout", f"sub-agents not finished after {options.max_await_s:g} s"
            )


def record_of(run: dict[str, Any], group: Group, start: float, end: float) -> RunRecord:
    """A finished sub-agent as a run record; raises RunFailed unless it completed."""
    state = str(run.get("state", "?"))
    if state != "Completed":
        raise RunFailed(f"run_{state.lower()}", str(run.get("error") or state)[:300])
    usage = run.get("usage") or {}
    cached = usage.get("cachedTokens")
    return RunRecord(
        group=group.name,
        cls=group.cls,
        kind="subagent",
        start_s=start,
        end_s=end,
        turns=int(run.get("turns") or 0),
        tool_calls=int(run.get("toolCalls") or 0),
        tool_s=float(usage.get("toolSeconds") or 0.0),
        prompt_tokens=int(usage["promptTokens"]) if cached is not None else None,
        cached_tokens=int(cached) if cached is not None else None,
        turn_s=float(usage["turnSeconds"]) if "turnSeconds" in usage else None,
    )


async def subagent_once(
    pool: SessionPool,
    client: Client,
    group: Group,
    run_key: str,
    options: SpawnOptions,
    clock: Callable[[], float],
    plan: str | None = None,
) -> RunRecord:
    start = clock()
    handle = await spawn(client, group, run_key, options, plan)
    pool.live[handle] = client
    (run,) = await await_runs(client, [handle], options)
    pool.live.pop(handle, None)
    return record_of(run, group, start, clock())


class SessionPool(ClientPool):
    """MCP sessions to the runtime; each is one caller to the dataplane."""

    service = "runtime"

    def __init__(
        self,
        url: str,
        size: int,
        timeout_s: float = AWAIT_TIMEOUT_S + 60,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(url, size, timeout_s, headers)
        self.live: dict[str, Client] = {}  # handle -> session, for runs not yet awaited to end

    async def cancel_live(self) -> int:
        """Cancel the sub-agents still running (the load's deadline cut them off)."""
        cancelled = 0
        for handle, client in list(self.live.items()):
            with contextlib.suppress(Exception):
                await client.call_tool("cancel", {"handle": handle})
                cancelled += 1
            self.live.pop(handle, None)
        return cancelled


@dataclass
class FanOut:
    n: int
    sequential: bool
    wall_s: float
    records: list[RunRecord]
    failures: list[RunFailed]

    def to_json(self) -> dict[str, Any]:
        durations = [r.duration_s for r in self.records]
        p50 = percentile(durations, 50)
        p95 = percentile(durations, 95)
        return {
            "n": self.n,
            "mode": "sequential" if self.sequential else "together",
            "wall_s": round(self.wall_s, 3),
            "completed": len(self.records),
            "failed": len(self.failures),
            "subagent_s": {
                "p50": None if p50 is None else round(p50, 3),
                "p95": None if p95 is None else round(p95, 3),
            },
            "turns": sum(r.turns for r in self.records),
            "tool_calls": sum(r.tool_calls for r in self.records),
        }


async def fan_out(
    client: Client,
    group: Group,
    n: int,
    sequential: bool,
    options: SpawnOptions,
    nonce: str,
    clock: Callable[[], float],
) -> FanOut:
    """Spawn ``n`` sub-agents and await them all (or one at a time with ``sequential``).

    A sub-agent's own time is the runtime's ``elapsedSeconds`` (spawn to end).
    """
    t0 = clock()
    records: list[RunRecord] = []
    failures: list[RunFailed] = []

    def take(run: dict[str, Any]) -> None:
        elapsed = float(run.get("elapsedSeconds") or 0.0)
        end = clock()
        try:
            records.append(record_of(run, group, end - elapsed, end))
        except RunFailed as exc:
            failures.append(exc)

    if sequential:
        for i in range(n):
            handle = await spawn(client, group, f"{nonce}-fan-{i}", options)
            for run in await await_runs(client, [handle], options):
                take(run)
    else:
        handles = [await spawn(client, group, f"{nonce}-fan-{i}", options) for i in range(n)]
        for run in await await_runs(client, handles, options):
            take(run)
    return FanOut(n, sequential, clock() - t0, records, failures)
