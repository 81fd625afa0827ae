"""X3: the stack files for your own engine without Docker (``examples/stacks``) are
usable as their comments say: each passes every service's ``--check`` with the
environment its comment names, and says which variable is missing without it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from luftpause import cli
from luftpause.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
STACKS = ROOT / "examples" / "stacks"
# What each file's header tells a user to set (None: every variable has a default).
ENV = {
    "ollama.toml": {"OLLAMA_MODEL": "llama3.2:1b"},
    "sglang.toml": {},
    "vllm.toml": {
        "VLLM_URL": "https://abc123-8000.proxy.runpod.net",
        "VLLM_MODEL": "Qwen/Qwen3-8B",
        "VLLM_API_KEY": "k",
    },
}


def test_every_stack_file_is_listed() -> None:
    assert {p.name for p in STACKS.glob("*.toml")} == set(ENV)


@pytest.mark.parametrize("name", sorted(ENV))
@pytest.mark.parametrize("service", ["scheduler", "dataplane", "runtime"])
def test_stack_file_passes_the_services_check(
    name: str, service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """X3: the command in the file's header starts services that accept it."""
    path = STACKS / name
    header = path.read_text()
    assert f"make run CONFIG=examples/stacks/{name}" in header
    rc = cli.main([service, "--config", str(path), "--check"], environ=ENV[name])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "is usable" in out.out


@pytest.mark.parametrize("name", sorted(ENV))
def test_stack_file_runs_no_fake_engine_and_names_its_variables(name: str) -> None:
    """X3: the replicas are the user's engines (no fake engine is started), the runtime
    has the fake tools it names, and every ``${VAR}`` without a default is reported by
    name when unset."""
    config, _ = load_config(STACKS / name, ENV[name])
    assert not config.fakes.engines and config.fakes.mcp is not None
    assert all(not e.url.startswith("http://127.0.0.1:80") for e in config.endpoints)
    required = set(re.findall(r"\$\{([A-Z_]+)\}", (STACKS / name).read_text()))
    if not required:
        load_config(STACKS / name, {})
        return
    with pytest.raises(ConfigError) as missing:
        load_config(STACKS / name, {})
    for variable in required:
        assert variable in str(missing.value)
