"""The load generator's SGLang Model Gateway headers: x-smg-priority by class and the run ID
as a sticky-session routing key (``--smg-priority``, ``--routing-key-header``)."""

from __future__ import annotations

import argparse

import pytest

from luftpause.loadgen.agents import AgentOptions, run_headers
from luftpause.loadgen.main import add_arguments, parse_smg_priority
from luftpause.measure.mix import Group


def test_smg_priority_flag() -> None:
    assert parse_smg_priority("interactive=interactive,batch=bulk") == {
        "interactive": "interactive",
        "batch": "bulk",
    }
    assert parse_smg_priority(" batch = Default ") == {"batch": "default"}
    for bad in ("gold=bulk", "batch=urgent", "batch", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_smg_priority(bad)


def test_flags_reach_the_options() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        ["--smg-priority", "interactive=interactive,batch=bulk", "--routing-key-header", "x-k"]
    )
    assert args.smg_priority == {"interactive": "interactive", "batch": "bulk"}
    assert args.routing_key_header == "x-k"
    defaults = p.parse_args([])
    assert defaults.smg_priority is None and defaults.routing_key_header == ""


def test_headers_per_class_and_run() -> None:
    people = Group("people", 4, "interactive", "people")
    crowd = Group("crowd", 48, "batch", "crowd")
    smg = AgentOptions(
        model="m",
        class_headers=False,
        smg_priority={"interactive": "interactive", "batch": "bulk"},
        routing_key_header="x-smg-routing-key",
    )
    assert run_headers(people, "run-1", 3, smg) == {
        "x-fake-tool-results": "3",
        "x-smg-priority": "interactive",
        "x-smg-routing-key": "run-1",
    }
    assert run_headers(crowd, "run-2", 2, smg)["x-smg-priority"] == "bulk"
    # Without the options: exactly the headers sent before they existed.
    plain = AgentOptions(model="m")
    assert run_headers(crowd, "run-3", 3, plain) == {
        "x-fake-tool-results": "3",
        "x-luftpause-run-id": "run-3",
        "x-luftpause-class": "batch",
        "x-luftpause-caller": "crowd",
    }
    assert run_headers(crowd, "run-3", 3, AgentOptions(model="m", class_headers=False)) == {
        "x-fake-tool-results": "3"
    }
