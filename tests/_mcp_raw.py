"""A raw MCP client for tests: JSON-RPC over HTTP in both protocol eras (2026-07-28
per-request envelopes, 2025-11-25 ``initialize`` sessions), with the Tasks calls
(``tasks/get`` polling bounded by ``anyio.fail_after``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from luftpause.runtime.mcp_tasks import TASKS_EXTENSION

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
WAIT_S = 10.0
EXT_CAPS: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}


@dataclass
class Reply:
    status: int
    body: dict[str, Any]

    @property
    def result(self) -> dict[str, Any]:
        assert "result" in self.body, self.body
        result = self.body["result"]
        assert isinstance(result, dict)
        return result

    @property
    def error(self) -> dict[str, Any]:
        assert "error" in self.body, self.body
        error = self.body["error"]
        assert isinstance(error, dict)
        return error


def _parse(response: httpx.Response, request_id: int) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("id") == request_id:
                    return dict(message)
        raise AssertionError(f"no response with id {request_id} in {response.text!r}")
    body = response.json()
    assert isinstance(body, dict)
    return body


class RawMcp:
    """Raw JSON-RPC over HTTP to an MCP server, in either protocol era."""

    def __init__(self, http: httpx.AsyncClient, client_name: str = "tasks-test") -> None:
        self.http = http
        self.client_name = client_name
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def modern(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        caps: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        name_header: bool = True,
    ) -> Reply:
        """One 2026-07-28 request; by default the client declares the Tasks extension."""
        params = dict(params or {})
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": EXT_CAPS if caps is None else caps,
            "io.modelcontextprotocol/clientInfo": {"name": self.client_name, "version": "1"},
        }
        sent = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": method,
        }
        name = params.get("taskId") if method.startswith("tasks/") else params.get("name")
        if name_header and isinstance(name, str):
            sent["Mcp-Name"] = name
        sent.update(headers or {})
        request_id = self._id()
        response = await self.http.post(
            "/mcp",
            headers=sent,
            json={"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
        )
        return Reply(response.status_code, _parse(response, request_id))

    async def legacy_session(self, capabilities: dict[str, Any]) -> str:
        """Open a 2025-11-25 session (``initialize`` + ``initialized``); its session id."""
        request_id = self._id()
        response = await self.http.post(
            "/mcp",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            json={
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "initialize",
                "params": {
                    "protocolVersion": LEGACY,
                    "capabilities": capabilities,
                    "clientInfo": {"name": "tasks-test-legacy", "version": "1"},
                },
            },
        )
        body = _parse(response, request_id)
        assert body["result"]["protocolVersion"] == LEGACY, body
        session = response.headers["mcp-session-id"]
        ack = await self.http.post(
            "/mcp",
            headers=self._legacy_headers(session),
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        )
        assert ack.status_code == 202, ack.text
        return session

    @staticmethod
    def _legacy_headers(session: str) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": LEGACY,
            "Mcp-Session-Id": session,
        }

    async def legacy(self, session: str, method: str, params: dict[str, Any]) -> Reply:
        request_id = self._id()
        response = await self.http.post(
            "/mcp",
            headers=self._legacy_headers(session),
            json={"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
        )
        return Reply(response.status_code, _parse(response, request_id))

    async def create(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Call a task tool as a Tasks client; the CreateTaskResult."""
        reply = await self.modern("tools/call", {"name": tool, "arguments": arguments or {}})
        created = reply.result
        assert created["resultType"] == "task", created
        return created

    async def get(self, task_id: str) -> dict[str, Any]:
        return (await self.modern("tasks/get", {"taskId": task_id})).result

    async def wait_for(self, task_id: str, *statuses: str, keys: int = 0) -> dict[str, Any]:
        """Poll ``tasks/get`` (bounded) until the task has one of ``statuses`` (and, for
        ``input_required``, at least ``keys`` pending input requests)."""
        with anyio.fail_after(WAIT_S):
            while True:
                task = await self.get(task_id)
                if task["status"] in statuses and len(task.get("inputRequests", {})) >= keys:
                    return task
                await anyio.sleep(0.005)
