"""Prometheus ``/metrics`` of every service on the real stack as processes (issue 15):
fake engines, scheduler, dataplane, fake tools and runtime. A few turns go through the
dataplane and one sub-agent spawn through the runtime; then each service's exposition is
parsed with ``prometheus_client.parser`` and must hold every listed series, with values
that moved the way the traffic says."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from conftest import Services
from fullstack import MODEL, Stack, eventually, start_stack, write_runtime_config
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families

from luftpause.procs import ServiceProcess

pytestmark = pytest.mark.integration

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]

SCHEDULER_SERIES = [
    "luftpause_scheduler_replica_healthy",
    "luftpause_scheduler_replica_turns_in_flight",
    "luftpause_scheduler_replica_turn_cap",
    "luftpause_scheduler_replica_reserved_turns",
    "luftpause_scheduler_replica_pinned_runs",
    "luftpause_scheduler_replica_batch_turns_in_flight",
    "luftpause_scheduler_replica_batch_pace_limit",
    "luftpause_scheduler_replica_target_pace_seconds",
    "luftpause_scheduler_replica_probe_age_seconds",
    "luftpause_scheduler_engine_requests_running",
    "luftpause_scheduler_engine_requests_waiting",
    "luftpause_scheduler_engine_kv_cache_usage_ratio",
    "luftpause_scheduler_replica_working_set_tokens",
    "luftpause_scheduler_replica_kv_pool_tokens",
    "luftpause_scheduler_prefix_misses_total",
    "luftpause_scheduler_held_turns",
    "luftpause_scheduler_held_callers",
    "luftpause_scheduler_held_oldest_age_seconds",
    "luftpause_scheduler_turns_in_flight",
    "luftpause_scheduler_runs",
    "luftpause_scheduler_callers_in_flight",
    "luftpause_scheduler_dataplanes_lost",
    "luftpause_scheduler_admissions_total",
    "luftpause_scheduler_rejections_total",
    "luftpause_scheduler_drops_total",
    "luftpause_scheduler_runs_forgotten_total",
    "luftpause_scheduler_admission_wait_seconds_bucket",
    "luftpause_scheduler_admission_wait_seconds_count",
    "luftpause_scheduler_admission_wait_seconds_sum",
    "luftpause_scheduler_decide_duration_seconds_bucket",
    "luftpause_scheduler_decide_duration_seconds_count",
    "luftpause_scheduler_decide_duration_seconds_sum",
]
DATAPLANE_SERIES = [
    "luftpause_dataplane_turns_total",
    "luftpause_dataplane_held_seconds_bucket",
    "luftpause_dataplane_held_seconds_count",
    "luftpause_dataplane_held_seconds_sum",
    "luftpause_dataplane_time_to_first_token_seconds_bucket",
    "luftpause_dataplane_time_to_first_token_seconds_count",
    "luftpause_dataplane_time_to_first_token_seconds_sum",
    "luftpause_dataplane_own_seconds_bucket",
    "luftpause_dataplane_own_seconds_count",
    "luftpause_dataplane_own_seconds_sum",
    "luftpause_dataplane_turns_in_flight",
    "luftpause_dataplane_turns_held",
]
RUNTIME_SERIES = [
    "luftpause_runtime_runs",
    "luftpause_runtime_approvals_pending",
    "luftpause_runtime_runs_started_total",
    "luftpause_runtime_turns_total",
    "luftpause_runtime_tool_calls_total",
    "luftpause_runtime_journal_fsync_seconds_bucket",
    "luftpause_runtime_journal_fsync_seconds_count",
    "luftpause_runtime_journal_fsync_seconds_sum",
]
PROCESS_SERIES = [
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_start_time_seconds",
]


async def scrape(base: str) -> Samples:
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.get(f"{base}/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in samples.get(name, {}).items() if want <= set(k))


def missing(samples: Samples, names: list[str]) -> list[str]:
    return [n for n in names if not samples.get(n)]


async def test_every_service_serves_its_listed_series(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 15 (metrics), D10, R1: scheduler, dataplane and runtime each serve Prometheus
    ``/metrics`` that parses and holds every listed series, the process collector's
    included; the counters follow the traffic sent."""
    tmp = tmp_path_factory.mktemp("metrics-all")
    stack: Stack = start_stack(
        services, tmp, engine_args=("--time-scale", "50", "--tool-results", "1")
    )
    tools = services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.05")
    config = write_runtime_config(tmp, stack.dataplane.urls["http"], tools.urls["http"])
    runtime: ServiceProcess = services.start("runtime", "--config", str(config), "--port", "0")
    sched_url = stack.scheduler.urls["http"]
    before = await scrape(sched_url)
    admitted_before = total(before, "luftpause_scheduler_admissions_total")

    async with asyncio.timeout(90):
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as c:
            for i, cls in enumerate(["interactive", "batch", "batch"]):
                resp = await c.post(
                    "/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"hello {i}"}],
                        "max_tokens": 8,
                        "stream": i % 2 == 1,
                    },
                    headers={"x-luftpause-class": cls, "x-luftpause-caller": f"caller-{i}"},
                )
                assert resp.status_code == 200, resp.text
            unknown = await c.post(
                "/chat/completions",
                json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
            )
            assert unknown.status_code == 404
        async with Client(runtime.urls["http"] + "/mcp", mode="auto") as mcp:
            spawned = await mcp.call_tool("spawn", {"task": "count metrics", "tools": ["lookup"]})
            handle = json.loads(spawned.content[0].text)["handle"]  # type: ignore[union-attr]
            awaited = await mcp.call_tool("await", {"handles": [handle], "timeout": 60})
            result = json.loads(awaited.content[0].text)  # type: ignore[union-attr]
    assert result["finished"] and result["results"][0]["state"] == "Completed", result
    spawn_turns = result["results"][0]["turns"]
    assert spawn_turns >= 2  # one tool round, then the answer

    async def settled() -> bool:
        # Turn ends reach the scheduler over the dataplane's report stream, a moment later.
        s = await scrape(sched_url)
        d = await scrape(stack.dataplane.urls["http"])
        return (
            total(s, "luftpause_scheduler_turns_in_flight") == 0
            and total(d, "luftpause_dataplane_turns_in_flight") == 0
        )

    await eventually(settled, timeout=10, what="no turn in flight")
    sched, dp, rt = (
        await scrape(sched_url),
        await scrape(stack.dataplane.urls["http"]),
        await scrape(runtime.urls["http"]),
    )
    assert missing(sched, SCHEDULER_SERIES + PROCESS_SERIES) == []
    assert missing(dp, DATAPLANE_SERIES + PROCESS_SERIES) == []
    assert missing(rt, RUNTIME_SERIES + PROCESS_SERIES) == []
    for samples in (sched, dp):
        assert not [n for n in samples if n.endswith("_created")]

    # Scheduler: every turn sent was admitted once, none dropped; the unknown model never
    # reached it (the dataplane knows the configured models and rejects it first).
    admitted = total(sched, "luftpause_scheduler_admissions_total") - admitted_before
    assert admitted == 3 + spawn_turns
    assert total(sched, "luftpause_scheduler_admissions_total", service_class="interactive") >= 2
    assert total(sched, "luftpause_scheduler_rejections_total") == 0
    assert total(sched, "luftpause_scheduler_drops_total") == 0
    assert total(sched, "luftpause_scheduler_admission_wait_seconds_count") >= admitted
    assert total(sched, "luftpause_scheduler_decide_duration_seconds_count", event="turn_requested")
    assert total(sched, "luftpause_scheduler_replica_healthy") == 2
    assert total(sched, "luftpause_scheduler_turns_in_flight") == 0
    assert total(sched, "luftpause_scheduler_held_turns") == 0
    kv = sched["luftpause_scheduler_engine_kv_cache_usage_ratio"].values()
    assert all(0 <= v <= 1 for v in kv)
    assert total(sched, "process_resident_memory_bytes") > 0

    # Dataplane: the same turns ended (the spawn's tool rounds as paused_on_tool), the
    # unknown model as rejected.
    ended = total(dp, "luftpause_dataplane_turns_total", outcome="finished") + total(
        dp, "luftpause_dataplane_turns_total", outcome="paused_on_tool"
    )
    assert ended == 3 + spawn_turns
    assert total(dp, "luftpause_dataplane_turns_total", outcome="paused_on_tool") >= 1
    assert total(dp, "luftpause_dataplane_turns_total", outcome="rejected") == 1
    assert total(dp, "luftpause_dataplane_held_seconds_count") >= 3 + spawn_turns
    assert total(dp, "luftpause_dataplane_time_to_first_token_seconds_count") >= 3
    assert total(dp, "luftpause_dataplane_own_seconds_count") == ended  # each reached its engine
    assert total(dp, "luftpause_dataplane_turns_in_flight") == 0
    assert total(dp, "process_resident_memory_bytes") > 0

    # Runtime: one run started and completed, its turns and tool call counted.
    assert total(rt, "luftpause_runtime_runs_started_total") == 1
    assert total(rt, "luftpause_runtime_runs", state="Completed") == 1
    assert total(rt, "luftpause_runtime_turns_total", outcome="ok") == spawn_turns
    assert total(rt, "luftpause_runtime_tool_calls_total", outcome="ok") >= 1
    assert total(rt, "process_resident_memory_bytes") > 0
