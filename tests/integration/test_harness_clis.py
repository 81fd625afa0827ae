"""Claude Code and Codex CLI run a task through the dataplane (B9, B4, X5).

The real CLIs from the npm registry (pinned in ``tests/_clients.py``, throwaway homes,
no login) are pointed at the proxy the way docs/getting-started/clients.md tells users to:
Claude Code with ``ANTHROPIC_BASE_URL`` (it speaks Anthropic Messages), Codex with a model
provider entry (``wire_api = "responses"``). Both ask for a model by their own names, which the
dataplane's alias map sends to the fake engines' model, and both send
``x-luftpause-class: interactive`` through their own custom-header settings. The fake
engines answer with tool calls first (the CLIs run them: read-only tools and a
read-only sandbox only), then with text; the task ends with the CLI printing that text.
The scheduler's ``/status/runs/{id}`` then shows the session as one interactive run
that never left its replica.

What each CLI printed is attached to the test report (``-rA`` shows it).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from _clients import (
    CLAUDE_CODE,
    CODEX,
    HARNESS_ALIASES,
    HARNESS_ENGINE_ARGS,
    REQUIRE_VARS,
    Sandbox,
    codex_sandbox,
    transcripts_fixture,  # noqa: F401  (provides the transcripts fixture)
)
from _npm import INSTALL_TIMEOUT_S, Bundle, installed_or_skip
from fullstack import Stack, start_stack

pytestmark = [
    pytest.mark.integration,
    # The first test of a fresh checkout installs Node and the client (npm) in its setup.
    pytest.mark.timeout(INSTALL_TIMEOUT_S + 300),
]

TASK = "Look around this folder with your tools, then tell me what you found."
RUN_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def stack(module_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return start_stack(
        module_services,
        tmp_path_factory.mktemp("clis"),
        engine_args=HARNESS_ENGINE_ARGS,
        extra_config=HARNESS_ALIASES,
    )


def installed(bundle: Bundle, what: str) -> Bundle:
    installed_or_skip(bundle, what, REQUIRE_VARS)
    return bundle


def run_status(stack: Stack, run_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{stack.status_url}/runs/{run_id}", timeout=5)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_claude_code_runs_a_task_through_the_proxy(
    stack: Stack, tmp_path: Path, transcripts: list[Sandbox]
) -> None:
    """B9, B4, X5: ``claude -p`` with ``ANTHROPIC_BASE_URL`` on the dataplane completes a
    task whose replies include tool calls; its session is one interactive run (named by
    its session ID) that kept its replica across every turn."""
    box = Sandbox(installed(CLAUDE_CODE, "Claude Code"), tmp_path / "claude")
    transcripts.append(box)
    session = str(uuid.uuid4())
    out = box.run(
        "claude",
        "-p",
        TASK,
        "--session-id",
        session,
        "--tools",
        "Glob,Read",  # read-only tools, allowed without asking
        env={
            "ANTHROPIC_BASE_URL": str(stack.dataplane.urls["http"]),
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": "claude-local",
            "ANTHROPIC_CUSTOM_HEADERS": "x-luftpause-class: interactive",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
        },
        timeout=RUN_TIMEOUT_S,
    )
    assert out.returncode == 0, out.output
    run = run_status(stack, f"claude-code-{session}@claude-local")
    assert run["turns"] >= 3, run  # two tool rounds, then the answer
    assert run["moves"] == 0 and run["service_class"] == "interactive", run
    assert run["in_flight"] == 0 and run["phase"] == "idle", run


def test_codex_runs_a_task_through_the_proxy(
    stack: Stack, tmp_path: Path, transcripts: list[Sandbox]
) -> None:
    """B9, B4, X5: ``codex exec`` with a Responses provider on the dataplane completes a
    task whose replies include tool calls (Codex runs them in its read-only sandbox);
    its thread is one interactive run that kept its replica."""
    installed(CODEX, "Codex CLI")
    box = codex_sandbox(tmp_path / "codex")
    transcripts.append(box)
    config = box.home / ".codex" / "config.toml"
    config.write_text(
        'model = "gpt-local"\nmodel_provider = "luftpause"\n'
        + config.read_text()
        + '\n[model_providers.luftpause]\nname = "luftpause"\n'
        f'base_url = "{stack.base_url}"\nenv_key = "LUFTPAUSE_TOKEN"\nwire_api = "responses"\n'
        'http_headers = { "x-luftpause-class" = "interactive" }\n'
    )
    out = box.run(
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "read-only",
        "--json",
        TASK,
        env={"LUFTPAUSE_TOKEN": "unused"},
        timeout=RUN_TIMEOUT_S,
    )
    assert out.returncode == 0, out.output
    events = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert "turn.completed" in kinds, out.output
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    assert any(i["type"] == "command_execution" for i in items), out.output  # a tool call
    assert items[-1]["type"] == "agent_message" and items[-1]["text"], out.output
    (thread,) = [e["thread_id"] for e in events if e["type"] == "thread.started"]
    run = run_status(stack, f"codex-{thread}@gpt-local")
    assert run["turns"] >= 3, run
    assert run["moves"] == 0 and run["service_class"] == "interactive", run
    assert run["in_flight"] == 0 and run["phase"] == "idle", run
