"""Chaos run: how a luftpause stack survives SIGKILLed processes.

    .venv/bin/python tools/chaos.py --quick                 # < 3 min
    .venv/bin/python tools/chaos.py --report docs/benchmarks/reliability.md
    .venv/bin/python tools/chaos.py --scenarios runtime,engine --flood-s 20

It starts its own stack on loopback with the project's process helpers
(``luftpause.procs.launch``, every service on ``--port 0`` with a ready file, in
a temporary directory): two time-scaled fake engines, two fake MCP tool servers
(one answers the own-loop agents, one the runtime's sub-agents, so the second
one's call counters see only the runtime), the scheduler, a dataplane and the
runtime. Restarted services get back the port they had.

Each scenario floods the stack for ``--flood-s`` seconds with own-loop agents
(the load generator's agents: streamed turns through the dataplane, tool calls
answered over MCP) and closed-loop sub-agents (``spawn`` + ``await`` through the
runtime), and ``--kill-at-s`` seconds in SIGKILLs one process and starts it
again ``--down-s`` seconds later:

* ``control``: nothing is killed (the baseline of every column);
* ``scheduler``: the scheduler, restarted on the same ports;
* ``dataplane-same``: the dataplane, restarted with the same ``--dataplane-id``;
* ``runtime``: the runtime, once at least two sub-agents have a complete tool
  round and are still running, restarted on the same state directory;
* ``engine``: one fake engine, restarted after ``--engine-down-s`` seconds;
* ``dataplane-new``: the dataplane, restarted with a different ``--dataplane-id``
  (last by default: turns it leaks in the scheduler would otherwise be carried
  into the scenarios after it);
* ``abandon`` (not a kill, and not in the default list): clients that leave mid-tool.
  ``--abandon-runs`` one-turn runs (every seventh interactive), each sent alone with a
  tool offered, ``tool_choice: "required"`` and ``x-fake-tool-results: 1``, under a new
  run ID and never continued; then single small turns for ``--abandon-singles-s``
  seconds. The scheduler's ``/status`` is polled throughout: the highest cap each
  replica reached (caps follow the engine: they must stay at the ramp's
  ``initial_cap``, 16), the most slots reserved for the abandoned interactive runs,
  and how long after the last abandoned turn every reservation and pinned run was
  gone (tool leases; this stack sets ``tool_lease_default_s`` to ``--abandon-lease-s``).

Then the load stops: agents finish the run they are in (a turn has ``--hang-s``
seconds), sub-agents are awaited for as long, and what is left is cancelled.
Once no client request is open, no sub-agent is running and the engines run and
queue nothing, the tool waits one more second and polls the scheduler's
``GET /status`` (``in_flight_total``, ``held_total``, reservations) and the
dataplane's ``/metrics`` (``luftpause_dataplane_turns_in_flight``) for up to
``--leak-wait-s`` seconds: whatever they still count is a leaked slot.

Columns of the table (stdout; JSON with every detail in ``--out``):

* turns sent: own-loop turns the agents sent (attempts, through the dataplane);
* turns failed: turns that ended in a client-visible error, by kind (``http_502``,
  ``connect``, ``stream_broken``, ...; the load generator's error kinds);
* turns hung: turns that did not finish within ``--hang-s`` seconds;
* slots leaked: in-flight turns the scheduler (or the dataplane gauge) still
  counts once everything is idle, and for how long (``> N s``: still there when
  polling stopped);
* runs: own-loop runs and sub-agent runs finished / started;
* tool rounds re-executed: tool calls of *complete* tool rounds (a ``tools``
  record in ``runs.jsonl``) that the runtime's fake MCP server started more than
  once; a round the runtime was killed in the middle of may run its calls twice
  (that is the documented recovery rule) and is not counted;
* journal: ``runs.jsonl`` parses, every line a record, every ``tools`` record
  has its ``turn``; after a runtime kill also whether the tail was torn and cut.

Sub-agents send an ``idempotencyKey`` with each spawn and retry a failed spawn under
the same key, so a spawn journaled just before a runtime kill is answered with its run
on the retry (the "duplicate spawns" column stays 0).

Every process it started is stopped at the end (SIGTERM, then SIGKILL), also on
Ctrl-C or an error. ``--report FILE`` writes or updates a marked section of a
markdown file with the table, the command, the commit, load average and date.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from mcp import Client

from luftpause.loadgen import agents, spawn
from luftpause.measure import content
from luftpause.measure.mix import Group, ToolCalls
from luftpause.procs import ServiceFailed, ServiceProcess, launch

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MODEL = "llama-3.2-1b"
ENGINES = ("engine-a", "engine-b")
SCENARIOS = ("control", "scheduler", "dataplane-same", "runtime", "engine", "dataplane-new")
EXTRA_SCENARIOS = ("abandon",)  # run when named
KILLS = {
    "abandon": None,
    "control": None,
    "scheduler": "scheduler",
    "dataplane-same": "dataplane",
    "dataplane-new": "dataplane",
    "runtime": "runtime",
    "engine": "engine-b",
}
BEGIN = "<!-- chaos:begin (written by tools/chaos.py --report; edits inside are replaced) -->"
END = "<!-- chaos:end -->"
READY_TIMEOUT_S = 60.0
ERROR_BACKOFF_S = 0.5  # an agent whose run failed waits this long (as the load generator)
SETTLE_GRACE_S = 1.0  # after idle, before the first leak sample: reports in transit land
JOURNAL_TYPES = ("spawn", "turn", "tools", "approval", "budget", "end")


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Plan:
    time_scale: float
    flood_s: float
    kill_at_s: float
    down_s: float
    engine_down_s: float
    hang_s: float
    leak_wait_s: float
    batch_agents: int
    interactive_agents: int
    subagents: int
    context_chars: int
    max_tokens: int
    tool_calls: int
    abandon_runs: int = 80
    abandon_singles_s: float = 20.0
    abandon_lease_s: float = 20.0


DEFAULTS: dict[str, dict[str, float]] = {
    # Full: about 3.5 minutes on a shared 2-core machine; quick: about 2.
    "full": {"flood_s": 25.0, "kill_at_s": 7.0, "hang_s": 30.0, "leak_wait_s": 20.0},
    "quick": {"flood_s": 12.0, "kill_at_s": 4.0, "hang_s": 20.0, "leak_wait_s": 15.0},
}


def plan_from(args: argparse.Namespace) -> Plan:
    base = DEFAULTS["quick" if args.quick else "full"]

    def pick(name: str) -> float:
        value = getattr(args, name)
        return float(base[name] if value is None else value)

    return Plan(
        time_scale=args.time_scale,
        flood_s=pick("flood_s"),
        kill_at_s=pick("kill_at_s"),
        down_s=args.down_s,
        engine_down_s=args.engine_down_s,
        hang_s=pick("hang_s"),
        leak_wait_s=pick("leak_wait_s"),
        batch_agents=args.batch_agents,
        interactive_agents=args.interactive_agents,
        subagents=args.subagents,
        context_chars=args.context_chars,
        max_tokens=args.max_tokens,
        tool_calls=args.tool_calls,
        abandon_runs=args.abandon_runs,
        abandon_singles_s=args.abandon_singles_s,
        abandon_lease_s=args.abandon_lease_s,
    )


# ------------------------------------------------------------------ the stack


@dataclass
class Role:
    """One service: how to start it, the ports it got, its current process."""

    name: str
    args: list[str]  # luftpause sub-command and flags, without ports and ready file
    ports: dict[str, int] = field(default_factory=dict)
    proc: ServiceProcess | None = None
    starts: int = 0

    def port_args(self) -> list[str]:
        if self.name == "scheduler":
            grpc, http = self.ports.get("grpc", 0), self.ports.get("http", 0)
            return ["--port", str(grpc), "--http-port", str(http)]
        return ["--port", str(self.ports.get("http", 0))]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.ports['http']}"


class Stack:
    """The chaos stack. Every process it ever started is in ``launched``; ``stop`` ends
    the live ones by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path, plan: Plan, log_level: str) -> None:
        self.workdir = workdir
        self.plan = plan
        self.log_level = log_level
        self.roles: dict[str, Role] = {}
        self.launched: list[ServiceProcess] = []
        self.lock = threading.Lock()
        self.aborting = threading.Event()
        self.config = workdir / "stack.toml"
        self.state_dir = workdir / "state"
        self.dataplane_ids = 1

    @property
    def journal(self) -> Path:
        return self.state_dir / "runs.jsonl"

    def start(self, name: str) -> ServiceProcess:
        role = self.roles[name]
        role.starts += 1
        tag = f"{name}-{role.starts}"
        with self.lock:
            if self.aborting.is_set():
                raise ServiceFailed("stopping")
            svc = launch(
                [*role.args, *role.port_args(), "--log-level", self.log_level],
                name=name,
                ready_file=self.workdir / f"{tag}.ready",
                stderr=self.workdir / f"{tag}.log",
            )
            self.launched.append(svc)
        role.proc = svc
        svc.wait_ready(READY_TIMEOUT_S, self.aborting.is_set)
        role.ports = {k: int(v) for k, v in svc.ports.items()}
        return svc

    def add(self, name: str, args: list[str]) -> Role:
        self.roles[name] = Role(name, args)
        return self.roles[name]

    def boot(self) -> None:
        ts = f"{self.plan.time_scale:g}"
        for name in ENGINES:
            self.add(name, [
                "fake-engine", "--host", HOST, "--name", name, "--model", MODEL,
                "--time-scale", ts, "--chunk-tokens", "8",
                "--tool-results", str(self.plan.tool_calls),
            ])  # fmt: skip
            self.start(name)
        for name in ("tools-agents", "tools-runtime"):
            self.add(name, ["fake-mcp", "--host", HOST, "--time-scale", ts])
            self.start(name)
        probe_s = max(0.1, 2.0 / self.plan.time_scale)  # the probe period in model time
        endpoints = "".join(
            f'[[endpoints]]\nname = "{n}"\nurl = "{self.roles[n].url}"\nmodels = ["{MODEL}"]\n'
            'metrics = "sglang"\n'
            for n in ENGINES
        )
        tools_url = f"{self.roles['tools-runtime'].url}/mcp"
        self.config.write_text(
            f'[scheduler]\nhost = "{HOST}"\nprobe_period_s = {probe_s:g}\n'
            f"tool_lease_default_s = {self.plan.abandon_lease_s:g}\n"
            f'[dataplane]\nhost = "{HOST}"\n'
            f'[runtime]\nhost = "{HOST}"\nstate_dir = "{self.state_dir}"\n'
            f'default_model = "{MODEL}"\n'
            f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{tools_url}"\n' + endpoints
        )
        cfg = ["--config", str(self.config), "--host", HOST]
        self.add("scheduler", ["scheduler", *cfg])
        self.start("scheduler")
        grpc = self.roles["scheduler"].ports["grpc"]
        self.add("dataplane", ["dataplane", *cfg, "--scheduler", f"{HOST}:{grpc}"])
        self.start_dataplane()
        self.add("runtime", ["runtime", *cfg, "--dataplane-url", self.roles["dataplane"].url])
        self.start("runtime")

    @property
    def dataplane_id(self) -> str:
        return f"chaos-dp-{self.dataplane_ids}"

    def start_dataplane(self, new_id: bool = False) -> None:
        if new_id:
            self.dataplane_ids += 1
        role = self.roles["dataplane"]
        role.args = [a for a in role.args if not a.startswith("chaos-dp-")]
        if "--dataplane-id" in role.args:
            role.args.remove("--dataplane-id")
        role.args += ["--dataplane-id", self.dataplane_id]
        self.start("dataplane")

    def kill(self, name: str) -> int:
        """SIGKILL the service's process and reap it; its PID."""
        proc = self.roles[name].proc
        assert proc is not None
        proc.proc.kill()
        proc.proc.wait(timeout=10)
        return proc.pid

    def dead(self) -> list[str]:
        return [
            f"{n} (pid {r.proc.pid}) {r.proc.proc.returncode}"
            for n, r in self.roles.items()
            if r.proc is not None and r.proc.proc.poll() is not None
        ]

    def stop(self, grace_s: float = 5.0) -> list[str]:
        """Stop every process started here that still runs, newest first, by PID."""
        self.aborting.set()
        notes = []
        with self.lock:
            live = [s for s in reversed(self.launched) if s.proc.poll() is None]
        for s in live:
            with contextlib.suppress(ProcessLookupError):
                s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for s in live:
            try:
                s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                notes.append(f"{s.name} (pid {s.pid}) did not stop on SIGTERM; killed")
                s.proc.kill()
                s.proc.wait(timeout=10)
        return notes

    def log_problems(self) -> dict[str, int]:
        """Lines with ERROR or Traceback in each service log (every start)."""
        out: dict[str, int] = {}
        for path in sorted(self.workdir.glob("*.log")):
            text = path.read_text(errors="replace")
            n = sum(1 for line in text.splitlines() if " ERROR " in line or "Traceback" in line)
            if n:
                out[path.stem] = n
        return out


# ------------------------------------------------------------------ observation


def dataplane_gauges(text: str) -> dict[str, float]:
    """Summed (over classes) in-flight and held gauges from the dataplane's /metrics."""
    out = {"in_flight": 0.0, "held": 0.0}
    for line in text.splitlines():
        for prefix, key in (
            ("luftpause_dataplane_turns_in_flight{", "in_flight"),
            ("luftpause_dataplane_turns_held{", "held"),
        ):
            if line.startswith(prefix):
                out[key] += float(line.rsplit(" ", 1)[-1])
    return out


async def sample_slots(http: httpx.AsyncClient, stack: Stack) -> dict[str, Any]:
    """What the scheduler and the dataplane count right now (None where unreachable)."""
    out: dict[str, Any] = {}
    try:
        s = (await http.get(f"{stack.roles['scheduler'].url}/status")).json()
        out["scheduler_in_flight"] = int(s["in_flight_total"])
        out["scheduler_held"] = int(s["held_total"])
        out["reserved"] = sum(int(r.get("reserved_for_interactive") or 0) for r in s["replicas"])
        out["per_replica"] = {r["name"]: r["in_flight"] for r in s["replicas"]}
        out["runs"] = s.get("runs", {})
    except (httpx.HTTPError, ValueError, KeyError):
        out["scheduler_in_flight"] = None
    try:
        g = dataplane_gauges((await http.get(f"{stack.roles['dataplane'].url}/metrics")).text)
        out["dataplane_in_flight"] = int(g["in_flight"])
        out["dataplane_held"] = int(g["held"])
    except httpx.HTTPError:
        out["dataplane_in_flight"] = None
    return out


def leaked_now(sample: dict[str, Any]) -> int:
    """Slots still counted: the larger of the scheduler's and the dataplane's in-flight."""
    scheduler = int(sample.get("scheduler_in_flight") or 0)
    return max(scheduler, int(sample.get("dataplane_in_flight") or 0))


async def engines_busy(http: httpx.AsyncClient, stack: Stack) -> int:
    busy = 0
    for name in ENGINES:
        try:
            load = (await http.get(f"{stack.roles[name].url}/get_load")).json()
            busy += sum(int(x.get("num_reqs", 0)) for x in load)
        except (httpx.HTTPError, ValueError):
            continue
    return busy


async def runtime_running(http: httpx.AsyncClient, stack: Stack) -> int | None:
    try:
        s = (await http.get(f"{stack.roles['runtime'].url}/status")).json()
        return int(s["byState"].get("Running", 0)) + int(s["byState"].get("AwaitingApproval", 0))
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def read_journal(path: Path) -> dict[str, Any]:
    """Parse ``runs.jsonl`` ourselves (not with the runtime's reader): every line, torn
    tail, records by type, complete and open tool rounds, structural problems."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    lines = data.split(b"\n")
    torn_tail = bool(lines and lines[-1].strip())  # a last line without its newline
    records: list[dict[str, Any]] = []
    invalid: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or rec.get("t") not in JOURNAL_TYPES:
                raise ValueError
        except ValueError:
            invalid.append(number)
            continue
        records.append(rec)
    turns: dict[tuple[str, int], dict[str, Any]] = {}
    tools: set[tuple[str, int]] = set()
    spawned: set[str] = set()
    run_keys: dict[str, str] = {}  # run -> the load's key in its task ("Task <key>: ...")
    ended: dict[str, str] = {}
    keys: Counter[tuple[str, ...]] = Counter()
    for rec in records:
        kind, run = rec["t"], str(rec.get("run"))
        if kind in ("turn", "tools"):
            key = (run, int(rec.get("seq", -1)))
            keys[(kind, *map(str, key))] += 1
            if kind == "turn":
                turns.setdefault(key, rec)
            else:
                tools.add(key)
        elif kind == "spawn":
            spawned.add(run)
            task = str((rec.get("spec") or {}).get("task") or "")
            if task.startswith("Task "):
                run_keys[run] = task[5:].split(":", 1)[0]
            keys[("spawn", run)] += 1
        elif kind == "end":
            ended.setdefault(run, str(rec.get("state")))
            keys[("end", run)] += 1
    return {
        "bytes": len(data),
        "lines": sum(1 for raw in lines if raw.strip()),
        "records": len(records),
        "invalid_lines": invalid,
        "torn_tail": torn_tail,
        "turns": turns,
        "complete": tools & set(turns),
        "open": set(turns) - tools,
        "tools_without_turn": len(tools - set(turns)),
        "records_of_unknown_runs": sum(
            1 for rec in records if rec["t"] != "spawn" and str(rec.get("run")) not in spawned
        ),
        "repeated_keys": sum(n - 1 for n in keys.values() if n > 1),
        "spawned": spawned,
        "run_keys": run_keys,
        "ended": ended,
    }


def journal_summary(j: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (len(v) if isinstance(v, (set, dict)) else v)
        for k, v in j.items()
        if k not in ("turns", "run_keys")
    }


def args_key(arguments: Any) -> str:
    """The fake MCP server's counter key (``luftpause.fakes.mcp_tools.args_key``)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def started_by_args(counts: dict[str, Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for per_tool in counts.get("started", {}).values():
        for key, n in per_tool.items():
            out[key] += int(n)
    return out


# ------------------------------------------------------------------ results


@dataclass
class Result:
    scenario: str
    killed: str | None = None
    killed_pid: int | None = None
    kill_at_s: float | None = None
    down_s: float | None = None
    restart_ready_s: float | None = None  # from the restart command to its ready file
    restart_error: str | None = None
    turns_sent: int = 0
    turns_ok: int = 0
    turns_failed: Counter[str] = field(default_factory=Counter)
    turns_hung: int = 0
    turn_max_s: float = 0.0  # the longest turn that succeeded (held through an outage?)
    turns_cut: int = 0  # open when the drain bound ran out and the agent was cancelled
    own_started: int = 0
    own_finished: int = 0
    own_failed: int = 0
    tool_failures: int = 0  # own-loop tool calls to the fake MCP server that failed
    sub_started: int = 0
    sub_finished: int = 0
    sub_failed: Counter[str] = field(default_factory=Counter)
    sub_unfinished: int = 0  # not finished within the bound; cancelled
    sub_spawn_errors: int = 0
    sub_orphans: list[str] = field(default_factory=list)  # journaled spawns never handed out
    sub_turns: int = 0
    sub_handles: list[str] = field(default_factory=list)
    deletes_failed: int = 0  # DELETE /v1/runs of unfinished runs that failed even at the end
    error_samples: list[str] = field(default_factory=list)
    carried_in: dict[str, Any] = field(default_factory=dict)
    settle: dict[str, Any] = field(default_factory=dict)
    leaked: int = 0
    leak_s: float | None = None  # seconds until the count reached 0
    leak_persisted: bool = False
    reexecuted: int = 0
    reexec_detail: dict[str, Any] = field(default_factory=dict)
    journal: dict[str, Any] = field(default_factory=dict)
    journal_at_kill: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    load_avg: list[float] = field(default_factory=list)
    abandon: dict[str, Any] = field(default_factory=dict)  # the abandon scenario's findings

    def sample_error(self, text: str) -> None:
        if len(self.error_samples) < 8:
            self.error_samples.append(text[:300])

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["turns_failed"] = dict(self.turns_failed)
        out["sub_failed"] = dict(self.sub_failed)
        return out


# ------------------------------------------------------------------ load


class Flood:
    """One scenario's load: own-loop agents through the dataplane, sub-agents through
    the runtime. Sub-agent calls use a fresh MCP session each (a runtime restart ends
    every session, and handles outlive them)."""

    def __init__(self, stack: Stack, plan: Plan, result: Result, nonce: str) -> None:
        self.stack = stack
        self.plan = plan
        self.r = result
        self.nonce = nonce
        self.stop = asyncio.Event()
        self.drain_until = float("inf")
        self.options = agents.AgentOptions(
            model=MODEL,
            tool_names=["lookup"],
            turn_timeout_s=plan.hang_s,
            max_turns=plan.tool_calls + 3,
            nonce=nonce,
        )
        self.pool: agents.ToolPool | None = None
        self.tools: list[dict[str, Any]] = []
        self.client: Any = None
        self.http = httpx.AsyncClient(timeout=5.0)
        self.undeleted: set[str] = set()  # runs whose DELETE did not go through

    # -------------------------------------------------------------- own loop

    async def own_agent(self, cls: str, index: int) -> None:
        caller = f"chaos-{cls}"
        number = 0
        while not self.stop.is_set():
            key = f"{self.nonce}-{self.r.scenario}-{cls[0]}{index}-{number}"
            number += 1
            self.r.own_started += 1
            try:
                done = await self.own_run(key, cls, caller)
            except asyncio.CancelledError:
                self.r.turns_cut += 1
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.end_run(key))
                raise
            if done:
                self.r.own_finished += 1
            else:
                self.r.own_failed += 1
                await self.end_run(key)
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def own_run(self, key: str, cls: str, caller: str) -> bool:
        group = Group(
            name=cls,
            count=1,
            cls=cls,
            caller=caller,
            kind="agents",
            context_chars=self.plan.context_chars,
            tool_calls=ToolCalls(self.plan.tool_calls, self.plan.tool_calls),
            max_tokens=self.plan.max_tokens,
        )
        headers = {
            "x-fake-tool-results": str(self.plan.tool_calls),
            agents.RUN_HEADER: key,
            "x-luftpause-class": cls,
            "x-luftpause-caller": caller,
        }
        messages = content.messages(group.context_chars, key)
        assert self.pool is not None
        for _ in range(self.options.max_turns):
            self.r.turns_sent += 1
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.plan.hang_s):
                    reply = await agents.stream_turn(
                        self.client, messages, self.tools, headers, None, group.max_tokens,
                        self.options,
                    )  # fmt: skip
            except TimeoutError:
                self.r.turns_hung += 1
                self.r.sample_error(f"{key}: turn not finished after {self.plan.hang_s:g} s")
                return False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failure = agents.classify_error(exc)
                if failure.kind == "timeout":
                    self.r.turns_hung += 1
                else:
                    self.r.turns_failed[failure.kind] += 1
                self.r.sample_error(f"{key}: {failure.kind}: {failure}")
                return False
            self.r.turns_ok += 1
            self.r.turn_max_s = max(self.r.turn_max_s, round(time.monotonic() - t0, 2))
            if not reply.tool_calls:
                return True
            messages.append(agents.assistant_message(reply))
            for call in reply.tool_calls:
                try:
                    result, _ = await self.pool.call(
                        call["name"], json.loads(call["arguments"] or "{}")
                    )
                except Exception as exc:
                    self.r.tool_failures += 1
                    self.r.sample_error(f"{key}: tool {call['name']}: {exc!r}")
                    return False
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        self.r.sample_error(f"{key}: no answer after {self.options.max_turns} turns")
        return False

    async def end_run(self, key: str) -> None:
        """DELETE a run that did not finish (it may be paused on a tool, holding an
        interactive reservation); one the dataplane could not take is retried at the end."""
        try:
            resp = await self.http.delete(f"{self.stack.roles['dataplane'].url}/v1/runs/{key}")
            if resp.status_code < 300:
                self.undeleted.discard(key)
                return
        except httpx.HTTPError:
            pass
        self.undeleted.add(key)

    async def retry_deletes(self) -> None:
        for key in sorted(self.undeleted):
            await self.end_run(key)
        self.r.deletes_failed = len(self.undeleted)

    # -------------------------------------------------------------- sub-agents

    async def mcp(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        url = f"{self.stack.roles['runtime'].url}/mcp"
        async with asyncio.timeout(timeout_s):
            client = Client(url, mode="legacy", read_timeout_seconds=timeout_s)
            async with client as session:
                return spawn.tool_payload(await session.call_tool(tool, arguments))

    async def sub_agent(self, index: int) -> None:
        group = Group(
            name="sub",
            count=1,
            cls="interactive",
            caller="chaos-sub",
            kind="subagents",
            context_chars=self.plan.context_chars,
            tool_calls=ToolCalls(self.plan.tool_calls, self.plan.tool_calls),
            max_tokens=self.plan.max_tokens,
        )
        options = spawn.SpawnOptions(tool_names=["lookup"], model=MODEL)
        number = 0
        key: str | None = None
        while not self.stop.is_set():
            if key is None:
                key = f"{self.nonce}-{self.r.scenario}-sub{index}-{number}"
                number += 1
            # The key doubles as the spawn's idempotency key: a spawn whose answer was
            # lost (the runtime died after journaling it) is retried under the same key
            # and answered with the run it started.
            args = {**spawn.spawn_args(group, key, options), "idempotencyKey": key}
            try:
                out = await self.mcp("spawn", args, 10.0)
                handle = str(out["handle"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.r.sub_spawn_errors += 1
                self.r.sample_error(f"spawn: {exc!r}")
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            key = None
            self.r.sub_started += 1
            self.r.sub_handles.append(handle)
            await self.await_run(handle)

    async def await_run(self, handle: str) -> None:
        while True:
            left = self.drain_until - time.monotonic()
            if left <= 0:
                self.r.sub_unfinished += 1
                self.r.sample_error(f"sub-agent {handle} not finished in time; cancelled")
                with contextlib.suppress(Exception):
                    await self.mcp("cancel", {"handle": handle}, 10.0)
                return
            wait = max(0.5, min(5.0, left))
            try:
                out = await self.mcp(
                    "await", {"handles": [handle], "mode": "all", "timeout": wait}, wait + 10.0
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # the runtime is down or restarting: ask again
                await asyncio.sleep(0.5)
                continue
            if not out.get("finished"):
                continue
            run = (out.get("results") or [{}])[0]
            state = str(run.get("state"))
            self.r.sub_turns += int(run.get("turns") or 0)
            if state == "Completed":
                self.r.sub_finished += 1
            else:
                kind = f"{state}: {str(run.get('error') or '')[:60]}"
                self.r.sub_failed[kind] += 1
                self.r.sample_error(f"sub-agent {handle} {state}: {run.get('error')}")
            return

    # -------------------------------------------------------------- driving

    async def run(self, chaos: Callable[[], Any]) -> None:
        """Flood for ``flood_s``, run ``chaos`` beside it, then drain (bounded)."""
        plan = self.plan
        n_own = plan.batch_agents + plan.interactive_agents
        self.client = agents.make_client(
            f"{self.stack.roles['dataplane'].url}/v1", self.options, n_own + 4
        )
        async with agents.ToolPool(f"{self.stack.roles['tools-agents'].url}/mcp", 2) as pool:
            self.pool = pool
            self.tools = content.openai_tools(pool.tools, ["lookup"])
            own = [
                asyncio.create_task(self.own_agent("batch", i)) for i in range(plan.batch_agents)
            ]
            own += [
                asyncio.create_task(self.own_agent("interactive", i))
                for i in range(plan.interactive_agents)
            ]
            subs = [asyncio.create_task(self.sub_agent(i)) for i in range(plan.subagents)]
            chaos_task = asyncio.create_task(chaos())
            try:
                await asyncio.sleep(plan.flood_s)
                await chaos_task  # a restart still under way finishes first
                self.stop.set()
                self.drain_until = time.monotonic() + plan.hang_s
                say(f"  load stopped; draining (up to {plan.hang_s:g} s)")
                _, pending = await asyncio.wait(own + subs, timeout=plan.hang_s + 15.0)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*own, *subs, return_exceptions=True)
                await self.retry_deletes()
            finally:
                chaos_task.cancel()
                for t in own + subs:
                    t.cancel()
                await asyncio.gather(chaos_task, *own, *subs, return_exceptions=True)
                await self.client.close()
                await self.http.aclose()


# ------------------------------------------------------------------ scenarios


class Chaos:
    def __init__(self, stack: Stack, plan: Plan, nonce: str) -> None:
        self.stack = stack
        self.plan = plan
        self.nonce = nonce
        self.kill_counts: dict[str, Any] = {}
        self.begin_counts: dict[str, Any] = {}
        self.kill_journal: dict[str, Any] = {}

    async def scenario(self, name: str) -> Result:
        r = Result(scenario=name, killed=KILLS[name])
        t0 = time.monotonic()
        self.kill_counts, self.kill_journal = {}, {}
        async with httpx.AsyncClient(timeout=5.0) as http:
            r.carried_in = await sample_slots(http, self.stack)
            url = self.stack.roles["tools-runtime"].url
            self.begin_counts = (await http.get(f"{url}/counts")).json()
        if name == "abandon":
            await self.abandon(r)
            await self.settle(r)
            r.wall_s = round(time.monotonic() - t0, 1)
            r.load_avg = [round(x, 2) for x in os.getloadavg()]
            say(f"scenario {name}: {row_text(r)} ({r.wall_s:.0f} s); {abandon_text(r)}")
            return r
        flood = Flood(self.stack, self.plan, r, self.nonce)
        kill = f", SIGKILL {r.killed} at {self.plan.kill_at_s:g} s" if r.killed else ""
        say(f"scenario {name}: flood {self.plan.flood_s:g} s{kill}")

        async def chaos() -> None:
            if r.killed is None:
                return
            await asyncio.sleep(self.plan.kill_at_s)
            if name == "runtime":
                await self.wait_rounds_in_flight(r)
            await self.kill_and_restart(name, r, t0)

        await flood.run(chaos)
        await self.settle(r)
        self.check_journal_and_tools(r)
        r.wall_s = round(time.monotonic() - t0, 1)
        r.load_avg = [round(x, 2) for x in os.getloadavg()]
        say(f"scenario {name}: {row_text(r)} ({r.wall_s:.0f} s)")
        return r

    async def abandon(self, r: Result) -> None:
        """Clients that leave mid-tool (see the module docstring): one-turn runs that end
        in a tool call and never come back, then single small turns; the scheduler's
        status polled throughout."""
        plan = self.plan
        dataplane = self.stack.roles["dataplane"].url
        status_url = f"{self.stack.roles['scheduler'].url}/status"
        a: dict[str, Any] = {"runs": plan.abandon_runs, "lease_s": plan.abandon_lease_s}
        caps: dict[str, int | None] = {}
        peak = {"reserved": 0, "pinned": 0, "held": 0}
        last: dict[str, Any] = {}
        done = asyncio.Event()

        async def poll(http: httpx.AsyncClient) -> None:
            while not done.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    s = (await http.get(status_url)).json()
                    last.update(s)
                    for rep in s["replicas"]:
                        cap = rep.get("capacity")
                        old = caps.get(rep["name"])
                        if rep["name"] not in caps or (cap is not None and (old or 0) < cap):
                            caps[rep["name"]] = cap
                    peak["reserved"] = max(
                        peak["reserved"],
                        sum(int(x.get("reserved_for_interactive") or 0) for x in s["replicas"]),
                    )
                    peak["pinned"] = max(
                        peak["pinned"], sum(int(x.get("runs_pinned") or 0) for x in s["replicas"])
                    )
                    peak["held"] = max(peak["held"], int(s.get("held_total") or 0))
                await asyncio.sleep(0.25)

        tool = {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look something up.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }

        async def turn(http: httpx.AsyncClient, run: str, cls: str, tools: bool) -> None:
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Find {run}."}],
                "max_tokens": 16,
            }
            headers = {agents.RUN_HEADER: run, "x-luftpause-class": cls}
            if tools:
                body |= {"tools": [tool], "tool_choice": "required"}
                headers["x-fake-tool-results"] = "1"
            r.turns_sent += 1
            try:
                resp = await http.post(
                    f"{dataplane}/v1/chat/completions", json=body, headers=headers
                )
            except httpx.HTTPError as exc:
                r.turns_failed[type(exc).__name__] += 1
                r.sample_error(f"abandon {run}: {exc!r}")
                return
            if resp.status_code != 200:
                r.turns_failed[f"http_{resp.status_code}"] += 1
                r.sample_error(f"abandon {run}: {resp.status_code} {resp.text[:200]}")
                return
            r.turns_ok += 1
            if tools:
                reply = resp.json()["choices"][0]
                a["paused"] = a.get("paused", 0) + (reply.get("finish_reason") == "tool_calls")

        say(
            f"scenario abandon: {plan.abandon_runs} runs left mid-tool, then single turns "
            f"for {plan.abandon_singles_s:g} s"
        )
        async with httpx.AsyncClient(timeout=plan.hang_s) as http:
            poller = asyncio.create_task(poll(http))
            try:
                async with httpx.AsyncClient(timeout=5.0) as first:
                    s0 = (await first.get(status_url)).json()
                a["caps_before"] = {x["name"]: x.get("capacity") for x in s0["replicas"]}
                for i in range(plan.abandon_runs):
                    cls = "interactive" if i % 7 == 0 else "batch"
                    await turn(http, f"{self.nonce}-abandon-{i}", cls, tools=True)
                abandoned_at = time.monotonic()
                a["reserved_after_abandon"] = peak["reserved"]
                end = abandoned_at + plan.abandon_singles_s
                n = 0
                while time.monotonic() < end:
                    n += 1
                    await turn(http, f"{self.nonce}-single-{n}", "batch", tools=False)
                    await asyncio.sleep(0.2)
                a["singles"] = n
                # tool leases: every reservation and pinned abandoned run goes (bounded)
                bound = abandoned_at + plan.abandon_lease_s + 15.0
                gone_s = None
                while time.monotonic() < bound:
                    reps = last.get("replicas", [])
                    reserved = sum(int(x.get("reserved_for_interactive") or 0) for x in reps)
                    pinned = sum(int(x.get("runs_pinned") or 0) for x in reps)
                    if reps and reserved == 0 and pinned == 0:
                        gone_s = round(time.monotonic() - abandoned_at, 1)
                        break
                    await asyncio.sleep(0.25)
                a["released_after_s"] = gone_s
            finally:
                done.set()
                await poller
        a["caps_max"] = caps
        a["reserved_max"] = peak["reserved"]
        a["pinned_max"] = peak["pinned"]
        a["held_max"] = peak["held"]
        a["runs_lapsed"] = sum(int(x.get("runs_lapsed") or 0) for x in last.get("replicas", []))
        a["caps_after"] = {x["name"]: x.get("capacity") for x in last.get("replicas", [])}
        r.abandon = a

    async def wait_rounds_in_flight(self, r: Result, bound_s: float = 10.0) -> None:
        """Until at least two of this scenario's sub-agents have a complete tool round and
        no end (bounded): the kill then lands on runs with journaled rounds."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            j = read_journal(self.stack.journal)
            mine = self.scenario_runs(j, r)
            live = {run for run, _ in j["complete"] if run in mine and run not in j["ended"]}
            if len(live) >= 2:
                return
            await asyncio.sleep(0.1)
        say("  (no two sub-agents with a complete round in time; killing anyway)")

    async def kill_and_restart(self, name: str, r: Result, t0: float) -> None:
        target = KILLS[name]
        assert target is not None
        r.kill_at_s = round(time.monotonic() - t0, 2)
        r.killed_pid = self.stack.kill(target)
        say(f"  SIGKILL {target} (pid {r.killed_pid}) at {r.kill_at_s:.1f} s")
        if name == "runtime":
            # What was durable and what had run at the moment of death.
            self.kill_journal = read_journal(self.stack.journal)
            r.journal_at_kill = journal_summary(self.kill_journal)
            async with httpx.AsyncClient(timeout=5.0) as http:
                url = self.stack.roles["tools-runtime"].url
                self.kill_counts = (await http.get(f"{url}/counts")).json()
        down = self.plan.engine_down_s if name == "engine" else self.plan.down_s
        r.down_s = down
        await asyncio.sleep(down)
        t1 = time.monotonic()
        try:
            if name == "dataplane-new":
                await asyncio.to_thread(self.stack.start_dataplane, True)
            elif target == "dataplane":
                await asyncio.to_thread(self.stack.start_dataplane, False)
            else:
                await asyncio.to_thread(self.stack.start, target)
        except ServiceFailed as exc:
            r.restart_error = str(exc)[:500]
            say(f"  restart of {target} FAILED: {str(exc)[:200]}")
            return
        r.restart_ready_s = round(time.monotonic() - t1, 2)
        extra = f" as {self.stack.dataplane_id}" if target == "dataplane" else ""
        say(f"  {target} restarted{extra}, ready in {r.restart_ready_s:.1f} s")

    async def settle(self, r: Result) -> None:
        """No client request is open now. Wait (bounded) for the runtime to run nothing and
        the engines to go idle, then poll what the scheduler and the dataplane still count."""
        s: dict[str, Any] = {}
        async with httpx.AsyncClient(timeout=5.0) as http:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15.0:
                running = await runtime_running(http, self.stack)
                busy = await engines_busy(http, self.stack)
                if running == 0 and busy == 0:
                    break
                await asyncio.sleep(0.25)
            s["runtime_running"] = await runtime_running(http, self.stack)
            s["engines_busy"] = await engines_busy(http, self.stack)
            s["idle_wait_s"] = round(time.monotonic() - t0, 2)
            await asyncio.sleep(SETTLE_GRACE_S)
            first = await sample_slots(http, self.stack)
            s["first"] = first
            r.leaked = leaked_now(first)
            t1 = time.monotonic()
            last = first
            while leaked_now(last) > 0 and time.monotonic() - t1 < self.plan.leak_wait_s:
                await asyncio.sleep(0.5)
                last = await sample_slots(http, self.stack)
            s["last"] = last
            if r.leaked:
                if leaked_now(last) > 0:
                    r.leak_persisted = True
                    r.leak_s = None
                else:
                    r.leak_s = round(SETTLE_GRACE_S + time.monotonic() - t1, 1)
        s["dead_services"] = self.stack.dead()
        r.settle = s

    def scenario_runs(self, j: dict[str, Any], r: Result) -> set[str]:
        """This scenario's sub-agents in the journal: by the key in their task."""
        prefix = f"{self.nonce}-{r.scenario}-sub"
        return {run for run, key in j["run_keys"].items() if key.startswith(prefix)}

    def check_journal_and_tools(self, r: Result) -> None:
        """Journal integrity, and tool calls executed more often than the journal allows.

        The fake engine's tool arguments repeat across runs (a few dozen distinct queries),
        so executions cannot be matched to calls one by one. They are counted as multisets
        per argument key instead: the runtime's fake MCP server (which only the runtime
        uses) counts every call it started; the journal says which calls this scenario's
        sub-agents made. A call may start once per journaled call, plus once more if its
        round was open (journaled turn, no ``tools`` record) when the runtime was killed.
        After a runtime kill, the calls started *after* the kill are set against the calls
        of rounds that were not complete at the kill: any excess re-ran a complete round.
        """
        j = read_journal(self.stack.journal)
        r.journal = journal_summary(j)
        counts = httpx.get(f"{self.stack.roles['tools-runtime'].url}/counts", timeout=5).json()
        now = started_by_args(counts)
        begin = started_by_args(self.begin_counts)
        mine = self.scenario_runs(j, r)
        # Spawns the runtime journaled but whose handle the client never got (it was
        # killed before answering, and the client spawned again): they run all the same.
        r.sub_orphans = sorted(mine - set(r.sub_handles))
        open_at_kill: set[tuple[str, int]] = self.kill_journal.get("open", set())
        complete_at_kill: set[tuple[str, int]] = self.kill_journal.get("complete", set())
        allowed: Counter[str] = Counter()  # executions the whole scenario may make
        allowed_after: Counter[str] = Counter()  # executions after the kill
        calls = 0
        for key, rec in j["turns"].items():
            if key[0] not in mine:
                continue
            for call in (rec.get("message") or {}).get("tool_calls") or []:
                fn = call.get("function") or {}
                try:
                    k = args_key(json.loads(fn.get("arguments") or "{}"))
                except ValueError:
                    continue  # refused by the runtime's hygiene: never executed
                calls += 1
                allowed[k] += 2 if key in open_at_kill else 1
                if key not in complete_at_kill:
                    allowed_after[k] += 1
        started = {k: n - begin.get(k, 0) for k, n in now.items() if n > begin.get(k, 0)}
        excess = {k: n - allowed[k] for k, n in started.items() if n > allowed[k]}
        detail: dict[str, Any] = {
            "journaled_calls": calls,
            "executions": sum(started.values()),
            "excess_over_journal": sum(excess.values()),
            "excess_keys": dict(list(excess.items())[:10]),
        }
        if self.kill_counts:
            at_kill = started_by_args(self.kill_counts)
            after = {k: n - at_kill.get(k, 0) for k, n in now.items() if n > at_kill.get(k, 0)}
            excess_after = {
                k: n - allowed_after[k] for k, n in after.items() if n > allowed_after[k]
            }
            detail.update(
                {
                    "executions_after_kill": sum(after.values()),
                    "calls_allowed_after_kill": sum(allowed_after.values()),
                    "excess_after_kill": sum(excess_after.values()),
                    "complete_rounds_at_kill": len([k for k in complete_at_kill if k[0] in mine]),
                    "open_rounds_at_kill": len([k for k in open_at_kill if k[0] in mine]),
                }
            )
            r.reexecuted = max(sum(excess_after.values()), sum(excess.values()))
        else:
            r.reexecuted = sum(excess.values())
        r.reexec_detail = detail


# ------------------------------------------------------------------ report


def fmt_failed(r: Result) -> str:
    total = sum(r.turns_failed.values())
    if not total:
        return "0"
    parts = ", ".join(f"{k} {v}" for k, v in r.turns_failed.most_common())
    return f"{total} ({parts})"


def fmt_leak(r: Result, wait_s: float) -> str:
    if r.settle.get("first", {}).get("scheduler_in_flight") is None:
        return "? (scheduler unreachable)"
    if not r.leaked:
        text = "0"
    elif r.leak_persisted:
        text = f"{r.leaked} (> {wait_s:g} s)"
    else:
        text = f"{r.leaked} ({r.leak_s:g} s)"
    extra = []
    first = r.settle.get("first", {})
    if first.get("scheduler_held"):
        extra.append(f"{first['scheduler_held']} held")
    if first.get("reserved"):
        extra.append(f"{first['reserved']} reserved")
    carried = leaked_now(r.carried_in)
    if carried:
        extra.append(f"{carried} carried in")
    return text + (f"; {', '.join(extra)}" if extra else "")


def fmt_subs(r: Result) -> str:
    text = f"{r.sub_finished} / {r.sub_started}"
    notes = []
    failed = sum(r.sub_failed.values())
    if failed:
        notes.append(f"{failed} failed")
    if r.sub_unfinished:
        notes.append(f"{r.sub_unfinished} unfinished")
    if r.sub_spawn_errors:
        notes.append(f"{r.sub_spawn_errors} spawn errors")
    if r.sub_orphans:
        notes.append(f"{len(r.sub_orphans)} duplicate spawns")
    return text + (f" ({', '.join(notes)})" if notes else "")


def fmt_journal(r: Result) -> str:
    j = r.journal
    problems = []
    if j.get("invalid_lines"):
        problems.append(f"{len(j['invalid_lines'])} invalid lines")
    if j.get("torn_tail"):
        problems.append("torn last line")
    if j.get("tools_without_turn"):
        problems.append(f"{j['tools_without_turn']} rounds without turn")
    if j.get("records_of_unknown_runs"):
        problems.append(f"{j['records_of_unknown_runs']} records of unknown runs")
    text = f"ok, {j.get('lines', 0)} lines" if not problems else "BAD: " + ", ".join(problems)
    k = r.journal_at_kill
    if k:
        if k.get("torn_tail") or k.get("invalid_lines"):
            text += "; torn at kill, cut on restart" if not problems else "; torn at kill"
        else:
            text += "; clean at kill"
    if j.get("repeated_keys"):
        text += f"; {j['repeated_keys']} repeated keys"
    return text


COLUMNS = (
    "scenario",
    "turns sent",
    "turns failed",
    "turns hung",
    "slots leaked",
    "own-loop runs fin / started",
    "sub-agent runs fin / started",
    "tool rounds re-executed",
    "journal",
)


def cells(r: Result, plan: Plan) -> list[str]:
    label = r.scenario
    if r.restart_error:
        label += " (restart FAILED)"
    return [
        label,
        str(r.turns_sent),
        fmt_failed(r),
        str(r.turns_hung) + (f" (+{r.turns_cut} cut)" if r.turns_cut else ""),
        fmt_leak(r, plan.leak_wait_s),
        f"{r.own_finished} / {r.own_started}",
        fmt_subs(r),
        str(r.reexecuted),
        fmt_journal(r),
    ]


def row_text(r: Result) -> str:
    return (
        f"sent {r.turns_sent}, failed {sum(r.turns_failed.values())}, hung {r.turns_hung}, "
        f"leaked {r.leaked}{' (persists)' if r.leak_persisted else ''}, own "
        f"{r.own_finished}/{r.own_started}, sub {r.sub_finished}/{r.sub_started}, "
        f"re-executed {r.reexecuted}"
    )


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def md_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows[1:]]
    return "\n".join(out)


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def report_section(meta: dict[str, Any], rows: list[list[str]], results: list[Result]) -> str:
    plan = meta["plan"]
    lines = [
        BEGIN,
        "",
        f"Measured {meta['date']} on commit `{meta['commit']}` "
        f"({meta['machine']}; load average {meta['load_avg_start'][0]:.2f} at the start, "
        f"{meta['load_avg_end'][0]:.2f} at the end; {meta['wall_s']:.0f} s in all):",
        "",
        "```sh",
        meta["command"],
        "```",
        "",
        md_table(rows),
        "",
        f"Load per scenario: {plan['batch_agents']} batch + {plan['interactive_agents']} "
        f"interactive own-loop agents and {plan['subagents']} sub-agents for "
        f"{plan['flood_s']:g} s, {plan['tool_calls']} tool calls per run, "
        f"{plan['context_chars']}-character contexts, {plan['max_tokens']} tokens per reply; "
        f"engines and tools {plan['time_scale']:g}× faster than real time. The kill lands "
        f"{plan['kill_at_s']:g} s in (the runtime's once two running sub-agents have a "
        f"complete tool round), the restart {plan['down_s']:g} s later "
        f"({plan['engine_down_s']:g} s for the engine). A turn that takes over "
        f"{plan['hang_s']:g} s counts as hung; leaks are polled for {plan['leak_wait_s']:g} s.",
        "",
    ]
    notes = []
    for r in results:
        bits = []
        if r.restart_ready_s is not None:
            bits.append(f"restart ready in {r.restart_ready_s:.1f} s")
        bits.append(f"longest successful turn {r.turn_max_s:.1f} s")
        if r.restart_error:
            bits.append(f"restart failed: {r.restart_error[:200]}")
        first = r.settle.get("first", {})
        if r.leaked:
            bits.append(
                f"after the load: scheduler in flight {first.get('scheduler_in_flight')} "
                f"(per replica {first.get('per_replica')}), dataplane gauge "
                f"{first.get('dataplane_in_flight')}"
            )
        if r.sub_failed:
            bits.append(
                "sub-agents failed: " + "; ".join(f"{k} ×{v}" for k, v in r.sub_failed.items())
            )
        d = r.reexec_detail
        if "complete_rounds_at_kill" in d:
            bits.append(
                f"at the kill the journal held {d['complete_rounds_at_kill']} complete and "
                f"{d['open_rounds_at_kill']} open tool rounds of this scenario's sub-agents; "
                f"after it the tool server started {d['executions_after_kill']} calls where "
                f"the journal allows {d['calls_allowed_after_kill']}; over the scenario "
                f"{d['executions']} executions for {d['journaled_calls']} journaled calls "
                "(a call of a round open at the kill may run twice)"
            )
        if r.sub_orphans:
            bits.append(
                f"{len(r.sub_orphans)} spawns journaled but never answered (the client "
                "spawned again; the orphans ran to the end all the same)"
            )
        if r.abandon:
            bits.append(abandon_text(r))
        if bits:
            notes.append(f"- **{r.scenario}**: " + "; ".join(bits) + ".")
    if meta.get("log_problems"):
        notes.append(
            "- service logs with ERROR or Traceback lines: "
            + ", ".join(f"{k} {v}" for k, v in meta["log_problems"].items())
            + "."
        )
    lines += notes
    lines += ["", f"Raw results: `{meta['out']}`.", "", END]
    return "\n".join(lines)


def abandon_text(r: Result) -> str:
    a = r.abandon
    if not a:
        return ""
    released = a.get("released_after_s")
    return (
        f"{a['runs']} runs abandoned mid-tool ({a.get('paused', 0)} ended in a tool call), then "
        f"{a.get('singles', 0)} single turns: caps {a.get('caps_before')} before, at most "
        f"{a.get('caps_max')} throughout, {a.get('caps_after')} after; at most "
        f"{a.get('reserved_max')} slots reserved and {a.get('pinned_max')} runs pinned, "
        + (
            f"all released {released:g} s after the last abandoned turn (lease "
            f"{a['lease_s']:g} s; {a.get('runs_lapsed')} runs lapsed)"
            if released is not None
            else f"still held {a['lease_s'] + 15:g} s after the last abandoned turn"
        )
    )


def write_report(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section + tail
    else:
        if not text:
            text = "# Reliability\n\n"
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ------------------------------------------------------------------ main


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--quick",
        action="store_true",
        help="shorter floods, drains and leak polls: the whole run in under ~3 minutes "
        "(default run: ~3.5 minutes)",
    )
    g.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated scenarios, run in this order (default: {','.join(SCENARIOS)})",
    )
    t = p.add_argument_group("timing (seconds, real time)")
    t.add_argument("--flood-s", type=float, help="load per scenario (default: 25; quick: 12)")
    t.add_argument(
        "--kill-at-s",
        type=float,
        help="when the SIGKILL lands after the load starts (default: 7; quick: 4); the "
        "runtime's waits up to 10 s more for sub-agents with a complete tool round",
    )
    t.add_argument("--down-s", type=float, default=2.0, help="pause before a restart (default: 2)")
    t.add_argument(
        "--engine-down-s",
        type=float,
        default=4.0,
        help="pause before the killed engine is restarted (default: 4)",
    )
    t.add_argument(
        "--hang-s",
        type=float,
        help="a turn not finished after this long is hung; also the drain bound for runs "
        "and sub-agents after the load stops (default: 30; quick: 20)",
    )
    t.add_argument(
        "--leak-wait-s",
        type=float,
        help="how long leaked slots are polled once the stack is idle (default: 20; quick: 15)",
    )
    t.add_argument(
        "--time-scale",
        type=float,
        default=5.0,
        help="fake engines and fake tools run this many times faster than real time "
        "(the scheduler's probe period follows; default: 5)",
    )
    lo = p.add_argument_group("load")
    lo.add_argument(
        "--batch-agents", type=int, default=6, help="batch own-loop agents (default: 6)"
    )
    lo.add_argument(
        "--interactive-agents",
        type=int,
        default=2,
        help="interactive own-loop agents (default: 2)",
    )
    lo.add_argument(
        "--subagents",
        type=int,
        default=4,
        help="closed-loop sub-agents through the runtime (default: 4)",
    )
    lo.add_argument(
        "--context-chars", type=int, default=3000, help="context per run (default: 3000)"
    )
    lo.add_argument("--max-tokens", type=int, default=64, help="reply limit (default: 64)")
    lo.add_argument("--tool-calls", type=int, default=2, help="tool calls per run (default: 2)")
    ab = p.add_argument_group("the abandon scenario")
    ab.add_argument("--abandon-runs", type=int, default=80, help="runs left mid-tool (default: 80)")
    ab.add_argument(
        "--abandon-singles-s",
        type=float,
        default=20.0,
        help="seconds of single small turns after them (default: 20)",
    )
    ab.add_argument(
        "--abandon-lease-s",
        type=float,
        default=20.0,
        help="the stack's tool_lease_default_s, so that abandoned pauses lapse within the "
        "scenario (default: 20)",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs/benchmarks/reliability.json",
        help="raw results as JSON (default: docs/benchmarks/reliability.json, beside the "
        "page the report goes to)",
    )
    o.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="write or update the marked chaos section of this markdown file "
        "(e.g. docs/benchmarks/reliability.md)",
    )
    o.add_argument(
        "--workdir",
        type=Path,
        help="keep the config, service logs and journal here (default: a temporary "
        "directory, removed at the end)",
    )
    o.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of every service (logs go to the work directory; default: WARNING)",
    )
    o.add_argument("--seed", help="names the runs (default: random)")


async def run_all(
    stack: Stack, plan: Plan, names: list[str], nonce: str, results: list[Result]
) -> None:
    """Every scenario in turn; ``results`` keeps the finished ones if a later one fails."""
    chaos = Chaos(stack, plan, nonce)
    for name in names:
        results.append(await chaos.scenario(name))
        dead = stack.dead()
        if dead:
            raise RuntimeError(f"services died and were not restarted: {', '.join(dead)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/chaos.py",
        description="SIGKILL luftpause services under load and measure what clients see, "
        "leaked scheduler slots, sub-agent recovery and the runtime's journal.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Scenarios: "
        + ", ".join(SCENARIOS)
        + " (the default), and "
        + ", ".join(EXTRA_SCENARIOS)
        + ". See the module docstring "
        "(tools/chaos.py) for how every column is measured.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    known = SCENARIOS + EXTRA_SCENARIOS
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(known)}")
    plan = plan_from(args)
    for name in names:
        down = plan.engine_down_s if name == "engine" else plan.down_s
        if KILLS[name] is not None and plan.kill_at_s + down >= plan.flood_s:
            parser.error(
                f"{name}: --kill-at-s plus the pause before the restart must fit in --flood-s"
            )
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("mcp", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    nonce = args.seed or os.urandom(3).hex()
    command = shlex.join([".venv/bin/python", "tools/chaos.py", *sys.argv[1:]])
    load_start = [round(x, 2) for x in os.getloadavg()]
    t0 = time.monotonic()
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if args.workdir is not None:
        workdir = Path(args.workdir).resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="luftpause-chaos-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, plan, args.log_level)

    def on_signal(signum: int, frame: object) -> None:
        # Our own handler for Ctrl-C and SIGTERM (asyncio.run then leaves SIGINT alone):
        # abort start-ups in progress and unwind to the clean-up below.
        stack.aborting.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    results: list[Result] = []
    rc = 0
    try:
        say(f"starting the stack in {workdir}")
        stack.boot()
        say(
            "stack up: "
            + ", ".join(f"{n} {r.ports}" for n, r in stack.roles.items())
            + f"; dataplane id {stack.dataplane_id}"
        )
        asyncio.run(run_all(stack, plan, names, nonce, results))
    except KeyboardInterrupt:
        say("interrupted; stopping every process")
        rc = 130
    except (ServiceFailed, RuntimeError) as exc:
        say(f"aborted: {exc}")
        rc = 1
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for note in stack.stop():
            say(note)
        log_problems = stack.log_problems()
        if tmp is not None:
            tmp.cleanup()
    if not results:
        return rc or 1
    rows = [list(COLUMNS), *(cells(r, plan) for r in results)]
    print(text_table(rows))
    meta: dict[str, Any] = {
        "command": command,
        "commit": git_commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "load_avg_start": load_start,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - t0, 1),
        "plan": asdict(plan),
        "scenarios": names,
        "log_problems": log_problems,
        "out": str(
            args.out.resolve().relative_to(ROOT)
            if args.out.resolve().is_relative_to(ROOT)
            else args.out.resolve()
        ),
    }
    print(
        f"\n{meta['wall_s']:.0f} s; load average {meta['load_avg_start'][0]:.2f} -> "
        f"{meta['load_avg_end'][0]:.2f}; commit {meta['commit']}"
        + (f"; service log errors: {log_problems}" if log_problems else "")
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({**meta, "results": [r.to_json() for r in results]}, indent=1) + "\n"
    )
    say(f"raw results in {args.out}")
    if args.report is not None and rc == 0:
        write_report(args.report, report_section(meta, rows, results))
        say(f"report section written to {args.report}")
    elif args.report is not None:
        say(f"incomplete run: {args.report} left as it was")
    return rc


if __name__ == "__main__":
    sys.exit(main())
