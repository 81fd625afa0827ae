"""Real MCP clients from the npm registry, run in throwaway homes (spec X5).

Claude Code, Codex CLI and Gemini CLI are installed by the shared helper
(``tests/_npm.py``): each in its own directory of ``.cache/node`` with Node
``NODE_VERSION``, at the exact versions pinned here, their dependencies frozen at
``NPM_BEFORE``. A ``Sandbox`` runs one client with a fresh ``HOME`` (and XDG
directories, and a work directory as its project) and an environment built from
scratch: no login, no API key, no telemetry, no update checks, nothing inherited
from the developer's own configuration. Every command is time-bound; its process
group is killed when the time is up. Each command and its output are kept in
``Sandbox.transcript`` so that a test can show what the client printed.

Codex prints no connection status in ``codex mcp list`` (only the configuration).
``codex_mcp_status`` therefore asks Codex's app server (``codex app-server``: the
JSON-RPC interface over stdio that its IDE extension uses, no login needed) for
``mcpServerStatus/list``: Codex then connects to every configured MCP server
(``initialize``, ``tools/list``) and answers with each server's ``serverInfo``, tools,
auth status and the error it met, if any.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _npm
import pytest

NPM_BEFORE = "2026-12-01"  # registry state for the clients' transitive dependencies

CLAUDE_CODE = _npm.Bundle(
    packages=(_npm.Package("claude-code", "@anthropic-ai/claude-code", "2.1.332"),),
    before=NPM_BEFORE,
    bins=("claude",),  # a native binary from a platform package (optional dependency)
)
CODEX = _npm.Bundle(
    packages=(_npm.Package("codex", "@openai/codex", "0.171.0"),),
    before=NPM_BEFORE,
    bins=("codex",),  # a Node launcher; the Rust binary comes from a platform package
)
GEMINI_CLI = _npm.Bundle(
    packages=(_npm.Package("gemini-cli", "@google/gemini-cli", "0.61.0"),),
    before=NPM_BEFORE,
    bins=("gemini",),
)

# The stack the CLIs' own model turns go through (tests/integration/test_harness_*.py):
# the dataplane maps their model names to the fake engines' one; the engines take their
# prompts of several thousand tokens, make two tool rounds before an answer and never
# run an answer to the reply limit.
HARNESS_ALIASES = (
    '[dataplane.model_aliases]\n"claude-*" = "llama-3.2-1b"\n"gpt-*" = "llama-3.2-1b"\n'
)
HARNESS_ENGINE_ARGS = (
    "--time-scale", "20", "--context-length", "65536", "--kv-tokens", "400000",
    "--tool-results", "2", "--runaway-per-mille", "0",
)  # fmt: skip

# A client that cannot be installed fails (instead of skipping) where any of these is set.
REQUIRE_VARS = ("CI", "LUFTPAUSE_REQUIRE_CONFORMANCE", "LUFTPAUSE_REQUIRE_CLIENTS")
RUN_TIMEOUT_S = 90.0

# ~/.gemini/settings.json to start from: no telemetry, no usage statistics, no update checks.
GEMINI_SETTINGS = {
    "telemetry": {"enabled": False},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
# ~/.codex/config.toml to start from: no update check, no analytics, no feedback uploads.
CODEX_CONFIG = (
    "check_for_update_on_startup = false\n\n[analytics]\nenabled = false\n\n"
    "[feedback]\nenabled = false\n"
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Result:
    argv: list[str]
    returncode: int
    output: str  # stdout and stderr together, ANSI escapes removed


@dataclass
class Sandbox:
    """One client with a throwaway home; ``run`` executes it there."""

    bundle: _npm.Bundle
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.work = self.root / "work"  # the client's project directory (its cwd)
        for d in (self.work, self.home / ".config", self.home / ".cache"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.home / ".local" / "share", self.home / ".local" / "state"):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": self.bundle.path_env(),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            "FORCE_COLOR": "0",
            "NO_PROXY": "127.0.0.1,localhost,::1",
            "no_proxy": "127.0.0.1,localhost,::1",
            # Claude Code: no auto-update, no telemetry, error reports or other extra traffic.
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # Codex: its home inside ours.
            "CODEX_HOME": str(self.home / ".codex"),
            **self.env,
        }

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
    ) -> Result:
        """Run a command in the sandbox (bounded); a timeout fails the test with the output."""
        proc = subprocess.Popen(
            list(argv),
            cwd=self.work,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed whole on timeout
        )
        try:
            raw, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raw, _ = proc.communicate()
            text = _ANSI.sub("", raw.decode("utf-8", errors="replace"))
            self.transcript.append(f"$ {shlex.join(argv)}\n{text}(killed after {timeout:.0f} s)")
            raise AssertionError(
                f"{shlex.join(argv)} did not finish in {timeout:.0f} s; it printed:\n{text}"
            ) from None
        text = _ANSI.sub("", raw.decode("utf-8", errors="replace"))
        self.transcript.append(f"$ {shlex.join(argv)}\n{text}(exit {proc.returncode})")
        return Result(list(argv), proc.returncode, text)

    def report(self) -> str:
        return "\n\n".join(self.transcript)


@pytest.fixture(name="transcripts")
def transcripts_fixture(request: pytest.FixtureRequest) -> Iterator[list[Sandbox]]:
    """Sandboxes a test used; what their clients printed goes into the test's report.
    (A fixture: import ``transcripts_fixture`` into a test module to use ``transcripts``.)"""
    boxes: list[Sandbox] = []
    yield boxes
    for i, box in enumerate(boxes):
        request.node.add_report_section("teardown", f"client transcript {i + 1}", box.report())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def gemini_sandbox(root: Path) -> Sandbox:
    box = Sandbox(GEMINI_CLI, root)
    settings = box.home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps(GEMINI_SETTINGS, indent=2) + "\n")
    return box


def codex_sandbox(root: Path) -> Sandbox:
    box = Sandbox(CODEX, root)
    config = box.home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CODEX_CONFIG)
    return box


def codex_mcp_status(
    box: Sandbox, env: dict[str, str] | None = None, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Codex's own view of its MCP servers: ``mcpServerStatus/list`` from ``codex
    app-server`` (JSON lines over stdio). Returns the ``data`` list of that answer."""
    proc = subprocess.Popen(
        ["codex", "app-server"],
        cwd=box.work,
        env={**box.env, **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout

    def send(message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def answer(request_id: int) -> dict[str, Any]:
        assert proc.stdout is not None
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    lines.append(line.decode("utf-8", errors="replace"))
                    message = json.loads(line)
                    if message.get("id") == request_id:
                        return dict(message)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"codex app-server sent no answer to request {request_id} in "
                        f"{timeout:.0f} s; it printed:\n" + "\n".join(lines)
                    )
                if sel.select(timeout=min(left, 1.0)):
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        raise AssertionError(
                            f"codex app-server exited ({proc.poll()}) before answering "
                            f"request {request_id}; it printed:\n" + "\n".join(lines)
                        )
                    buf += chunk

    try:
        client_info = {"name": "luftpause-tests", "title": None, "version": "0"}
        send({"method": "initialize", "id": 0, "params": {"clientInfo": client_info}})
        answer(0)
        send({"method": "initialized"})
        send({"method": "mcpServerStatus/list", "id": 1, "params": {}})
        reply = answer(1)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the app server exits when its input ends
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
        shown = [line if len(line) <= 400 else line[:400] + " …" for line in lines]
        box.transcript.append(
            "$ codex app-server  (initialize, mcpServerStatus/list)\n" + "\n".join(shown)
        )
    assert "result" in reply, reply
    servers = list(reply["result"]["data"])
    for s in servers:
        box.transcript.append(
            f"mcpServerStatus/list: {s.get('name')}: serverInfo.name="
            f"{(s.get('serverInfo') or {}).get('name')} tools={sorted(s.get('tools') or {})} "
            f"authStatus={s.get('authStatus')} toolsError={s.get('toolsError')}"
        )
    return servers
