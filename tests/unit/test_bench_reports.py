"""The bench scripts' reports are functions of their saved results: each renders a stored
JSON fixture (tests/data/bench, cut from docs/benchmarks/results) to the stored report
bytes, which the scripts wrote before their report code moved into its own module
(flood_report), so the move changed no byte; the overhead benchmark's fixture is its
archived JSON with the settings, machine and command line its run printed, and its
expected bytes are that run's whole printed output. A report re-renders from the same
data exactly (``--report-from``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.bench import callers, first_minute, flood, flood_report, overhead

DATA = Path(__file__).resolve().parents[1] / "data" / "bench"
FLOODS = ("flood-own", "flood-light", "flood-coding", "flood-mcp")


def _saved(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return loaded


@pytest.mark.parametrize("name", FLOODS)
def test_a_flood_report_renders_its_saved_run_byte_for_byte(name: str) -> None:
    """The Markdown of own-loop (SMG caps, luftpause targets, vLLM router arms), light,
    routing, fan-out, MCP and coding floods, and the frontier SVG where there is one."""
    data = _saved(name)
    rendered = f"python tools/bench/flood.py --report-from {name}.json"
    assert flood_report.render(data, rendered=rendered) == (DATA / f"{name}.md").read_text()
    svg = DATA / f"{name}.svg"
    plot = flood_report.render_plot(data)
    assert plot == (svg.read_text() if svg.exists() else None)


def test_report_from_writes_the_report_and_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flood.py --report-from FILE.json --out --plot``: the saved run's report and plot,
    the same bytes as rendering it; a run saved without ``machine`` gets this one's."""
    data = _saved("flood-own")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(data))
    out, plot = tmp_path / "run.md", tmp_path / "run.svg"
    argv = ["--report-from", str(saved), "--out", str(out), "--plot", str(plot)]
    monkeypatch.setattr(sys, "argv", ["flood.py", *argv])
    assert flood.main() == 0
    command = "python tools/bench/flood.py " + " ".join(argv)
    assert out.read_text() == flood_report.render(data, rendered=command)
    assert plot.read_text() == flood_report.render_plot(data)
    del data["machine"]
    saved.write_text(json.dumps(data))
    assert flood.main() == 0
    assert f"- machine: {flood_report.machine()};" in out.read_text()


def test_the_callers_report_renders_its_saved_run_byte_for_byte() -> None:
    assert callers.report(_saved("callers")) == (DATA / "callers.md").read_text()


def test_the_first_minute_table_renders_its_saved_run_byte_for_byte() -> None:
    assert first_minute.render(_saved("first-minute")) == (DATA / "first-minute.md").read_text()


def test_the_overhead_report_renders_its_saved_run_byte_for_byte() -> None:
    """The dataplane's overhead benchmark (run of 2026-12-06: its JSON with the settings,
    machine and command line that run printed) renders to that run's printed output."""
    assert overhead.render(_saved("overhead")) == (DATA / "overhead.md").read_text()


def test_overhead_report_from_prints_the_saved_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``overhead.py --report-from FILE.json`` prints the saved run's report and starts
    nothing; a run saved before the JSON kept its settings, machine and command gets the
    plan its figures show, the command that runs it and this machine's cores."""
    data = _saved("overhead")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(data))
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--report-from", str(saved)])
    assert overhead.main() == 0
    assert capsys.readouterr().out == (DATA / "overhead.md").read_text()
    settings = data.pop("settings")
    del data["machine"], data["command"]
    saved.write_text(json.dumps(data))
    assert overhead.main() == 0
    text = capsys.readouterr().out
    assert overhead.saved_settings(data) == settings
    assert text.startswith("Command: python tools/bench/overhead.py\n\n")
    assert "## Throughput (64 concurrent streams, 10 s per arm, 3 repetitions)" in text
    assert f"Machine: {overhead.this_machine()['cores']} cores;" in text


def test_overhead_report_from_a_file_that_is_not_a_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"latency": {}}))
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--report-from", str(saved)])
    with pytest.raises(SystemExit) as exit_:
        overhead.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--report-from {saved}: not a saved run (KeyError" in err
    assert "Traceback" not in err
