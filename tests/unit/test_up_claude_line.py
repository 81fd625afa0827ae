"""X2, X5: the ``claude mcp add`` line ``luftpause up`` prints."""

from __future__ import annotations

import shlex

import pytest

from luftpause.up import claude_mcp_add, claude_via

URL = "http://127.0.0.1:7000/mcp"


def test_without_a_token_no_header() -> None:
    assert claude_mcp_add(URL, None) == f"claude mcp add --transport http luftpause {URL}"
    assert claude_mcp_add(URL, "") == f"claude mcp add --transport http luftpause {URL}"


def test_with_a_token_the_header_comes_after_the_url() -> None:
    """X2: the token goes as ``--header "Authorization: Bearer <token>"``, after the URL
    (Claude Code's -H/--header is variadic: before the name it would swallow name and URL)."""
    line = claude_mcp_add(URL, "s3cret-token_1.2")
    assert line == (
        f"claude mcp add --transport http luftpause {URL} "
        '--header "Authorization: Bearer s3cret-token_1.2"'
    )


@pytest.mark.parametrize("token", ['a"b', "a$b", "a`b", "a\\b", "a!b", "a'b", "a b"])
def test_any_token_survives_the_shell(token: str) -> None:
    """X2: whatever the token holds, the shell hands Claude Code exactly that header."""
    words = shlex.split(claude_mcp_add(URL, token))
    assert words[-2:] == ["--header", f"Authorization: Bearer {token}"]
    assert words[:6] == ["claude", "mcp", "add", "--transport", "http", "luftpause"]
    assert words[6] == URL


@pytest.mark.parametrize("token", [None, "s3cret", 'a"b c$d'])
def test_claude_through_the_proxy_line(token: str | None) -> None:
    """B9, D9: the line that runs Claude Code with its model turns through the dataplane
    sets its base URL and sends the token (or anything, without one) as its API key."""
    words = shlex.split(claude_via("http://127.0.0.1:8080", token))
    assert words == [
        "ANTHROPIC_BASE_URL=http://127.0.0.1:8080",
        f"ANTHROPIC_API_KEY={token or 'unused'}",
        "claude",
    ]
