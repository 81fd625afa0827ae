"""``luftpause up``: starts the stack, says where it is, stops cleanly, reports a death."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def write_config(tmp: Path) -> tuple[Path, dict[str, int]]:
    names = ["grpc", "http", "dataplane", "runtime", "engine", "mcp"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    path = tmp / "stack.toml"
    path.write_text(f"""
[scheduler]
grpc_port = {ports["grpc"]}
http_port = {ports["http"]}
[dataplane]
port = {ports["dataplane"]}
scheduler = "127.0.0.1:{ports["grpc"]}"
[runtime]
port = {ports["runtime"]}
state_dir = "{tmp / "state"}"
dataplane_url = "http://127.0.0.1:{ports["dataplane"]}"
[[runtime.tool_servers]]
name = "fake"
url = "http://127.0.0.1:{ports["mcp"]}/mcp"
[[endpoints]]
name = "engine-a"
url = "http://127.0.0.1:{ports["engine"]}"
models = ["llama-3.2-1b"]
[[fakes.engines]]
name = "engine-a"
port = {ports["engine"]}
args = ["--time-scale", "50"]
[fakes.mcp]
port = {ports["mcp"]}
""")
    return path, ports


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(t) for t in text)
    return out


def start_up(config: Path, token: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUFTPAUSE_TOKEN"}
    if token is not None:
        env["LUFTPAUSE_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, "-m", "luftpause", "up", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )


def read_until(proc: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while needle not in seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"never saw {needle!r}; output so far:\n{seen}")
        line = proc.stdout.readline()
        seen += line
    return seen


def test_up_starts_everything_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """X3: one command starts the stack as local processes and says where each listens."""
    config, ports = write_config(tmp_path)
    proc = start_up(config)
    try:
        out = read_until(proc, "Press Ctrl-C")
        assert f"status http://127.0.0.1:{ports['http']}/status" in out
        assert f"http://127.0.0.1:{ports['dataplane']}/v1" in out
        assert f"Live status page:\n  http://127.0.0.1:{ports['http']}/" in out
        kids = children(proc.pid)
        assert len(kids) >= 4
        models = httpx.get(f"http://127.0.0.1:{ports['dataplane']}/v1/models", timeout=10)
        assert models.json()["data"][0]["id"] == "llama-3.2-1b"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for kid in kids:
            assert (
                not Path(f"/proc/{kid}").exists()
                or "zombie" in Path(f"/proc/{kid}/status").read_text()
            )
    finally:
        if proc.poll() is None:
            proc.kill()


def test_up_reports_a_dead_child_and_stops_the_rest(tmp_path: Path) -> None:
    """X3: when one service dies, up says which and how, stops the others, exits non-zero."""
    config, _ = write_config(tmp_path)
    proc = start_up(config)
    try:
        read_until(proc, "Press Ctrl-C")
        kids = children(proc.pid)
        os.kill(kids[0], signal.SIGKILL)  # the first child started: the fake engine
        assert proc.wait(timeout=30) == 1
        assert proc.stdout is not None
        rest = proc.stdout.read()
        assert "fake-engine engine-a was killed by SIGKILL; stopping the rest" in rest
        for kid in kids[1:]:
            assert not Path(f"/proc/{kid}").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_up_with_a_token_prints_the_header_for_claude(tmp_path: Path) -> None:
    """X2, X3: with LUFTPAUSE_TOKEN set, every service asks for it and the printed
    ``claude mcp add`` line sends it as ``--header "Authorization: Bearer <token>"``."""
    config, ports = write_config(tmp_path)
    proc = start_up(config, token="up-test-token")
    try:
        out = read_until(proc, "Press Ctrl-C")
        runtime = f"http://127.0.0.1:{ports['runtime']}/mcp"
        assert (
            f"claude mcp add --transport http luftpause {runtime} "
            '--header "Authorization: Bearer up-test-token"'
        ) in out
        models = f"http://127.0.0.1:{ports['dataplane']}/v1/models"
        assert httpx.get(models, timeout=10).status_code == 401
        auth = {"Authorization": "Bearer up-test-token"}
        assert httpx.get(models, headers=auth, timeout=10).status_code == 200
        assert httpx.post(runtime, json={}, timeout=10).status_code == 401
        status = f"http://127.0.0.1:{ports['http']}/status"
        assert httpx.get(status, timeout=10).status_code == 401
        assert httpx.get(status, headers=auth, timeout=10).status_code == 200
        assert "#token=up-test-token" in out  # the page link carries it in the fragment
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
