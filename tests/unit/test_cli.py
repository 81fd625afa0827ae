"""The luftpause command line: help that helps, clear errors for bad config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_the_services() -> None:
    out = run("--help")
    assert out.returncode == 0
    for name in ("up", "scheduler"):
        assert name in out.stdout


def test_scheduler_help_documents_its_flags() -> None:
    out = run("scheduler", "--help")
    assert out.returncode == 0
    for flag in ("--config", "--port", "--http-port", "--ready-file", "--host"):
        assert flag in out.stdout


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[scheduler]\ngrpc_port = "five"\n')
    for cmd in ("scheduler", "up"):
        out = run(cmd, "--config", str(bad))
        assert out.returncode == 2
        assert "scheduler.grpc_port" in out.stderr and str(bad) in out.stderr
        assert "Traceback" not in out.stderr


def test_no_command_prints_help() -> None:
    out = run()
    assert out.returncode == 2 and "COMMAND" in out.stdout


def test_bad_numbers_are_argparse_errors_naming_the_value() -> None:
    """Bad input gets a clear error naming the problem, never a traceback."""
    for args in (
        ["fake-engine", "--time-scale", "0"],
        ["fake-mcp", "--lookup-delay-s", "-1"],
        ["fake-engine", "--max-running", "many"],
        ["loadgen", "--duration-s", "inf"],
    ):
        out = run(*args)
        assert out.returncode == 2, args
        assert "expected" in out.stderr and repr(args[-1]) in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
