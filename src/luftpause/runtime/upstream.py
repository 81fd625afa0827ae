"""Upstream MCP tool servers (R5): the tools sub-agents may call.

One long-lived client per configured server (``RuntimeSettings.tool_servers``),
over Streamable HTTP or stdio, always in the ``legacy`` protocol mode (pinned:
the tool servers' era is not ours to guess). Each client lives in its own task,
because the SDK's transports are anyio task groups that must be entered and
left by the same task; calls from any run go through the shared session, which
multiplexes them.

A server that cannot be reached at start is logged and retried when ``tools``
is called or a call needs it. Tool names are offered to models as the server
gives them; when two servers have a tool of the same name, both are offered as
``<server>__<tool>``.

Each tool's input schema is checked and its validator built once, when the tool
list is loaded (R6, :func:`~luftpause.runtime.hygiene.compile_schema`); a tool
list reloaded unchanged keeps them. A tool whose schema is invalid stays listed
(``usable: false`` and the reason), is offered to models with an empty schema
and the reason in its description (an engine never sees the invalid schema),
and every call to it is refused with the reason without reaching its server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Tool

from luftpause.config import ToolServer
from luftpause.runtime.hygiene import CallCheck, CompiledSchema, check_call, compile_schema

log = logging.getLogger("luftpause.runtime.upstream")

CONNECT_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 600.0
MAX_RESULT_CHARS = 20_000


@dataclass(frozen=True)
class UpstreamTool:
    """A tool as offered to sub-agents."""

    name: str  # the name the model sees (unique across servers)
    server: str
    remote_name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool

    @property
    def destructive_needs_approval(self) -> bool:
        """R11: marked ``destructiveHint: true`` and not ``readOnlyHint: true``."""
        return self.destructive and not self.read_only

    @functools.cached_property
    def compiled(self) -> CompiledSchema:
        """The input schema, checked, with its validator (built on first use, then kept)."""
        return compile_schema(self.input_schema or {"type": "object"})

    @property
    def unusable_reason(self) -> str | None:
        """Why no call to this tool can be made (its input schema is invalid), or None."""
        problem = self.compiled.problem
        return None if problem is None else f"its input schema is invalid: {problem}"

    def check(self, raw_arguments: Any) -> CallCheck:
        """R6: one call's arguments fitted to this tool, or the refusal the model sees."""
        return check_call(self.name, raw_arguments, self.input_schema, self.compiled)

    def openai_tool(self) -> dict[str, Any]:
        parameters = self.input_schema or {"type": "object", "properties": {}}
        description = self.description
        reason = self.unusable_reason
        if reason is not None:  # the engine never sees a schema that is not one
            parameters = {"type": "object", "properties": {}}
            description = f"[unusable: {reason}] {description}"
        return {
            "type": "function",
            "function": {"name": self.name, "description": description, "parameters": parameters},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server": self.server,
            "description": self.description,
            "inputSchema": self.input_schema,
            "readOnly": self.read_only,
            "destructive": self.destructive,
            "needsApproval": self.destructive_needs_approval,
            "usable": self.unusable_reason is None,
            "unusableReason": self.unusable_reason,
        }


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    is_error: bool


def result_text(result: CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS} chars cut]"
    return text


class UpstreamServer:
    """One configured server and its client, held open by a dedicated task."""

    def __init__(self, settings: ToolServer) -> None:
        self.settings = settings
        self.name = settings.name
        self.client: Client | None = None
        self.tools: list[Tool] = []
        self.error: str | None = "not connected yet"
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    def _client(self) -> tuple[Client, httpx2.AsyncClient | None]:
        s = self.settings
        if s.url is not None:
            # Our own pool: the SDK's default caps connections, and a thousand runs
            # may call one server at once.
            http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(30.0, read=CALL_TIMEOUT_S, pool=None),
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
            )
            transport = streamable_http_client(s.url, http_client=http)
            return Client(transport, mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S), http
        params = StdioServerParameters(
            command=s.command[0], args=list(s.command[1:]), env=dict(s.env) or None
        )
        return Client(params, mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S), None

    async def _hold(self) -> None:
        http_client: httpx2.AsyncClient | None = None
        try:
            client, http_client = self._client()
            async with client:
                listed = await client.list_tools()
                self.tools = list(listed.tools)
                self.client = client
                self.error = None
                self._ready.set()
                log.info("tool server %s: %d tools", self.name, len(self.tools))
                await self._stop.wait()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("tool server %s unavailable: %s", self.name, self.error)
        finally:
            self.client = None
            self._ready.set()
            if http_client is not None:
                await http_client.aclose()

    async def connect(self, wait_s: float = CONNECT_TIMEOUT_S) -> bool:
        async with self._lock:
            if self.client is not None:
                return True
            if self._task is not None and not self._task.done():
                self._stop.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._task, 5.0)
            self._ready = asyncio.Event()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._hold(), name=f"tool-server-{self.name}")
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except TimeoutError:
                self.error = f"no answer within {wait_s:g} s"
                log.warning("tool server %s: %s", self.name, self.error)
            return self.client is not None

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        client = self.client
        if client is None and not await self.connect():
            return ToolOutcome(
                f"Error: tool server {self.name!r} is unavailable: {self.error}", True
            )
        client = self.client
        assert client is not None
        try:
            result = await client.call_tool(name, arguments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("tool server %s: call %s failed: %r", self.name, name, exc)
            return ToolOutcome(f"Error: tool {name!r} failed: {exc}", True)
        return ToolOutcome(result_text(result), bool(result.is_error))

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5.0)
            except (TimeoutError, Exception):
                self._task.cancel()


class ToolHub:
    """Every upstream server, and the tools they offer under unique names."""

    def __init__(self, servers: tuple[ToolServer, ...]) -> None:
        self.servers = {s.name: UpstreamServer(s) for s in servers}
        self.tools: dict[str, UpstreamTool] = {}

    async def start(self, wait_s: float = CONNECT_TIMEOUT_S) -> None:
        await asyncio.gather(*(s.connect(wait_s) for s in self.servers.values()))
        self._rebuild()

    async def refresh(self) -> None:
        """Reconnect servers that are down and rebuild the tool list."""
        down = [s for s in self.servers.values() if s.client is None]
        if down:
            await asyncio.gather(*(s.connect() for s in down))
        self._rebuild()

    def _rebuild(self) -> None:
        counts: dict[str, int] = {}
        for server in self.servers.values():
            for tool in server.tools:
                counts[tool.name] = counts.get(tool.name, 0) + 1
        tools: dict[str, UpstreamTool] = {}
        for server in self.servers.values():
            for tool in server.tools:
                name = tool.name if counts[tool.name] == 1 else f"{server.name}__{tool.name}"
                ann = tool.annotations
                built = UpstreamTool(
                    name=name,
                    server=server.name,
                    remote_name=tool.name,
                    description=tool.description or tool.title or tool.name,
                    input_schema=dict(tool.input_schema or {}),
                    read_only=bool(ann is not None and ann.read_only_hint is True),
                    destructive=bool(ann is not None and ann.destructive_hint is True),
                )
                old = self.tools.get(name)
                if old is not None and old == built:
                    tools[name] = old  # unchanged: keeps its checked schema and validator
                    continue
                tools[name] = built
                if built.unusable_reason is not None:  # checks the schema now, once
                    log.warning(
                        "tool server %s: tool %s is unusable: %s",
                        server.name,
                        name,
                        built.unusable_reason,
                    )
        self.tools = tools

    async def call(self, tool: UpstreamTool, arguments: dict[str, Any]) -> ToolOutcome:
        reason = tool.unusable_reason
        if reason is not None:  # callers check first (UpstreamTool.check); never send it
            return ToolOutcome(tool.check(arguments).refusal or reason, True)
        return await self.servers[tool.server].call(tool.remote_name, arguments)

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "connected": s.client is not None,
                "error": s.error,
                "tools": [t.name for t in s.tools],
                "unusableTools": {
                    t.name: t.unusable_reason
                    for t in self.tools.values()
                    if t.server == s.name and t.unusable_reason is not None
                },
            }
            for s in self.servers.values()
        ]

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers.values()))
