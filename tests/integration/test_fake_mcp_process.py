"""Integration tests of ``luftpause fake-mcp`` as a real process (H2).

HTTP: started with ``--port 0 --ready-file``, waited for (bounded), stopped with
SIGTERM (SIGKILL if it hangs). Stdio: spawned by the SDK's stdio client. The
processes' stderr is printed at teardown, which pytest shows for failed tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

pytestmark = pytest.mark.integration

PYTHON = sys.executable
COMMAND = [PYTHON, "-m", "luftpause", "fake-mcp"]
FAST_FLAGS = ["--lookup-delay-s", "0.01", "--deep-search-delay-s", "0.01", "--log-level", "DEBUG"]


@pytest.fixture
def stderr_log(tmp_path: Path) -> Iterator[TextIO]:
    """A file for the server's stderr; printed at teardown (shown when the test fails)."""
    path = tmp_path / "fake-mcp.stderr"
    with path.open("w+") as fh:
        yield fh
    print(f"--- fake-mcp stderr ({path}) ---\n{path.read_text()}")


@pytest.fixture
async def http_process(
    tmp_path: Path, stderr_log: TextIO
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, Any], Path]]:
    ready = tmp_path / "ready.json"
    counts_file = tmp_path / "counts.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *COMMAND,
        "--port", "0",
        "--ready-file", str(ready),
        "--counts-file", str(counts_file),
        *FAST_FLAGS,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=stderr_log,
    )  # fmt: skip
    try:
        with anyio.fail_after(20):
            while not ready.exists():
                assert proc.returncode is None, f"fake-mcp exited early with {proc.returncode}"
                await anyio.sleep(0.02)
        yield proc, json.loads(ready.read_text()), counts_file
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                with anyio.fail_after(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def test_http_process_serves_both_eras_and_stops_on_sigterm(
    http_process: tuple[asyncio.subprocess.Process, dict[str, Any], Path],
) -> None:
    """H2: a real process on --port 0 writes its ready file, serves /mcp in both eras,
    /counts and the counts file agree, and SIGTERM ends it with status 0."""
    proc, ready, counts_file = http_process
    assert ready["service"] == "fake-mcp"
    assert ready["pid"] == proc.pid
    base = ready["urls"]["http"]
    assert base == f"http://127.0.0.1:{ready['ports']['http']}"

    with anyio.fail_after(20):
        for mode, version in (("legacy", "2025-11-25"), ("auto", "2026-07-28")):
            async with Client(f"{base}/mcp", mode=mode) as client:
                assert client.protocol_version == version
                result = await client.call_tool("lookup", {"query": "q", "limit": 2})
                assert not result.is_error
                assert result.structured_content is not None
                assert len(result.structured_content["facts"]) == 2
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/health")).status_code == 200
            counts = (await http.get("/counts")).json()

    key = '{"limit":2,"query":"q"}'
    assert counts["completed"] == {"lookup": {key: 2}}
    assert counts["total_started"] == 2
    lines = [json.loads(line) for line in counts_file.read_text().splitlines()]
    assert [(line["tool"], line["args_json"], line["pid"]) for line in lines] == [
        ("lookup", key, proc.pid)
    ] * 2

    proc.send_signal(signal.SIGTERM)
    with anyio.fail_after(10):
        assert await proc.wait() == 0


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_stdio_transport(mode: str, tmp_path: Path, stderr_log: TextIO) -> None:
    """H2: `fake-mcp --stdio` serves the same tools over stdin/stdout in both eras;
    the counts file records the completed calls."""
    counts_file = tmp_path / "counts.jsonl"
    params = StdioServerParameters(
        command=PYTHON,
        args=[*COMMAND[1:], "--stdio", "--counts-file", str(counts_file), *FAST_FLAGS],
        env=dict(os.environ),
    )
    with anyio.fail_after(30):
        async with Client(stdio_client(params, errlog=stderr_log), mode=mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert tools["delete_record"].annotations is not None
            assert tools["delete_record"].annotations.destructive_hint is True
            deep = await client.call_tool("deep_search", {"query": "stdio", "depth": 1})
            deleted = await client.call_tool("delete_record", {"record_id": "s-1"})
    assert deep.structured_content is not None
    assert len(deep.structured_content["findings"]) == 2
    assert deleted.structured_content is not None
    assert deleted.structured_content["deleted"] is True
    lines = [json.loads(line) for line in counts_file.read_text().splitlines()]
    assert [(line["tool"], line["args_json"]) for line in lines] == [
        ("deep_search", '{"depth":1,"query":"stdio"}'),
        ("delete_record", '{"record_id":"s-1"}'),
    ]
