"""The reference pages generated from the code (``tools/gen_docs.py``) cover all of it, and
its ``--check`` catches a stale page. No behaviour IDs: this guards the documentation."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import typing
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from luftpause import cli, config

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gen_docs.py"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module


def _models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found = {model}
    for info in model.model_fields.values():
        for kind in _walk(info.annotation):
            if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in found:
                found |= _models(kind)
    return found


def _walk(annotation: object) -> list[object]:
    return [annotation, *(x for arg in typing.get_args(annotation) for x in _walk(arg))]


def test_every_configuration_key_is_described_and_on_the_page(gen: ModuleType) -> None:
    page = gen.configuration_page()
    for model in _models(config.StackConfig) - {config.StackConfig}:
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no docstring"
            assert f"| `{name}` |" in page, f"{model.__name__}.{name} is not on the page"


def test_every_command_and_option_is_on_the_cli_page(gen: ModuleType) -> None:
    page = gen.cli_page()
    for command in cli.COMMANDS:
        if not cli.available(command):
            continue
        assert f"## `luftpause {command.name}`" in page
    # One command's options, checked against its own parser.
    module = importlib.import_module("luftpause.sim.main")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    for action in parser._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}" in page, f"luftpause sim {flag} is not on the page"


def test_metrics_page_lists_each_services_families_with_their_labels(gen: ModuleType) -> None:
    page = gen.metrics_page()
    assert "| `luftpause_dataplane_turns_total` | counter | `service_class`, `outcome` |" in page
    assert "| `luftpause_scheduler_replica_turn_cap` | gauge | `replica` |" in page
    assert "`luftpause_runtime_journal_fsync_seconds`" in page


def test_grpc_page_names_every_rpc_with_its_comment(gen: ModuleType) -> None:
    page = gen.grpc_page()
    for rpc in ("Admit", "Report", "RunEnded", "Resync", "Link"):
        assert f"| `{rpc}` |" in page
    assert "Cancelling the call means the turn was abandoned" in page


def test_check_names_a_stale_page_and_passes_a_current_one(
    gen: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gen, "OUT", tmp_path)
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    page = tmp_path / "configuration.md"
    page.write_text(page.read_text().replace("`initial_cap`", "`first_cap`"))
    assert gen.main(["--check"]) == 1
    assert "configuration.md" in capsys.readouterr().err
