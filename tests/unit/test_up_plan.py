"""B6: ``luftpause up`` starts ``dataplane.workers`` dataplanes on the one port, each
with its own stable name; a config that asks for workers on port 0 is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from luftpause.config import ConfigError, load_config
from luftpause.up import plan


def test_workers_share_the_port_under_stable_names(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("[dataplane]\nport = 8090\nworkers = 3\n")
    config, _ = load_config(path)
    dataplanes = [p for p in plan(config, path, "INFO") if p.args[0] == "dataplane"]
    assert [p.name for p in dataplanes] == ["dataplane", "dataplane-2", "dataplane-3"]
    idents = [p.args[p.args.index("--dataplane-id") + 1] for p in dataplanes]
    assert [i.rsplit("/", 1)[1] for i in idents] == ["1", "2", "3"]
    assert all(i.rsplit("/", 1)[0].endswith(":8090") for i in idents)
    assert all("--reuse-port" in p.args for p in dataplanes)


def test_one_worker_is_the_plain_dataplane(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("[dataplane]\nport = 8090\n")
    config, _ = load_config(path)
    [dataplane] = [p for p in plan(config, path, "INFO") if p.args[0] == "dataplane"]
    assert "--reuse-port" not in dataplane.args and "--dataplane-id" not in dataplane.args


def test_workers_on_port_zero_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("[dataplane]\nport = 0\nworkers = 2\n")
    with pytest.raises(ConfigError, match="fixed value"):
        load_config(path)
