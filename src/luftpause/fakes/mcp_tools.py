"""Fake MCP tool server (spec H2): slow filler tools with call counters.

Every test and benchmark of the runtime points its upstream tool servers here.
Three tools:

* ``lookup(query, limit=3)`` - waits ~1 s (uniform 0.5-1.5 s), returns ``limit``
  filler facts; ``readOnlyHint: true``.
* ``deep_search(query, depth=2)`` - waits ~3 s (uniform 2-4 s), returns
  ``2 * depth`` filler findings; ``readOnlyHint: true``.
* ``delete_record(record_id)`` - returns at once with a filler confirmation;
  ``destructiveHint: true``, ``readOnlyHint: false`` (approval tests, R11).

Delays come from one seeded RNG per tool (``--seed``), or are fixed with
``--lookup-delay-s`` / ``--deep-search-delay-s``; ``--time-scale`` divides all
of them. Results depend only on the seed, the tool and its arguments, so two
runs with the same seed answer alike whatever the call order.

Numeric arguments are *strict* integers: ``{"limit": "3"}`` is refused with an
``isError`` result instead of being coerced, so a test can tell whether the
runtime's tool-call hygiene (R6) coerced the model's arguments before calling.

Counters (exactly-once tests): each call is counted as *started* when the tool
body begins and as *completed* when it returns (a call cancelled mid-wait stays
started only). The key is the canonical JSON of the arguments as the client
sent them (:func:`args_key`: sorted keys, no spaces, defaults *not* filled in);
calls refused by argument validation are not counted. ``GET /counts`` returns
``{"started": {tool: {args_json: n}}, "completed": {...}, "total_started": n,
"total_completed": n}``; ``POST /counts/reset`` zeroes them. With
``--counts-file`` every completed call also appends one JSON line
``{"event": "completed", "tool", "arguments", "args_json", "pid", "time"}``
(never truncated by a reset), which is how stdio runs are checked.

Transports: Streamable HTTP at ``/mcp`` (stateful sessions for the 2025-11-25
era, and the stateless 2026-07-28 era, which the SDK routes by the
``MCP-Protocol-Version`` header) or stdio (``--stdio``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from luftpause.cliargs import non_negative_float as _non_negative_float
from luftpause.cliargs import positive_float as _positive_float
from luftpause.serving import Bootstrap, Service, add_service_arguments, run_async
from luftpause.telemetry import Instrumentation, RecentTraces

SERVICE = "fake-mcp"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9000
MCP_PATH = "/mcp"
STDIO_STOP_GRACE_S = 1.0  # after a signal, how long stdio mode waits for a clean end

# Random delay ranges (seconds) before --time-scale, when no fixed delay is set.
LOOKUP_DELAY_RANGE = (0.5, 1.5)
DEEP_SEARCH_DELAY_RANGE = (2.0, 4.0)

LOOKUP_MAX_LIMIT = 20
DEEP_SEARCH_MAX_DEPTH = 5

TOOL_NAMES = ("lookup", "deep_search", "delete_record")

log = logging.getLogger("luftpause.fakes.mcp_tools")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class FakeMcpSettings:
    """Everything that shapes the tools' behaviour; parsed once from the flags."""

    seed: int = 0
    lookup_delay_s: float | None = None  # None: seeded uniform LOOKUP_DELAY_RANGE
    deep_search_delay_s: float | None = None  # None: seeded uniform DEEP_SEARCH_DELAY_RANGE
    time_scale: float = 1.0  # every delay is divided by this
    counts_file: Path | None = None  # append one JSON line per completed call

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        for name in ("lookup_delay_s", "deep_search_delay_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


# --------------------------------------------------------------------------- counters


def args_key(arguments: Mapping[str, Any]) -> str:
    """Canonical JSON of a tool call's arguments: the counters' key."""
    return json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CallCounts:
    """Started/completed calls per tool and argument set; optionally logged to a file.

    Only the event loop touches it (tools are coroutines), so it needs no lock.
    """

    def __init__(self, counts_file: Path | None = None) -> None:
        self._counts_file = counts_file
        self.traces = RecentTraces()  # trace IDs of recent calls (X1), oldest first
        self._started: dict[str, dict[str, int]] = {}
        self._completed: dict[str, dict[str, int]] = {}
        if counts_file is not None:
            counts_file.parent.mkdir(parents=True, exist_ok=True)

    def started(self, tool: str, arguments: Mapping[str, Any]) -> str:
        key = args_key(arguments)
        per_tool = self._started.setdefault(tool, {})
        per_tool[key] = per_tool.get(key, 0) + 1
        return key

    def completed(self, tool: str, arguments: Mapping[str, Any]) -> None:
        key = args_key(arguments)
        per_tool = self._completed.setdefault(tool, {})
        per_tool[key] = per_tool.get(key, 0) + 1
        if self._counts_file is not None:
            line = {
                "event": "completed",
                "tool": tool,
                "arguments": dict(arguments),
                "args_json": key,
                "pid": os.getpid(),
                "time": time.time(),
            }
            # One write per line, append mode: lines from concurrent calls never interleave.
            with self._counts_file.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")

    def snapshot(self) -> dict[str, Any]:
        return {
            "started": {tool: dict(per) for tool, per in self._started.items()},
            "completed": {tool: dict(per) for tool, per in self._completed.items()},
            "total_started": sum(sum(per.values()) for per in self._started.values()),
            "total_completed": sum(sum(per.values()) for per in self._completed.values()),
        }

    def reset(self) -> None:
        self._started.clear()
        self._completed.clear()


# --------------------------------------------------------------------------- filler

_SOURCES = ("the city archive", "a field survey", "the annual report", "an old almanac",
            "the registry", "a peer review", "the trade journal", "a census table")  # fmt: skip
_CLAIMS = ("lists {n} entries for", "first mentions", "disputes an early account of",
           "cross-references", "dates the oldest record of", "counts {n} variants of",
           "links {n} sources to", "summarises")  # fmt: skip


def _digest(*parts: object) -> int:
    text = "\x1f".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def filler_fact(seed: int, tool: str, query: str, index: int) -> str:
    """One deterministic filler sentence about ``query``; depends on nothing else."""
    d = _digest(seed, tool, query, index)
    source = _SOURCES[d % len(_SOURCES)]
    claim = _CLAIMS[(d >> 8) % len(_CLAIMS)].format(n=(d >> 16) % 97 + 3)
    return f"{source.capitalize()} {claim} {query!r} (ref {tool[:1].upper()}{d % 100000:05d})."


class LookupResult(BaseModel):
    query: str
    facts: list[str]


class Finding(BaseModel):
    level: int
    summary: str


class DeepSearchResult(BaseModel):
    query: str
    depth: int
    findings: list[Finding]


class DeleteResult(BaseModel):
    record_id: str
    deleted: bool
    message: str


# --------------------------------------------------------------------------- tools


class FakeTools:
    """The tools' behaviour, independent of the MCP plumbing."""

    def __init__(self, settings: FakeMcpSettings, counts: CallCounts | None = None) -> None:
        self.settings = settings
        self.counts = counts if counts is not None else CallCounts(settings.counts_file)
        # One RNG per tool, so one tool's delays do not depend on calls to another.
        self._rng = {name: random.Random(_digest(settings.seed, name)) for name in TOOL_NAMES}

    def delay_s(self, tool: str) -> float:
        """The next delay for ``tool``, already divided by the time scale."""
        s = self.settings
        if tool == "lookup":
            fixed, span = s.lookup_delay_s, LOOKUP_DELAY_RANGE
        elif tool == "deep_search":
            fixed, span = s.deep_search_delay_s, DEEP_SEARCH_DELAY_RANGE
        else:
            return 0.0
        delay = fixed if fixed is not None else self._rng[tool].uniform(*span)
        return delay / s.time_scale

    async def lookup(self, arguments: Mapping[str, Any], query: str, limit: int) -> LookupResult:
        self.counts.started("lookup", arguments)
        await anyio.sleep(self.delay_s("lookup"))
        seed = self.settings.seed
        result = LookupResult(
            query=query, facts=[filler_fact(seed, "lookup", query, i) for i in range(limit)]
        )
        self.counts.completed("lookup", arguments)
        return result

    async def deep_search(
        self, arguments: Mapping[str, Any], query: str, depth: int
    ) -> DeepSearchResult:
        self.counts.started("deep_search", arguments)
        await anyio.sleep(self.delay_s("deep_search"))
        seed = self.settings.seed
        findings = [
            Finding(level=level, summary=filler_fact(seed, "deep_search", query, 2 * level + k))
            for level in range(1, depth + 1)
            for k in range(2)
        ]
        result = DeepSearchResult(query=query, depth=depth, findings=findings)
        self.counts.completed("deep_search", arguments)
        return result

    async def delete_record(self, arguments: Mapping[str, Any], record_id: str) -> DeleteResult:
        self.counts.started("delete_record", arguments)
        await anyio.sleep(self.delay_s("delete_record"))
        ref = _digest(self.settings.seed, "delete_record", record_id) % 100000
        result = DeleteResult(
            record_id=record_id,
            deleted=True,
            message=f"Record {record_id!r} deleted (ref D{ref:05d}).",
        )
        self.counts.completed("delete_record", arguments)
        return result


def _raw_arguments(ctx: Context[Any, Any], validated: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the client sent them (defaults not filled in)."""
    params = ctx.request_context.params
    raw = params.get("arguments") if params is not None else None
    return dict(raw) if isinstance(raw, Mapping) else validated


def _traceparent(ctx: Context[Any, Any]) -> str | None:
    """The trace a call belongs to: ``_meta.traceparent`` (the MCP convention), else the
    HTTP ``traceparent`` header."""
    meta: Mapping[str, Any] | None = ctx.request_context.meta
    found = meta.get("traceparent") if meta is not None else None
    if isinstance(found, str):
        return found
    return ctx.headers.get("traceparent") if ctx.headers is not None else None


# Strict: a string where an integer belongs is refused, not coerced (see module docstring).
Limit = Annotated[
    int,
    Field(strict=True, ge=1, le=LOOKUP_MAX_LIMIT, description="how many facts to return"),
]
Depth = Annotated[
    int,
    Field(strict=True, ge=1, le=DEEP_SEARCH_MAX_DEPTH, description="search depth (levels)"),
]
Query = Annotated[str, Field(min_length=1, description="what to look up")]
RecordId = Annotated[str, Field(min_length=1, description="id of the record to delete")]


def build_mcp_server(tools: FakeTools) -> MCPServer[Any]:
    """An MCPServer exposing ``tools``; the same server backs HTTP and stdio."""
    mcp: MCPServer[Any] = MCPServer(
        SERVICE,
        version="0.1.0",
        instructions="Fake tools for luftpause tests: slow filler lookups, one destructive tool.",
        log_level="WARNING",
    )

    @mcp.tool(
        description=f"Look up short facts about a query (slow: about 1 s). Returns `limit` "
        f"facts (1-{LOOKUP_MAX_LIMIT}).",
        annotations=ToolAnnotations(
            title="Lookup",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def lookup(query: Query, ctx: Context[Any, Any], limit: Limit = 3) -> LookupResult:
        raw = _raw_arguments(ctx, {"query": query, "limit": limit})
        tools.counts.traces.saw(_traceparent(ctx))
        return await tools.lookup(raw, query, limit)

    @mcp.tool(
        description=f"Search deeply for a query (slower: about 3 s). Returns two findings per "
        f"level of `depth` (1-{DEEP_SEARCH_MAX_DEPTH}).",
        annotations=ToolAnnotations(
            title="Deep search",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def deep_search(
        query: Query, ctx: Context[Any, Any], depth: Depth = 2
    ) -> DeepSearchResult:
        raw = _raw_arguments(ctx, {"query": query, "depth": depth})
        tools.counts.traces.saw(_traceparent(ctx))
        return await tools.deep_search(raw, query, depth)

    @mcp.tool(
        description="Delete a record permanently. Destructive: needs the user's approval.",
        annotations=ToolAnnotations(
            title="Delete record",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    async def delete_record(record_id: RecordId, ctx: Context[Any, Any]) -> DeleteResult:
        raw = _raw_arguments(ctx, {"record_id": record_id})
        tools.counts.traces.saw(_traceparent(ctx))
        return await tools.delete_record(raw, record_id)

    return mcp


# --------------------------------------------------------------------------- HTTP

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_ANY_HOSTS = ("0.0.0.0", "::", "")


def transport_security_for(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection that admits every legitimate client of ``host``.

    Loopback clients (127.0.0.1, localhost, [::1], with or without a port) are
    always allowed. Listening on all interfaces (containers) admits any Host,
    since the name clients use is unknown here; a specific address admits itself.
    """
    if host in _ANY_HOSTS:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = list(_LOOPBACK_HOSTS)
    own = f"[{host}]" if ":" in host else host
    if own not in names:
        names.append(own)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for name in names for h in (name, f"{name}:*")],
        allowed_origins=[o for name in names for o in (f"http://{name}", f"http://{name}:*")],
    )


def build_app(tools: FakeTools, *, host: str = DEFAULT_HOST) -> Starlette:
    """The HTTP app: MCP at ``/mcp`` plus ``/health``, ``/counts`` and ``/traces`` (the
    trace IDs of recent calls, X1).

    Build a new one per server run: the MCP session manager runs only once.
    """
    mcp = build_mcp_server(tools)
    mcp_app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=False,
        transport_security=transport_security_for(host),
    )

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": SERVICE})

    async def counts(_: Request) -> JSONResponse:
        return JSONResponse(tools.counts.snapshot())

    async def reset_counts(_: Request) -> JSONResponse:
        tools.counts.reset()
        return JSONResponse(tools.counts.snapshot())

    async def traces(_: Request) -> JSONResponse:
        return JSONResponse({"trace_ids": tools.counts.traces.ids()})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # A mounted app's own lifespan never runs: enter the session manager here.
        async with mcp.session_manager.run():
            yield

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/counts", counts, methods=["GET"]),
            Route("/counts/reset", reset_counts, methods=["POST"]),
            Route("/traces", traces, methods=["GET"]),
            Mount("/", app=mcp_app),
        ],
        lifespan=lifespan,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(
        parser,
        port_help=f"HTTP port for /mcp, /counts and /health (default: {DEFAULT_PORT})",
        config=False,
    )
    parser.set_defaults(host=DEFAULT_HOST, port=DEFAULT_PORT)
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="serve MCP on stdin/stdout instead of HTTP (no /counts: use --counts-file)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for the random delays and the filler results (default: 0)",
    )
    parser.add_argument(
        "--lookup-delay-s",
        type=_non_negative_float,
        metavar="S",
        help="fixed lookup delay in seconds (default: random, uniform 0.5-1.5 s)",
    )
    parser.add_argument(
        "--deep-search-delay-s",
        type=_non_negative_float,
        metavar="S",
        help="fixed deep_search delay in seconds (default: random, uniform 2-4 s)",
    )
    parser.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        metavar="X",
        help="divide every delay by X (default: 1; 10 makes the tools ten times faster)",
    )
    parser.add_argument(
        "--counts-file",
        metavar="PATH",
        help="append one JSON line per completed tool call to PATH",
    )


def settings_from_args(args: argparse.Namespace) -> FakeMcpSettings:
    return FakeMcpSettings(
        seed=args.seed,
        lookup_delay_s=args.lookup_delay_s,
        deep_search_delay_s=args.deep_search_delay_s,
        time_scale=args.time_scale,
        counts_file=Path(args.counts_file) if args.counts_file else None,
    )


async def _wait_either(work: asyncio.Task[None], stop: asyncio.Event) -> None:
    """Wait until ``work`` ends or ``stop`` is set."""
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()


async def serve_http(svc: Service, tools: FakeTools, args: argparse.Namespace) -> None:
    sock = svc.bind(args.port)
    await svc.serve_asgi("http", sock, build_app(tools, host=svc.host))
    svc.on_ready(
        lambda: log.info(
            "fake-mcp listening on http://%s:%d%s", svc.host, svc.ports["http"], MCP_PATH
        )
    )


async def serve_stdio(tools: FakeTools, stop: asyncio.Event) -> int:
    """Serve until stdin closes (the normal end) or a signal arrives."""
    mcp = build_mcp_server(tools)
    task: asyncio.Task[None] = asyncio.create_task(mcp.run_stdio_async())
    await _wait_either(task, stop)
    if task.done():
        await task  # stdin closed; re-raise a server failure, if any
        return 0
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=STDIO_STOP_GRACE_S)
    if not done:
        # The SDK reads stdin in a worker thread that cancellation cannot interrupt,
        # so with stdin still open the task never ends. Nothing is left to save
        # (counts-file lines are written whole), so leave without the loop's cleanup.
        log.info("stopping with stdin still open")
        logging.shutdown()
        os._exit(0)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return 0


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap(SERVICE, args, os.environ)
    tools = FakeTools(settings_from_args(args))
    if args.stdio:  # no listener, no ready file: the stdio server lives as long as stdin
        return run_async(lambda stop: serve_stdio(tools, stop))
    return boot.run(
        args.host,
        lambda svc: serve_http(svc, tools, args),
        instrumentations=(Instrumentation.ASGI,),
    )
