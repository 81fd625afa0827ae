"""X2, H3: ``luftpause loadgen --token``: where the token comes from, and how a refusal
reads."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from luftpause.loadgen import main as loadgen_main
from luftpause.loadgen.agents import auth_headers
from luftpause.loadgen.pool import TokenRefused


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadgen_main.add_arguments(parser)
    return parser.parse_args(["--target", "http://127.0.0.1:1", "--agents", "1", *argv])


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The token run_load is given (the load itself does not run)."""
    tokens: list[str | None] = []

    async def fake_run_load(
        args: argparse.Namespace,
        groups: Any,
        stderr: Any,
        token: str | None = None,
        trace: Any = None,
    ) -> dict[str, Any]:
        tokens.append(token)
        raise loadgen_main.MixError("stop here")

    monkeypatch.setattr(loadgen_main, "run_load", fake_run_load)
    return tokens


def test_the_token_comes_from_the_flag_else_the_environment(
    seen: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """X2: --token wins; without it LUFTPAUSE_TOKEN (read by the command, not the library);
    --token '' sends none."""
    monkeypatch.setenv("LUFTPAUSE_TOKEN", "from-env")
    assert parse().token is None  # the parser does not read the environment
    for argv, expected in (
        ((), "from-env"),
        (("--token", "flag"), "flag"),
        (("--token", ""), None),
    ):
        assert loadgen_main.main(parse(*argv)) == 2
        assert seen.pop() == expected
    monkeypatch.delenv("LUFTPAUSE_TOKEN")
    assert loadgen_main.main(parse()) == 2
    assert seen.pop() is None


def test_auth_headers() -> None:
    assert auth_headers("t") == {"Authorization": "Bearer t"}
    assert auth_headers(None) == {} and auth_headers("") == {}


def test_refusal_messages() -> None:
    """X2: one line naming the service, its URL and the fix."""
    url = "http://127.0.0.1:8080/v1"
    assert str(TokenRefused("dataplane", url, token_sent=True)) == (
        f"the dataplane at {url} refused the token (401): set --token or LUFTPAUSE_TOKEN"
    )
    assert str(TokenRefused("runtime", url, token_sent=False)) == (
        f"the runtime at {url} requires a token (401): set --token or LUFTPAUSE_TOKEN"
    )


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (
            TokenRefused("runtime", "http://r/mcp", True),
            "luftpause loadgen: the runtime at http://r/mcp refused the token (401): "
            "set --token or LUFTPAUSE_TOKEN\n",
        ),
        (
            ExceptionGroup("tg", [ExceptionGroup("tg", [TokenRefused("runtime", "u", False)])]),
            "luftpause loadgen: the runtime at u requires a token (401): "
            "set --token or LUFTPAUSE_TOKEN\n",
        ),
        (
            ExceptionGroup("tg", [ConnectionError("refused"), ConnectionError("refused")]),
            "luftpause loadgen: could not start: ConnectionError('refused')\n",
        ),
    ],
)
def test_failures_to_start_are_one_line(
    raised: Exception,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """H3: what stops the load before it starts is one line on stderr, exit 2 - also when it
    comes wrapped in (nested) exception groups."""

    async def fake_run_load(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise raised

    monkeypatch.setattr(loadgen_main, "run_load", fake_run_load)
    assert loadgen_main.main(parse()) == 2
    captured = capsys.readouterr()
    assert captured.err == line and captured.out == ""
