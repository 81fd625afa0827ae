"""Real MCP clients connect to the runtime, registered with their own commands (X5, X2, R1).

Claude Code, Codex CLI and Gemini CLI come from the npm registry at pinned versions
(``tests/_clients.py``, installed by ``tests/_npm.py`` into ``.cache/node``) and run in
throwaway homes with no login. Each test starts from a fresh home, registers the
runtime with the client's own command and asks the client whether it connects:

- Claude Code: ``claude mcp list`` / ``claude mcp get`` print the server's status.
- Gemini CLI: ``gemini mcp list`` prints it (only in a trusted folder).
- Codex CLI: ``codex mcp list`` prints the configuration only, so the check is Codex's
  app server (``mcpServerStatus/list``), which connects and reports the server's
  ``serverInfo`` and tools.

Two runtimes serve the module as real processes on loopback: one open, one with
``LUFTPAUSE_TOKEN`` (X2: ``/mcp`` then needs ``Authorization: Bearer <token>``). No
tool is ever called, so they need no dataplane or tool server. What each client printed
is attached to the test report (``-rA`` shows it; docs/getting-started/clients.md quotes
it).

A client that cannot be installed (registry unreachable, no build for this platform)
skips its tests naming the package and why, or fails them where ``CI``,
``LUFTPAUSE_REQUIRE_CONFORMANCE`` or ``LUFTPAUSE_REQUIRE_CLIENTS`` is set.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _clients import (
    CLAUDE_CODE,
    CODEX,
    GEMINI_CLI,
    REQUIRE_VARS,
    Sandbox,
    codex_mcp_status,
    codex_sandbox,
    gemini_sandbox,
    transcripts_fixture,  # noqa: F401  (provides the transcripts fixture)
)
from _npm import INSTALL_TIMEOUT_S, Bundle, installed_or_skip
from conftest import Services

from luftpause.up import claude_mcp_add

pytestmark = [
    pytest.mark.integration,
    # The first test of a fresh checkout installs Node and the client (npm) in its setup.
    pytest.mark.timeout(INSTALL_TIMEOUT_S + 300),
]

TOKEN = "clients-test-token"  # for a runtime on loopback that lives as long as this module
RUNTIME_TOOLS = {"spawn", "await", "run", "status", "cancel", "approve", "tools", "decide"}
ENV_HEADER = "Authorization: Bearer ${LUFTPAUSE_TOKEN}"  # expanded by the client, not a shell


# ----------------------------------------------------------------------------- fixtures


def _start_runtime(services: Services, tmp: Path, name: str, token: str) -> str:  # -> the /mcp URL
    config = tmp / f"{name}.toml"
    # Nothing listens on the dataplane address: these tests never spawn a sub-agent.
    config.write_text(
        f'[runtime]\ndataplane_url = "http://127.0.0.1:9"\nstate_dir = "{tmp / name}"\n'
    )
    runtime = services.start(
        "runtime",
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        name=f"runtime-{name}",
        env={"LUFTPAUSE_TOKEN": token},
    )
    return runtime.urls["http"] + "/mcp"


@pytest.fixture(scope="module")
def open_url(module_services: Services, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _start_runtime(module_services, tmp_path_factory.mktemp("open"), "open", "")


@pytest.fixture(scope="module")
def token_url(module_services: Services, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _start_runtime(module_services, tmp_path_factory.mktemp("token"), "token", TOKEN)


def _installed(bundle: Bundle, what: str) -> Bundle:
    installed_or_skip(bundle, what, REQUIRE_VARS)
    return bundle


@pytest.fixture(scope="module")
def claude_code() -> Bundle:
    return _installed(CLAUDE_CODE, "Claude Code")


@pytest.fixture(scope="module")
def codex() -> Bundle:
    return _installed(CODEX, "Codex CLI")


@pytest.fixture(scope="module")
def gemini() -> Bundle:
    return _installed(GEMINI_CLI, "Gemini CLI")


@pytest.fixture
def claude_box(
    claude_code: Bundle, tmp_path: Path, transcripts: list[Sandbox]
) -> Iterator[Sandbox]:
    yield from _boxes(lambda root: Sandbox(claude_code, root), tmp_path, transcripts)


@pytest.fixture
def codex_box(codex: Bundle, tmp_path: Path, transcripts: list[Sandbox]) -> Iterator[Sandbox]:
    yield from _boxes(codex_sandbox, tmp_path, transcripts)


@pytest.fixture
def gemini_box(gemini: Bundle, tmp_path: Path, transcripts: list[Sandbox]) -> Iterator[Sandbox]:
    yield from _boxes(gemini_sandbox, tmp_path, transcripts)


def _boxes(
    make: Callable[[Path], Sandbox], tmp_path: Path, transcripts: list[Sandbox]
) -> Iterator[Sandbox]:
    box = make(tmp_path / f"box{len(transcripts)}")
    transcripts.append(box)
    yield box


def fresh(box: Sandbox, transcripts: list[Sandbox]) -> Sandbox:
    """A second, independent home for the same client (for a second registration)."""
    if box.bundle is CODEX:
        other = codex_sandbox(box.root.with_name(box.root.name + "-b"))
    elif box.bundle is GEMINI_CLI:
        other = gemini_sandbox(box.root.with_name(box.root.name + "-b"))
    else:
        other = Sandbox(box.bundle, box.root.with_name(box.root.name + "-b"))
    transcripts.append(other)
    return other


# ----------------------------------------------------------------------------- helpers


def claude_status(box: Sandbox, url: str, env: dict[str, str] | None = None) -> str:
    """The status ``claude mcp list`` prints for the server ``luftpause`` at ``url``."""
    out = box.run("claude", "mcp", "list", env=env)
    assert out.returncode == 0, out.output  # exit 0 even when a server fails: read the line
    match = re.search(rf"^luftpause: {re.escape(url)} \(HTTP\) - (.+)$", out.output, re.M)
    assert match, out.output
    return match.group(1).strip()


def gemini_status(box: Sandbox, url: str, env: dict[str, str] | None = None) -> str:
    """The status ``gemini mcp list`` prints for the server ``luftpause`` at ``url``."""
    out = box.run("gemini", "mcp", "list", env=env)
    assert out.returncode == 0, out.output
    match = re.search(rf"^(\S+) luftpause: {re.escape(url)} \(http\) - (.+)$", out.output, re.M)
    assert match, out.output
    return f"{match.group(1)} {match.group(2).strip()}"


def only_server(status: list[dict[str, Any]]) -> dict[str, Any]:
    assert [s["name"] for s in status] == ["luftpause"], status
    return status[0]


# ----------------------------------------------------------------------------- Claude Code


def test_claude_code_connects_with_the_line_luftpause_up_prints(
    claude_box: Sandbox, open_url: str
) -> None:
    """X5, R1: the ``claude mcp add`` line that ``luftpause up`` prints registers the
    runtime in Claude Code, which then lists it as connected."""
    version = claude_box.run("claude", "--version")
    assert version.output.strip() == "2.1.332 (Claude Code)", version.output
    added = claude_box.run(*shlex.split(claude_mcp_add(open_url, None)))
    assert added.returncode == 0, added.output
    assert f"Added HTTP MCP server luftpause with URL: {open_url}" in added.output
    assert claude_status(claude_box, open_url) == "✔ Connected"
    got = claude_box.run("claude", "mcp", "get", "luftpause")
    assert "Status: ✔ Connected" in got.output and "Type: http" in got.output, got.output


def test_claude_code_sends_the_token_header_luftpause_up_prints(
    claude_box: Sandbox, token_url: str, transcripts: list[Sandbox]
) -> None:
    """X5, X2: with ``LUFTPAUSE_TOKEN`` set, the printed line carries ``--header
    "Authorization: Bearer <token>"`` and Claude Code connects; registered without the
    header it does not (the runtime answers 401, Claude Code tries OAuth and gives up)."""
    added = claude_box.run(*shlex.split(claude_mcp_add(token_url, TOKEN)))
    assert added.returncode == 0, added.output
    assert claude_status(claude_box, token_url) == "✔ Connected"

    bare = fresh(claude_box, transcripts)
    added = bare.run("claude", "mcp", "add", "--transport", "http", "luftpause", token_url)
    assert added.returncode == 0, added.output
    status = claude_status(bare, token_url)
    assert status.startswith(("✘ Failed to connect", "△ Needs authentication")), status


def test_claude_code_header_from_the_environment(claude_box: Sandbox, token_url: str) -> None:
    """X5, X2: a header written as ``Bearer ${LUFTPAUSE_TOKEN}`` (single-quoted, so the
    token stays out of ~/.claude.json) is expanded by Claude Code when it connects."""
    added = claude_box.run(
        "claude",
        "mcp",
        "add",
        "--transport",
        "http",
        "luftpause",
        token_url,
        "--header",
        ENV_HEADER,
    )
    assert added.returncode == 0, added.output
    stored = json.loads((claude_box.home / ".claude.json").read_text())
    assert ENV_HEADER.split(": ", 1)[1] in json.dumps(stored) and TOKEN not in json.dumps(stored)
    assert claude_status(claude_box, token_url, env={"LUFTPAUSE_TOKEN": TOKEN}) == "✔ Connected"
    wrong = claude_status(claude_box, token_url, env={"LUFTPAUSE_TOKEN": "not-the-token"})
    assert wrong.startswith("✘ Failed to connect") and "401" in wrong, wrong


# ----------------------------------------------------------------------------- Codex CLI


def test_codex_connects(codex_box: Sandbox, open_url: str) -> None:
    """X5, R1: ``codex mcp add NAME --url URL`` writes ``[mcp_servers.luftpause] url``;
    ``codex mcp list`` shows it enabled (configuration only); Codex's app server connects
    and reports the runtime's serverInfo and its eight tools."""
    version = codex_box.run("codex", "--version")
    assert version.output.strip().splitlines()[-1] == "codex-cli 0.171.0", version.output
    added = codex_box.run("codex", "mcp", "add", "luftpause", "--url", open_url)
    assert added.returncode == 0 and "Added global MCP server 'luftpause'" in added.output
    config = tomllib.loads((codex_box.home / ".codex" / "config.toml").read_text())
    assert config["mcp_servers"]["luftpause"] == {"url": open_url}
    listed = codex_box.run("codex", "mcp", "list", "--json")
    entry = json.loads(listed.output[listed.output.index("[") :])[0]
    assert entry["name"] == "luftpause" and entry["enabled"] is True, entry
    assert entry["transport"]["type"] == "streamable_http", entry
    assert entry["transport"]["url"] == open_url, entry

    server = only_server(codex_mcp_status(codex_box))
    assert server["serverInfo"]["name"] == "luftpause-runtime", server
    assert set(server["tools"]) == RUNTIME_TOOLS, server
    assert server.get("toolsError") is None, server


def test_codex_reads_the_token_from_an_environment_variable(
    codex_box: Sandbox, token_url: str, transcripts: list[Sandbox]
) -> None:
    """X5, X2: ``--bearer-token-env-var LUFTPAUSE_TOKEN`` makes Codex send ``Authorization:
    Bearer $LUFTPAUSE_TOKEN``: it connects; registered without it, Codex gets 401 and lists
    no tools ("Auth required")."""
    added = codex_box.run(
        "codex",
        "mcp",
        "add",
        "luftpause",
        "--url",
        token_url,
        "--bearer-token-env-var",
        "LUFTPAUSE_TOKEN",
    )
    assert added.returncode == 0, added.output
    config = tomllib.loads((codex_box.home / ".codex" / "config.toml").read_text())
    server_config = config["mcp_servers"]["luftpause"]
    assert server_config == {"url": token_url, "bearer_token_env_var": "LUFTPAUSE_TOKEN"}
    server = only_server(codex_mcp_status(codex_box, env={"LUFTPAUSE_TOKEN": TOKEN}))
    assert set(server["tools"]) == RUNTIME_TOOLS, server
    assert server["authStatus"] == "bearerToken", server

    bare = fresh(codex_box, transcripts)
    assert bare.run("codex", "mcp", "add", "luftpause", "--url", token_url).returncode == 0
    server = only_server(codex_mcp_status(bare, env={"LUFTPAUSE_TOKEN": TOKEN}))
    assert not server["tools"], server
    assert "Auth required" in str(server["toolsError"]), server


def test_codex_cannot_use_a_chat_completions_provider(codex_box: Sandbox) -> None:
    """X5: Codex CLI speaks only the OpenAI Responses API to a model provider; a provider
    with ``wire_api = "chat"`` is refused by Codex itself, which is why the dataplane
    serves ``/v1/responses`` (B9, tests/integration/test_harness_clis.py)."""
    config = codex_box.home / ".codex" / "config.toml"
    config.write_text(
        'model = "llama-3.2-1b"\nmodel_provider = "luftpause"\n'
        + config.read_text()
        + '\n[model_providers.luftpause]\nname = "luftpause"\n'
        'base_url = "http://127.0.0.1:8080/v1"\nenv_key = "LUFTPAUSE_TOKEN"\nwire_api = "chat"\n'
    )
    out = codex_box.run("codex", "mcp", "list")
    assert out.returncode != 0, out.output
    assert '`wire_api = "chat"` is no longer supported' in out.output, out.output
    assert 'set `wire_api = "responses"`' in out.output, out.output


# ----------------------------------------------------------------------------- Gemini CLI


def test_gemini_connects_in_a_trusted_folder(gemini_box: Sandbox, open_url: str) -> None:
    """X5, R1: ``gemini mcp add --transport http --scope user`` writes ``mcpServers.luftpause``
    to ~/.gemini/settings.json; ``gemini mcp list`` shows it connected once the folder is
    trusted (``GEMINI_CLI_TRUST_WORKSPACE=true``), and disabled before."""
    version = gemini_box.run("gemini", "--version")
    assert version.output.strip() == "0.61.0", version.output
    added = gemini_box.run(
        "gemini", "mcp", "add", "--transport", "http", "--scope", "user", "luftpause", open_url
    )
    assert added.returncode == 0 and 'MCP server "luftpause" added' in added.output
    settings = json.loads((gemini_box.home / ".gemini" / "settings.json").read_text())
    assert settings["mcpServers"]["luftpause"] == {"url": open_url, "type": "http"}
    assert settings["telemetry"] == {"enabled": False}, settings

    untrusted = gemini_box.run("gemini", "mcp", "list")
    assert "disabled because this folder is untrusted" in untrusted.output, untrusted.output
    trusted = {"GEMINI_CLI_TRUST_WORKSPACE": "true"}
    assert gemini_status(gemini_box, open_url, env=trusted) == "✓ Connected"


def test_gemini_sends_a_header_from_the_environment(
    gemini_box: Sandbox, token_url: str, transcripts: list[Sandbox]
) -> None:
    """X5, X2: ``-H 'Authorization: Bearer ${LUFTPAUSE_TOKEN}'`` is stored as written and
    expanded by Gemini CLI when it connects; without the header it is disconnected."""
    env = {"GEMINI_CLI_TRUST_WORKSPACE": "true", "LUFTPAUSE_TOKEN": TOKEN}
    added = gemini_box.run(
        "gemini",
        "mcp",
        "add",
        "--transport",
        "http",
        "--scope",
        "user",
        "-H",
        ENV_HEADER,
        "luftpause",
        token_url,
        env=env,
    )
    assert added.returncode == 0, added.output
    settings = json.loads((gemini_box.home / ".gemini" / "settings.json").read_text())
    headers = settings["mcpServers"]["luftpause"]["headers"]
    assert headers == {"Authorization": "Bearer ${LUFTPAUSE_TOKEN}"}, settings
    assert gemini_status(gemini_box, token_url, env=env) == "✓ Connected"

    bare = fresh(gemini_box, transcripts)
    added = bare.run(
        "gemini", "mcp", "add", "--transport", "http", "--scope", "user", "luftpause", token_url
    )
    assert added.returncode == 0, added.output
    assert gemini_status(bare, token_url, env=env) == "✗ Disconnected"
