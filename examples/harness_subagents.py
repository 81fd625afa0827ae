"""A coding agent's CLI fans work out to luftpause sub-agents: the whole journey.

Start the stack (``make run``), then::

    .venv/bin/python examples/harness_subagents.py claude
    .venv/bin/python examples/harness_subagents.py codex
    .venv/bin/python examples/harness_subagents.py gemini

Each run gives the CLI a throwaway home (no login, no telemetry, nothing of yours
read or changed), adds the luftpause runtime as its MCP server the way
docs/getting-started/clients.md describes, sends its own model turns through the luftpause
proxy (Claude Code and Codex CLI), and asks it to research two rivers with one
sub-agent each. On the fake engines, the task's ``[tools:spawn+spawn,await]``
scripts the model: it calls ``spawn`` twice in one reply, then ``await``, then
answers with what ``await`` returned. Against a real model the task's words do the
asking. Afterwards the script prints the CLI's answer and the runtime's run tree.

Gemini CLI speaks the Gemini API, which the proxy does not serve: its model turns
come from a script of its own (``--fake-responses-non-strict``), in two prompts
(spawn both; then await the handles the first printed). Its MCP traffic is real.

The CLIs are found on ``PATH`` (``npm install -g @anthropic-ai/claude-code``,
``@openai/codex``, ``@google/gemini-cli``); ``make test`` installs the pinned
versions under ``.cache/node``, which this script also looks in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx

TASK = "Research the Rhine and the Danube, one luftpause sub-agent each. [tools:spawn+spawn,await]"
BINARIES = {"claude": "claude", "codex": "codex", "gemini": "gemini"}
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "node"  # where `make test` installs
RUN_TIMEOUT_S = 240.0


class Failed(Exception):
    """One line for the user; the script exits with status 1."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cli", choices=sorted(BINARIES), help="the CLI to run")
    parser.add_argument(
        "--proxy",
        default=os.environ.get("LUFTPAUSE_PROXY", "http://127.0.0.1:8080"),
        help="the luftpause proxy (dataplane) base URL, without /v1 "
        "(default: $LUFTPAUSE_PROXY, else http://127.0.0.1:8080)",
    )
    parser.add_argument(
        "--runtime",
        default=os.environ.get("LUFTPAUSE_RUNTIME", "http://127.0.0.1:7000"),
        help="the luftpause runtime base URL, without /mcp "
        "(default: $LUFTPAUSE_RUNTIME, else http://127.0.0.1:7000)",
    )
    parser.add_argument(
        "--scheduler",
        default=os.environ.get("LUFTPAUSE_SCHEDULER", "http://127.0.0.1:5001"),
        help="the scheduler's status URL, for the run tree at the end "
        "(default: $LUFTPAUSE_SCHEDULER, else http://127.0.0.1:5001)",
    )
    parser.add_argument("--task", default=TASK, help="what to ask (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds per run")
    parser.add_argument(
        "--json", metavar="PATH", help="also write what happened as JSON (for scripts)"
    )
    parser.add_argument("--keep-home", action="store_true", help="keep the throwaway home")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix=f"luftpause-{args.cli}-"))
    try:
        found = run(args, root)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_home:
            shutil.rmtree(root, ignore_errors=True)
    print(found["answer"])
    print()
    print(tree_text(args.scheduler, args.runtime))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    return 0


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    proxy, runtime = args.proxy.rstrip("/"), args.runtime.rstrip("/")
    for name, url in (("proxy", f"{proxy}/health"), ("runtime", f"{runtime}/health")):
        try:
            answer = httpx.get(url, timeout=5, headers=auth())
        except httpx.HTTPError as exc:
            raise Failed(
                f"no answer from the luftpause {name} at {url}: {exc} (is `make run` up?)"
            ) from None
        if answer.status_code >= 400:
            raise Failed(
                f"the luftpause {name} at {url} answered {answer.status_code}: {answer.text}"
            )
    home = Home(root, find(BINARIES[args.cli]))
    try:
        if args.cli == "claude":
            return claude(home, proxy, f"{runtime}/mcp", args.task, args.timeout)
        if args.cli == "codex":
            return codex(home, proxy, f"{runtime}/mcp", args.task, args.timeout)
        return gemini(home, f"{runtime}/mcp", args.task, args.timeout)
    except (KeyError, TypeError, ValueError) as exc:  # (output of an unexpected shape)
        raise Failed(
            f"{args.cli} printed something this script does not understand: {exc!r}"
        ) from None


def auth() -> dict[str, str]:
    token = os.environ.get("LUFTPAUSE_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def find(binary: str) -> Path:
    """The CLI on PATH, else the copy ``make test`` installed."""
    on_path = shutil.which(binary)
    if on_path:
        return Path(on_path)
    for candidate in sorted(CACHE.glob(f"*/node_modules/.bin/{binary}"), reverse=True):
        return candidate
    raise Failed(f"`{binary}` is not on PATH and not under {CACHE} (install it with npm)")


class Home:
    """A throwaway home for one CLI: its own HOME and XDG directories, a work folder,
    and an environment built from nothing but what the CLI needs."""

    def __init__(self, root: Path, binary: Path) -> None:
        self.root, self.binary = root, binary
        self.home, self.work = root / "home", root / "work"
        for d in (self.work, self.home / ".config", self.home / ".cache", self.home / ".codex"):
            d.mkdir(parents=True, exist_ok=True)
        # the CLI's own folder, and the Node an npm install put beside it, if any
        node_dirs = [str(binary.parent), *map(str, binary.parent.parent.glob("node-*/bin"))]
        self.env = {
            "PATH": os.pathsep.join([*node_dirs, os.environ.get("PATH", os.defpath)]),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "CODEX_HOME": str(self.home / ".codex"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            "NO_PROXY": "127.0.0.1,localhost,::1",
            # no update checks, telemetry or error reports
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }

    def run(self, *argv: str, env: dict[str, str], timeout: float) -> str:
        """Run the CLI (bounded: its whole process group is killed when time is up)."""
        proc = subprocess.Popen(
            [str(self.binary), *argv],
            cwd=self.work,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            raise Failed(
                f"{self.binary.name} did not finish in {timeout:.0f} s; it printed:\n"
                + raw.decode("utf-8", "replace")
            ) from None
        text = raw.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise Failed(f"{self.binary.name} exited with {proc.returncode}; it printed:\n{text}")
        return text


def bearer() -> str:
    return os.environ.get("LUFTPAUSE_TOKEN") or "unused"


def claude(home: Home, proxy: str, mcp: str, task: str, timeout: float) -> dict[str, Any]:
    """Claude Code: the runtime added with ``claude mcp add``; its model turns on the
    proxy (``ANTHROPIC_BASE_URL``, the token as its API key); luftpause's two tools
    allowed without asking."""
    add = ["mcp", "add", "--transport", "http", "--scope", "user", "luftpause", mcp]
    if os.environ.get("LUFTPAUSE_TOKEN"):
        add[2:2] = ["--header", "Authorization: Bearer ${LUFTPAUSE_TOKEN}"]
    home.run(*add, env={}, timeout=60)
    session = str(uuid.uuid4())
    env = {
        "ANTHROPIC_BASE_URL": proxy,
        "ANTHROPIC_API_KEY": bearer(),
        "ANTHROPIC_MODEL": "claude-local",  # the stack's alias sends it to its model
        "ANTHROPIC_CUSTOM_HEADERS": "x-luftpause-class: interactive",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2048",
        "LUFTPAUSE_TOKEN": os.environ.get("LUFTPAUSE_TOKEN", ""),
    }
    allowed = "mcp__luftpause__spawn,mcp__luftpause__await"
    out = home.run(
        "-p", task, "--session-id", session, "--allowedTools", allowed, env=env, timeout=timeout
    )
    return {"cli": "claude", "run": f"claude-code-{session}@claude-local", "answer": out.strip()}


def codex(home: Home, proxy: str, mcp: str, task: str, timeout: float) -> dict[str, Any]:
    """Codex CLI: a Responses provider on the proxy and the runtime as an MCP server,
    its tools approved in the config (``codex exec`` cannot ask)."""
    config = (
        'model = "gpt-local"\nmodel_provider = "luftpause"\n'
        "check_for_update_on_startup = false\n\n[analytics]\nenabled = false\n\n"
        "[feedback]\nenabled = false\n\n"
        f'[model_providers.luftpause]\nname = "luftpause"\nbase_url = "{proxy}/v1"\n'
        'env_key = "LUFTPAUSE_TOKEN"\nwire_api = "responses"\n'
        'http_headers = { "x-luftpause-class" = "interactive" }\n\n'
        f'[mcp_servers.luftpause]\nurl = "{mcp}"\ndefault_tools_approval_mode = "approve"\n'
    )
    if os.environ.get("LUFTPAUSE_TOKEN"):
        config += 'bearer_token_env_var = "LUFTPAUSE_TOKEN"\n'
    (home.home / ".codex" / "config.toml").write_text(config)
    out = home.run(
        "exec", "--skip-git-repo-check", "--sandbox", "read-only", "--json", task,
        env={"LUFTPAUSE_TOKEN": bearer()},
        timeout=timeout,
    )  # fmt: skip
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    thread = next((e["thread_id"] for e in events if e["type"] == "thread.started"), None)
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    answers = [i["text"] for i in items if i["type"] == "agent_message"]
    if thread is None or not answers:
        raise Failed(f"codex printed no thread or no answer:\n{out}")
    calls = [
        {"tool": i["tool"], "status": i["status"]} for i in items if i["type"] == "mcp_tool_call"
    ]
    return {
        "cli": "codex",
        "run": f"codex-{thread}@gpt-local",
        "answer": answers[-1],
        "calls": calls,
    }


def gemini(home: Home, mcp: str, task: str, timeout: float) -> dict[str, Any]:
    """Gemini CLI: the runtime in ``mcpServers`` (trusted: its tools run without asking,
    in a folder trusted for the run); its model turns scripted, two prompts (``task``
    is the first one's text; the script decides the calls)."""
    server: dict[str, Any] = {"httpUrl": mcp, "trust": True}
    if os.environ.get("LUFTPAUSE_TOKEN"):
        server["headers"] = {"Authorization": "Bearer ${LUFTPAUSE_TOKEN}"}
    settings = {
        "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "mcpServers": {"luftpause": server},
    }
    (home.home / ".gemini").mkdir(exist_ok=True)
    (home.home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2))

    def ask(prompt: str, script: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fake = home.root / f"turns-{uuid.uuid4().hex}.jsonl"
        fake.write_text("".join(json.dumps(t) + "\n" for t in [_GEMINI_ROUTE, *script]))
        env = {
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_API_KEY": "unused",  # (never used: the turns are scripted)
            "LUFTPAUSE_TOKEN": os.environ.get("LUFTPAUSE_TOKEN", ""),
        }
        out = home.run(
            "-p", prompt, "--fake-responses-non-strict", str(fake), "--output-format",
            "stream-json", env=env, timeout=timeout,
        )  # fmt: skip
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    spawn = [
        {"functionCall": {"name": "mcp_luftpause_spawn", "args": {"task": f"Research the {r}"}}}
        for r in ("Rhine", "Danube")
    ]
    first = ask(
        task,
        [_gemini_turn(spawn), _gemini_turn([{"text": "Both sub-agents are running."}])],
    )
    spawned = _gemini_results(first, "spawn", 2)
    handles = [json.loads(r["output"])["handle"] for r in spawned]
    wait = {"functionCall": {"name": "mcp_luftpause_await", "args": {"handles": handles}}}
    second = ask("Wait for both.", [_gemini_turn([wait]), _gemini_turn([{"text": "Done."}])])
    (waited,) = _gemini_results(second, "await", 1)
    return {"cli": "gemini", "run": None, "handles": handles, "answer": waited["output"]}


def _gemini_turn(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed model reply in Gemini CLI's fake-responses format."""
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5},
    }
    return {"method": "generateContentStream", "response": [chunk]}


# Gemini CLI asks a small model how complex each prompt is (its model router) before
# the turn; this answers it, so the script's replies go to the turns.
_ROUTE = {"complexity_reasoning": "simple", "complexity_score": 10}
_GEMINI_ROUTE = {
    "method": "generateContent",
    "response": {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": json.dumps(_ROUTE)}]},
                "finishReason": "STOP",
            }
        ]
    },
}


def _gemini_results(events: list[dict[str, Any]], tool: str, n: int) -> list[dict[str, Any]]:
    uses = [
        e["tool_id"] for e in events if e["type"] == "tool_use" and e["tool_name"].endswith(tool)
    ]
    results = [e for e in events if e["type"] == "tool_result" and e["tool_id"] in uses]
    if len(results) != n or any(r["status"] != "success" for r in results):
        raise Failed(f"gemini's {tool} calls did not all succeed: {json.dumps(results)}")
    return results


def tree_text(scheduler: str, runtime: str) -> str:
    """The scheduler's runs and the runtime's run tree, as ``luftpause status`` shows them."""
    luftpause = shutil.which("luftpause") or str(Path(sys.executable).with_name("luftpause"))
    try:
        out = subprocess.run(
            [luftpause, "status", "--scheduler", scheduler, "--runtime", runtime],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no run tree: {exc})"
    return out.stdout.strip() or out.stderr.strip()


if __name__ == "__main__":
    sys.exit(main())
