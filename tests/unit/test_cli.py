"""The luftpause command line: help that helps, clear errors for bad config."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from luftpause import cli

DOCKER = Path(__file__).resolve().parents[2] / "docker"


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


def test_check_summarises_a_usable_config_and_starts_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """X3: `--check` loads and validates what the service would, prints where it listens
    and what it serves, and exits 0 without binding a port (the one it names is taken)."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main rewrites it
    stack = str(DOCKER / "stack.toml")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = str(taken.getsockname()[1])
        rc = cli.main(["scheduler", "--config", stack, "--port", port, "--check"], environ={})
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"{stack} is usable" in out.out and f"gRPC {port}, status HTTP 5001" in out.out
    for name in ("engine-a", "engine-b", "classifier", "llama-3.2-1b", "auth         OFF"):
        assert name in out.out
    env = {"LUFTPAUSE_TOKEN": "t", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"}
    for cmd in ("dataplane", "runtime"):
        assert cli.main([cmd, "--config", stack, "--check"], environ=env) == 0
        out = capsys.readouterr()
        assert "is usable" in out.out and "auth         required" in out.out
        assert "http/protobuf to http://jaeger:4318/v1/traces" in out.out
        if cmd == "dataplane":  # B9, B4: the alias map and where runs come from
            assert "aliases      claude-* -> llama-3.2-1b, gpt-* -> llama-3.2-1b" in out.out
            assert "sessions     Claude Code, Codex, then x-session-affinity" in out.out
    assert "--check" in run("runtime", "--help").stdout


def test_check_shows_an_endpoint_that_takes_images(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """X3, B9: `--check` says which endpoints have vision = true."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main rewrites it
    config = tmp_path / "stack.toml"
    config.write_text(
        '[[endpoints]]\nname = "eyes"\nurl = "http://127.0.0.1:1"\nmodels = ["vlm"]\n'
        "vision = true\n"
        '[[endpoints]]\nname = "blind"\nurl = "http://127.0.0.1:2"\nmodels = ["llm"]\n'
    )
    assert cli.main(["dataplane", "--config", str(config), "--check"], environ={}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("vision (takes images)" in line for line in lines) == 1
    assert any("models vlm;" in line and "vision (takes images)" in line for line in lines)


def test_check_reports_every_missing_variable_and_bad_flag() -> None:
    """X3: a config that names unset variables, a missing API key or a bad flag is
    reported in full on stderr, exit 2, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "RUNPOD_"))}
    out = run_env(env, "dataplane", "--config", str(DOCKER / "ollama.toml"), "--check")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "endpoints[0].models[0]: environment variable OLLAMA_MODEL is not set" in out.stderr
    assert "runtime.default_model" in out.stderr

    env.update(RUNPOD_POD_ID="p", RUNPOD_MODEL="m")
    runpod = ["--config", str(DOCKER / "runpod.toml")]
    out = run_env(env, "dataplane", *runpod, "--port", "70000", "--check")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "RUNPOD_API_KEY" in out.stderr and "--port 70000" in out.stderr
    out = run("dataplane", "--dataplane-id", "a\tb", "--check")
    assert out.returncode == 2 and "--dataplane-id must be" in out.stderr


def test_check_never_shows_a_key_and_checks_the_runtimes_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """X3, S8: the summary says a named key is set, never its value; the runtime needs no
    engine key, and its own flags are validated like its config."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    env = {"RUNPOD_POD_ID": "p", "RUNPOD_MODEL": "m", "RUNPOD_API_KEY": "sk-secret-value"}
    runpod = ["--config", str(DOCKER / "runpod.toml")]
    assert cli.main(["dataplane", *runpod, "--check"], environ=env) == 0
    out = capsys.readouterr().out
    assert "$RUNPOD_API_KEY (set)" in out and "sk-secret-value" not in out
    del env["RUNPOD_API_KEY"]
    assert cli.main(["runtime", *runpod, "--check"], environ=env) == 0
    capsys.readouterr()
    rc = cli.main(["runtime", *runpod, "--dataplane-url", "ftp://x", "--check"], environ=env)
    err = capsys.readouterr().err
    assert rc == 2 and "dataplane_url" in err and "ftp://x" in err


def run_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("service", "flag", "value"),
    [("scheduler", "--port", "70000"), ("scheduler", "--link-port", "65536"),
     ("scheduler", "--http-port", "-1"), ("fake-engine", "--port", "99999")],
)  # fmt: skip
def test_a_port_out_of_range_is_refused_before_anything_starts(
    service: str, flag: str, value: str
) -> None:
    """X3: a port number outside 0..65535 is an error naming the flag (the kernel would
    otherwise take it modulo 65536 and listen somewhere else); exit 2, no traceback."""
    out = run(service, flag, value)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{flag} {value} is not a port number" in out.stderr


def test_check_reads_the_callers_keys_as_the_services_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B13: --check of the dataplane and the runtime loads the callers' keys (never shown)
    and refuses what the service would refuse at start: no token, an unset key."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    stack = tmp_path / "stack.toml"
    stack.write_text('[[callers]]\nname = "alice"\nkey_env = "ALICE_KEY"\n')
    key = "lp_alice-check-0123456789abcdef"
    env = {"LUFTPAUSE_TOKEN": "service-token-0123", "ALICE_KEY": key}
    for service in ("dataplane", "runtime"):
        assert cli.main([service, "--config", str(stack), "--check"], environ=env) == 0
        out = capsys.readouterr().out
        assert "callers      1 (alice); 1 keys" in out and key not in out
    assert cli.main(["runtime", "--config", str(stack), "--check"], environ={"ALICE_KEY": key}) == 2
    assert "needs LUFTPAUSE_TOKEN" in capsys.readouterr().err
    env = {"LUFTPAUSE_TOKEN": "service-token-0123"}
    assert cli.main(["dataplane", "--config", str(stack), "--check"], environ=env) == 2
    assert "ALICE_KEY is not set" in capsys.readouterr().err
