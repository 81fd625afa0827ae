"""Component tests of the fake MCP tool server (H2), served in process on 127.0.0.1:0.

The client is the SDK's own ``mcp.Client`` in both protocol eras: ``legacy``
(2025-11-25, initialize handshake, stateful session) and ``auto`` (negotiates
2026-07-28 via ``server/discover``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
from mcp import Client
from mcp_types import CallToolResult

from luftpause.fakes.mcp_tools import (
    DEEP_SEARCH_DELAY_RANGE,
    LOOKUP_DELAY_RANGE,
    CallCounts,
    FakeMcpSettings,
    FakeTools,
    add_arguments,
    args_key,
    build_app,
    filler_fact,
    settings_from_args,
    transport_security_for,
)
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started

FAST = FakeMcpSettings(lookup_delay_s=0.01, deep_search_delay_s=0.01)
MODES = ["legacy", "auto"]
EXPECTED_VERSION = {"legacy": "2025-11-25", "auto": "2026-07-28"}


@asynccontextmanager
async def serving(
    settings: FakeMcpSettings = FAST,
    *,
    allow_host: str = "127.0.0.1",
    counts: CallCounts | None = None,
) -> AsyncIterator[tuple[str, FakeTools]]:
    """Serve the fake on 127.0.0.1:0 in this event loop; yield (base URL, tools)."""
    tools = FakeTools(settings, counts)
    app = build_app(tools, host=allow_host)
    sock = bind_socket("127.0.0.1", 0)
    base = f"http://127.0.0.1:{bound_port(sock)}"
    server = uvicorn_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        with anyio.fail_after(10):
            await wait_started(server, task)
        yield base, tools
    finally:
        server.should_exit = True
        with anyio.fail_after(10):
            await task
        sock.close()


async def get_counts(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base) as http:
        response = await http.get("/counts")
    assert response.status_code == 200
    counts = response.json()
    assert isinstance(counts, dict)
    return counts


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


@pytest.mark.parametrize("mode", MODES)
async def test_lists_tools_with_annotations_and_integer_schemas(mode: str) -> None:
    """H2/R11/R6: three tools; delete_record is destructive, the others read-only;
    `limit` and `depth` are integers in the input schemas."""
    async with serving() as (base, _):
        with anyio.fail_after(15):
            async with Client(f"{base}/mcp", mode=mode) as client:
                assert client.protocol_version == EXPECTED_VERSION[mode]
                listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == {"lookup", "deep_search", "delete_record"}
    for name in ("lookup", "deep_search"):
        annotations = listed[name].annotations
        assert annotations is not None
        assert annotations.read_only_hint is True
        assert annotations.destructive_hint is False
    destructive = listed["delete_record"].annotations
    assert destructive is not None
    assert destructive.destructive_hint is True
    assert destructive.read_only_hint is False

    lookup_schema = listed["lookup"].input_schema
    assert lookup_schema["required"] == ["query"]
    assert lookup_schema["properties"]["query"]["type"] == "string"
    assert lookup_schema["properties"]["limit"]["type"] == "integer"
    assert lookup_schema["properties"]["limit"]["default"] == 3
    depth = listed["deep_search"].input_schema["properties"]["depth"]
    assert (depth["type"], depth["default"]) == ("integer", 2)
    assert listed["delete_record"].input_schema["required"] == ["record_id"]


@pytest.mark.parametrize("mode", MODES)
async def test_calls_each_tool_and_counts_completions(mode: str) -> None:
    """H2: every tool answers over HTTP in both eras; counters key on the arguments as sent."""
    async with serving() as (base, _):
        with anyio.fail_after(15):
            async with Client(f"{base}/mcp", mode=mode) as client:
                looked = structured(
                    await client.call_tool("lookup", {"query": "otters", "limit": 4})
                )
                default = structured(await client.call_tool("lookup", {"query": "otters"}))
                deep = structured(
                    await client.call_tool("deep_search", {"query": "otters", "depth": 3})
                )
                deleted = structured(await client.call_tool("delete_record", {"record_id": "r-7"}))
            counts = await get_counts(base)

    assert looked["query"] == "otters"
    assert looked["facts"] == [filler_fact(0, "lookup", "otters", i) for i in range(4)]
    assert len(default["facts"]) == 3
    assert deep["depth"] == 3
    assert [f["level"] for f in deep["findings"]] == [1, 1, 2, 2, 3, 3]
    assert all("otters" in f["summary"] for f in deep["findings"])
    assert deleted["record_id"] == "r-7"
    assert deleted["deleted"] is True

    lookup_4 = args_key({"query": "otters", "limit": 4})
    assert lookup_4 == '{"limit":4,"query":"otters"}'
    expected = {
        "lookup": {lookup_4: 1, '{"query":"otters"}': 1},
        "deep_search": {'{"depth":3,"query":"otters"}': 1},
        "delete_record": {'{"record_id":"r-7"}': 1},
    }
    assert counts["started"] == expected
    assert counts["completed"] == expected
    assert counts["total_started"] == counts["total_completed"] == 4


class SignallingCounts(CallCounts):
    """Counters that also announce the first started call, so a test waits on an event."""

    def __init__(self) -> None:
        super().__init__()
        self.first_started = anyio.Event()

    def started(self, tool: str, arguments: Mapping[str, Any]) -> str:
        key = super().started(tool, arguments)
        self.first_started.set()
        return key


async def test_in_flight_call_is_started_not_completed_then_reset() -> None:
    """H2 (exactly-once support): a call counts as started when the tool begins and as
    completed only when it returns; a cancelled call stays started-only; reset zeroes."""
    slow = FakeMcpSettings(lookup_delay_s=600.0)
    key = args_key({"query": "slow"})
    signalling = SignallingCounts()
    async with serving(slow, counts=signalling) as (base, _):
        with anyio.fail_after(15):
            async with (
                Client(f"{base}/mcp", mode="legacy") as client,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(client.call_tool, "lookup", {"query": "slow"})
                await signalling.first_started.wait()
                in_flight = await get_counts(base)
                tg.cancel_scope.cancel()
            after_cancel = await get_counts(base)
            async with httpx.AsyncClient(base_url=base) as http:
                reset = await http.post("/counts/reset")
            after_reset = await get_counts(base)

    assert in_flight["started"] == {"lookup": {key: 1}}
    assert in_flight["completed"] == {}
    assert (in_flight["total_started"], in_flight["total_completed"]) == (1, 0)
    assert after_cancel["started"] == {"lookup": {key: 1}}
    assert after_cancel["total_completed"] == 0
    assert reset.status_code == 200
    empty = {"started": {}, "completed": {}, "total_started": 0, "total_completed": 0}
    assert reset.json() == empty
    assert after_reset == empty


async def test_counts_file_gets_one_line_per_completed_call(tmp_path: Path) -> None:
    """H2: --counts-file appends one JSON line per completed call and survives a reset."""
    counts_file = tmp_path / "sub" / "counts.jsonl"
    settings = FakeMcpSettings(lookup_delay_s=0.0, deep_search_delay_s=0.0, counts_file=counts_file)
    async with serving(settings) as (base, _):
        with anyio.fail_after(15):
            async with Client(f"{base}/mcp", mode="auto") as client:
                await client.call_tool("lookup", {"query": "a", "limit": 1})
                async with httpx.AsyncClient(base_url=base) as http:
                    assert (await http.post("/counts/reset")).status_code == 200
                await client.call_tool("lookup", {"query": "a", "limit": 1})
                await client.call_tool("delete_record", {"record_id": "x"})
    lines = [json.loads(line) for line in counts_file.read_text().splitlines()]
    assert [(line["event"], line["tool"], line["args_json"]) for line in lines] == [
        ("completed", "lookup", '{"limit":1,"query":"a"}'),
        ("completed", "lookup", '{"limit":1,"query":"a"}'),
        ("completed", "delete_record", '{"record_id":"x"}'),
    ]
    assert lines[2]["arguments"] == {"record_id": "x"}
    assert all(isinstance(line["pid"], int) for line in lines)


@pytest.mark.parametrize("mode", MODES)
async def test_wrong_typed_arguments_are_refused_and_detectable(mode: str) -> None:
    """H2/R6: a string where the schema says integer fails the listed schema (client-side
    validator) and the server refuses it instead of coercing; nothing is counted."""
    async with serving() as (base, _):
        with anyio.fail_after(15):
            async with Client(f"{base}/mcp", mode=mode) as client:
                tools = {tool.name: tool for tool in (await client.list_tools()).tools}
                schema = tools["lookup"].input_schema
                jsonschema.validate({"query": "q", "limit": 3}, schema)
                with pytest.raises(jsonschema.ValidationError):
                    jsonschema.validate({"query": "q", "limit": "3"}, schema)
                with pytest.raises(jsonschema.ValidationError):
                    jsonschema.validate(
                        {"query": "q", "depth": "2"}, tools["deep_search"].input_schema
                    )
                refused = await client.call_tool("lookup", {"query": "q", "limit": "3"})
                refused_deep = await client.call_tool("deep_search", {"query": "q", "depth": "2"})
            counts = await get_counts(base)
    assert refused.is_error
    assert refused_deep.is_error
    assert counts["total_started"] == 0


def test_fixed_delays_and_time_scale() -> None:
    """H2: --lookup-delay-s / --deep-search-delay-s fix the delays; --time-scale divides all."""
    tools = FakeTools(FakeMcpSettings(lookup_delay_s=0.01, deep_search_delay_s=0.03))
    assert tools.delay_s("lookup") == pytest.approx(0.01)
    assert tools.delay_s("deep_search") == pytest.approx(0.03)
    assert tools.delay_s("delete_record") == 0.0
    scaled = FakeTools(FakeMcpSettings(lookup_delay_s=0.5, deep_search_delay_s=2.0, time_scale=10))
    assert scaled.delay_s("lookup") == pytest.approx(0.05)
    assert scaled.delay_s("deep_search") == pytest.approx(0.2)


def test_random_delays_are_seeded_and_in_range() -> None:
    """H2: without fixed delays, lookup waits ~1 s and deep_search ~3 s, reproducibly per seed."""

    def draws(seed: int, scale: float = 1.0) -> list[float]:
        tools = FakeTools(FakeMcpSettings(seed=seed, time_scale=scale))
        return [tools.delay_s(name) for name in ("lookup", "deep_search") * 20]

    first = draws(seed=1)
    assert first == draws(seed=1)
    assert first != draws(seed=2)
    assert all(LOOKUP_DELAY_RANGE[0] <= d <= LOOKUP_DELAY_RANGE[1] for d in first[0::2])
    assert all(DEEP_SEARCH_DELAY_RANGE[0] <= d <= DEEP_SEARCH_DELAY_RANGE[1] for d in first[1::2])
    assert draws(seed=1, scale=4.0) == pytest.approx([d / 4 for d in first])


def test_filler_depends_on_seed_and_query_only() -> None:
    """H2: filler results are deterministic per (seed, tool, query, index)."""
    assert filler_fact(3, "lookup", "q", 0) == filler_fact(3, "lookup", "q", 0)
    assert filler_fact(3, "lookup", "q", 0) != filler_fact(4, "lookup", "q", 0)
    assert filler_fact(3, "lookup", "q", 0) != filler_fact(3, "lookup", "r", 0)
    assert "'q'" in filler_fact(3, "lookup", "q", 0)


async def test_health_and_loopback_hosts_allowed_foreign_host_refused() -> None:
    """H2: /health answers; DNS-rebinding protection admits 127.0.0.1 and localhost (any
    port) but refuses a foreign Host header."""
    async with serving() as (base, _):
        port = base.rsplit(":", 1)[1]
        with anyio.fail_after(15):
            async with Client(f"http://localhost:{port}/mcp", mode="legacy") as client:
                result = await client.call_tool("lookup", {"query": "via localhost", "limit": 1})
                assert not result.is_error
            async with httpx.AsyncClient(base_url=base) as http:
                health = await http.get("/health")
                foreign = await http.post(
                    "/mcp",
                    headers={
                        "Host": "evil.example",
                        "Accept": "application/json, text/event-stream",
                    },
                    json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                )
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert foreign.status_code == 421


async def test_any_interface_host_admits_any_host_header() -> None:
    """H2: with --host 0.0.0.0 (containers) any Host header is admitted."""
    assert transport_security_for("0.0.0.0").enable_dns_rebinding_protection is False
    assert transport_security_for("::").enable_dns_rebinding_protection is False
    specific = transport_security_for("10.1.2.3")
    assert "10.1.2.3:*" in specific.allowed_hosts
    assert "localhost:*" in specific.allowed_hosts
    # Served on loopback here (tests never listen elsewhere) with the 0.0.0.0 allowlist.
    async with serving(allow_host="0.0.0.0") as (base, _):
        with anyio.fail_after(15):
            async with httpx.AsyncClient(base_url=base) as http:
                response = await http.post(
                    "/mcp",
                    headers={
                        "Host": "fake-mcp.internal:9000",
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2025-11-25",
                    },
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {
                            "protocolVersion": "2025-11-25",
                            "capabilities": {},
                            "clientInfo": {"name": "test", "version": "0"},
                        },
                    },
                )
    assert response.status_code == 200, response.text


def test_cli_flags_defaults_help_and_validation() -> None:
    """H2: the flags parse into settings; every flag has help; bad values exit with 2."""
    parser = argparse.ArgumentParser(prog="fake-mcp")
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.host, args.port, args.stdio, args.seed) == ("127.0.0.1", 9000, False, 0)
    assert settings_from_args(args) == FakeMcpSettings()
    args = parser.parse_args(
        ["--seed", "7", "--lookup-delay-s", "0.01", "--deep-search-delay-s", "0.02",
         "--time-scale", "5", "--counts-file", "c.jsonl", "--port", "0", "--stdio"]
    )  # fmt: skip
    assert settings_from_args(args) == FakeMcpSettings(
        seed=7,
        lookup_delay_s=0.01,
        deep_search_delay_s=0.02,
        time_scale=5.0,
        counts_file=Path("c.jsonl"),
    )
    assert args.stdio and args.port == 0
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help text"
    for bad in (["--time-scale", "0"], ["--lookup-delay-s", "-1"], ["--seed", "x"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(bad)
        assert exc.value.code == 2
    with pytest.raises(ValueError):
        FakeMcpSettings(time_scale=0)


def test_call_counts_snapshot_is_a_copy() -> None:
    """H2: a snapshot does not change when later calls are counted."""
    counts = CallCounts()
    counts.started("lookup", {"query": "q"})
    snap = counts.snapshot()
    counts.completed("lookup", {"query": "q"})
    counts.started("lookup", {"query": "q"})
    assert snap == {
        "started": {"lookup": {'{"query":"q"}': 1}},
        "completed": {},
        "total_started": 1,
        "total_completed": 0,
    }
    assert counts.snapshot()["started"] == {"lookup": {'{"query":"q"}': 2}}
