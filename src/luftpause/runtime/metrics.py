"""The runtime's Prometheus metrics (``GET /metrics``).

Series (all prefixed ``luftpause_runtime_``):

* ``runs{state}`` (gauge): runs by state, read from the run state at scrape time;
* ``approvals_pending`` (gauge): tool calls waiting for the user now;
* ``runs_started_total`` (counter): runs spawned by this process;
* ``turns_total{outcome}`` (counter): model turns, ``ok`` or ``failed``;
* ``tool_calls_total{outcome}`` (counter): ``ok``, ``error`` (the tool answered with
  an error), ``refused`` (unknown tool or arguments that do not fit the schema),
  ``declined`` (the user said no);
* ``journal_fsync_seconds`` (histogram): one write and fsync of ``runs.jsonl``;
* the process collector's ``process_*`` series.

Each :class:`RuntimeMetrics` has its own registry, so several runtimes in one
process (tests) do not share counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from luftpause.runtime.core import RunState, RuntimeState

ToolOutcomeLabel = Literal["ok", "error", "refused", "declined"]
TurnOutcomeLabel = Literal["ok", "failed"]

FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _RunStates(Collector):
    def __init__(self, state: RuntimeState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        counts = {s.value: 0 for s in RunState}
        pending = 0
        for run in self.state.runs.values():
            counts[run.state.value] += 1
            pending += run.pending is not None and not run.done
        runs = GaugeMetricFamily(
            "luftpause_runtime_runs", "Runs known to the runtime, by state", labels=["state"]
        )
        for name, count in counts.items():
            runs.add_metric([name], count)
        yield runs
        yield GaugeMetricFamily(
            "luftpause_runtime_approvals_pending",
            "Sub-agent tool calls waiting for the user's approval",
            value=pending,
        )


class RuntimeMetrics:
    def __init__(self, state: RuntimeState) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_RunStates(state))
        ProcessCollector(registry=self.registry)
        self.runs_started = Counter(
            "luftpause_runtime_runs_started",
            "Runs spawned by this process",
            registry=self.registry,
        )
        self.turns = Counter(
            "luftpause_runtime_turns",
            "Model turns of sub-agents, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "luftpause_runtime_tool_calls",
            "Tool calls of sub-agents, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.journal_fsync = Histogram(
            "luftpause_runtime_journal_fsync_seconds",
            "Time of one write and fsync of runs.jsonl",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        for outcome in ("ok", "failed"):
            self.turns.labels(outcome)
        for outcome in ("ok", "error", "refused", "declined"):
            self.tool_calls.labels(outcome)

    def turn(self, outcome: TurnOutcomeLabel) -> None:
        self.turns.labels(outcome).inc()

    def tool_call(self, outcome: ToolOutcomeLabel) -> None:
        self.tool_calls.labels(outcome).inc()

    def fsync(self, seconds: float) -> None:
        self.journal_fsync.observe(seconds)
