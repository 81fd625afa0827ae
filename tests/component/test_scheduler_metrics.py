"""The scheduler's Prometheus metrics: a host driven in process with events, on a clock the
test moves, read through ``GET /metrics`` of its status app and parsed with
``prometheus_client.parser`` (values, not only names)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from _clock import Clock
from prometheus_client.parser import text_string_to_metric_families

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    EndpointKind,
    Params,
    Reject,
    ReplicaProbed,
    ReplicaSpec,
    RunEnded,
    ServiceClass,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    initial_state,
)
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.metrics import EVENT_TYPES, event_label
from luftpause.scheduler.service.status_http import status_app

SPECS = (
    ReplicaSpec("a", EndpointKind.GENERATIVE, frozenset({"m"})),
    ReplicaSpec("b", EndpointKind.GENERATIVE, frozenset({"m"})),
)
P = "luftpause_scheduler_"
Labels = tuple[tuple[str, str], ...]


@dataclass
class Sched:
    host: Host
    clock: Clock
    writer: asyncio.Task[None]
    http: httpx.AsyncClient

    async def probe(
        self,
        replica: str,
        running: int | None = None,
        waiting: int | None = None,
        kv: float | None = None,
        healthy: bool = True,
        kv_tokens: int | None = None,
    ) -> None:
        await self.host.apply(
            lambda at: ReplicaProbed(
                at=at,
                replica=replica,
                healthy=healthy,
                kv_tokens=kv_tokens,
                running=running,
                waiting=waiting,
                kv_usage=kv,
            )
        )

    def request(
        self, turn: str, run: str, cls: ServiceClass = ServiceClass.BATCH, caller: str = "c"
    ) -> asyncio.Task[Admit | Reject]:
        return asyncio.ensure_future(
            self.host.admit(
                turn,
                lambda at: TurnRequested(
                    at=at, turn_id=turn, run_id=run, model="m", service_class=cls, caller=caller
                ),
            )
        )

    async def admit(self, turn: str, run: str, **kw: object) -> Admit:
        out = await asyncio.wait_for(self.request(turn, run, **kw), 5)  # type: ignore[arg-type]
        assert isinstance(out, Admit), out
        return out

    async def finish(self, turn: str) -> None:
        await self.host.apply(lambda at: TurnStarted(at=at, turn_id=turn))
        await self.host.apply(lambda at: TurnFinished(at=at, turn_id=turn, prompt_tokens=10))

    async def scrape(self) -> dict[str, dict[Labels, float]]:
        """Samples by name, then by sorted label pairs."""
        resp = await self.http.get("/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain; version=")
        out: dict[str, dict[Labels, float]] = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return out


QUEUE_CAPS = Params(queue_probes=1)  # one probe with a queue sets the cap


async def start(params: Params = QUEUE_CAPS) -> Sched:
    clock = Clock()
    host = Host(initial_state(SPECS, params, clock()), clock)
    writer = asyncio.create_task(host.run())
    app = status_app(host, clock, dict)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sched")
    return Sched(host, clock, writer, http)


@pytest.fixture
async def sched() -> AsyncIterator[Sched]:
    s = await start()
    yield s
    await s.http.aclose()
    s.writer.cancel()
    await asyncio.gather(s.writer, return_exceptions=True)


def one(samples: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    return samples[P + name][tuple(sorted(labels.items()))]


async def test_replica_gauges_follow_probes_and_admissions(sched: Sched) -> None:
    """S2, S9, S12: per replica health, in-flight turns, cap (+Inf while not limited), the
    engine's running/waiting/KV usage from the last probe and the probe's age."""
    before = await sched.scrape()
    assert one(before, "replica_healthy", replica="a") == 0  # unknown until probed
    assert P + "engine_requests_running_total" not in before
    assert before.get(P + "engine_requests_running", {}) == {}  # no load reported yet
    await sched.probe("a", running=2, waiting=3, kv=0.75, kv_tokens=50_000)  # capped at 2
    await sched.probe("b")  # reports no load: not limited
    await sched.admit("t1", "r1")
    await sched.admit("t2", "r2")
    sched.clock.now += 4.0
    m = await sched.scrape()
    assert one(m, "replica_healthy", replica="a") == 1
    assert one(m, "replica_turn_cap", replica="a") == 2
    assert math.isinf(one(m, "replica_turn_cap", replica="b"))
    assert sum(m[P + "replica_batch_turns_in_flight"].values()) == 2
    assert math.isinf(one(m, "replica_batch_pace_limit", replica="a"))  # decode pace: none
    assert m.get(P + "replica_reply_pace_seconds", {}) == {}  # no reply streamed yet
    # B7: the target (the default 100 ms: no reply has shown a floor) and its cost: a
    # capped replica with no interactive run withholds nothing; one without a cap: absent
    assert one(m, "replica_target_pace_seconds", replica="a") == pytest.approx(0.1)
    assert one(m, "replica_batch_withheld_by_target", replica="a") == 0
    assert ("replica", "b") not in {k[0] for k in m[P + "replica_batch_withheld_by_target"]}
    assert sum(m[P + "replica_turns_in_flight"].values()) == 2
    assert one(m, "engine_requests_running", replica="a") == 2
    assert one(m, "engine_requests_waiting", replica="a") == 3
    assert one(m, "engine_kv_cache_usage_ratio", replica="a") == 0.75
    # B5: the engine's pool (absent where unknown) and the working set of its runs (two
    # runs whose first turns run: no context known yet)
    assert one(m, "replica_kv_pool_tokens", replica="a") == 50_000
    assert ("replica", "b") not in {k[0] for k in m.get(P + "replica_kv_pool_tokens", {})}
    assert one(m, "replica_working_set_tokens", replica="a") == 0
    assert ("replica", "b") not in {k[0] for k in m[P + "engine_requests_running"]}
    assert one(m, "replica_probe_age_seconds", replica="a") == pytest.approx(4.0)
    assert one(m, "turns_in_flight", service_class="batch") == 2
    assert one(m, "turns_in_flight", service_class="interactive") == 0
    assert one(m, "callers_in_flight") == 1
    assert one(m, "runs", phase="generating", service_class="batch") == 2
    assert sum(m[P + "replica_pinned_runs"].values()) == 2
    assert one(m, "prefix_misses_total", replica="a") == 0
    assert one(m, "dataplanes_lost") == 0
    assert sum(m[P + "dataplane_turns_in_flight"].values()) == 2  # B6: by dataplane


async def test_held_turns_by_class_callers_and_oldest_age(sched: Sched) -> None:
    """S4, S5, S12: held turns and distinct held callers per class (callers are counted,
    never labels), the oldest held turn's age; admissions and their wait once slots free."""
    await sched.probe("a", running=1, waiting=5)
    await sched.probe("b", running=1, waiting=5)
    await sched.admit("t1", "r1")
    await sched.admit("t2", "r2")
    m = await sched.scrape()
    assert one(m, "admissions_total", replica="a", service_class="batch") == 1
    assert one(m, "admissions_total", replica="b", service_class="batch") == 1
    assert one(m, "admission_wait_seconds_count", service_class="batch") == 2
    assert one(m, "admission_wait_seconds_sum", service_class="batch") == 0
    assert one(m, "held_oldest_age_seconds", service_class="batch") == 0  # none held

    held = [sched.request("h1", "r3", caller="alice")]
    await sched.host.apply(lambda at: ClockTicked(at=at))  # h1 is stamped at this time
    sched.clock.now += 2.0
    held += [
        sched.request("h2", "r4", caller="alice"),
        sched.request("h3", "r5", caller="bob"),
        sched.request("h4", "r6", ServiceClass.INTERACTIVE, caller="carol"),
    ]
    await sched.host.apply(lambda at: ClockTicked(at=at))
    assert len(sched.host.state.held) == 4
    sched.clock.now += 3.0
    m = await sched.scrape()
    assert one(m, "held_turns", service_class="batch") == 3
    assert one(m, "held_callers", service_class="batch") == 2
    assert one(m, "held_turns", service_class="interactive") == 1
    assert one(m, "held_callers", service_class="interactive") == 1
    assert one(m, "held_oldest_age_seconds", service_class="batch") == pytest.approx(5.0)
    assert one(m, "held_oldest_age_seconds", service_class="interactive") == pytest.approx(3.0)

    # A freed slot admits the interactive turn first (S4), after 3 s held.
    await sched.finish("t1")
    admitted = await asyncio.wait_for(held[3], 5)
    assert isinstance(admitted, Admit) and admitted.held_s == pytest.approx(3.0)
    m = await sched.scrape()
    assert one(m, "held_turns", service_class="interactive") == 0
    assert one(m, "held_callers", service_class="interactive") == 0
    assert one(m, "admission_wait_seconds_count", service_class="interactive") == 1
    assert one(m, "admission_wait_seconds_sum", service_class="interactive") == pytest.approx(3.0)
    assert one(m, "admission_wait_seconds_bucket", service_class="interactive", le="2.5") == 0
    assert one(m, "admission_wait_seconds_bucket", service_class="interactive", le="5.0") == 1
    admissions = sum(v for v in m[P + "admissions_total"].values())
    assert admissions == 3
    for task in held[:3]:
        task.cancel()
    await asyncio.gather(*held[:3], return_exceptions=True)


async def test_rejections_drops_and_forgotten_runs_by_reason() -> None:
    """S6, S10: rejections by reason, drops by reason (expired turns), forgotten runs; every
    reason is exported from the start (at 0)."""
    s = await start(Params(turn_timeout_s=10.0, run_idle_expiry_s=20.0))
    try:
        m = await s.scrape()
        for reason in ("unknown_model", "invalid_request"):
            assert one(m, "rejections_total", reason=reason) == 0
        for reason in ("expired", "released"):
            assert one(m, "drops_total", reason=reason) == 0
        assert one(m, "runs_forgotten_total") == 0
        await s.probe("a")
        await s.probe("b")
        unknown = await s.host.admit(
            "x1", lambda at: TurnRequested(at=at, turn_id="x1", run_id="rx", model="nope")
        )
        invalid = await s.host.admit(
            "x2", lambda at: TurnRequested(at=at, turn_id="x2", run_id="", model="m")
        )
        assert isinstance(unknown, Reject) and isinstance(invalid, Reject)
        await s.admit("t1", "r1")  # never reported: dropped after the turn timeout
        await s.admit("t2", "r2")
        await s.finish("t2")  # idle: forgotten after the run expiry
        s.clock.now += 11.0
        await s.host.apply(lambda at: ClockTicked(at=at))
        s.clock.now += 30.0
        await s.host.apply(lambda at: ClockTicked(at=at))
        m = await s.scrape()
        assert one(m, "rejections_total", reason="unknown_model") == 1
        assert one(m, "rejections_total", reason="invalid_request") == 1
        assert one(m, "drops_total", reason="expired") == 1
        assert one(m, "drops_total", reason="released") == 0
        assert one(m, "runs_forgotten_total") == 2
        assert len(s.host.state.runs) == 0 and len(s.host.state.turns) == 0
    finally:
        await s.http.aclose()
        s.writer.cancel()
        await asyncio.gather(s.writer, return_exceptions=True)


async def test_a_re_sent_admit_is_not_counted_again(sched: Sched) -> None:
    """S11: a dataplane that re-sends Admit for an admitted turn gets the same answer; the
    admission counter and the wait histogram count the turn once."""
    await sched.probe("a")
    await sched.probe("b")
    first = await sched.admit("t1", "r1")
    again = await sched.admit("t1", "r1")
    assert again.replica == first.replica
    m = await sched.scrape()
    assert sum(m[P + "admissions_total"].values()) == 1
    assert one(m, "admission_wait_seconds_count", service_class="batch") == 1


async def test_decide_duration_is_observed_once_per_event(sched: Sched) -> None:
    """S1: every decide call of the writer is timed, labelled by its event type."""
    await sched.probe("a")
    await sched.probe("b")
    await sched.admit("t1", "r1")
    await sched.finish("t1")
    await sched.host.apply(lambda at: RunEnded(at=at, run_id="r1"))
    m = await sched.scrape()

    def count(event: str) -> float:
        return one(m, "decide_duration_seconds_count", event=event)

    assert count("replica_probed") == 2
    assert count("turn_requested") == 1
    assert count("turn_started") == 1
    assert count("turn_finished") == 1
    assert count("run_ended") == 1
    assert count("clock_ticked") == 0  # exported before it happens
    assert {dict(k)["event"] for k in m[P + "decide_duration_seconds_count"]} == {
        event_label(t) for t in EVENT_TYPES
    }
    total = sum(m[P + "decide_duration_seconds_sum"].values())
    assert 0 < total < 1.0
    inf = one(m, "decide_duration_seconds_bucket", event="turn_requested", le="+Inf")
    assert inf == 1


async def test_each_host_has_its_own_registry_with_process_metrics() -> None:
    """Several schedulers in one process (tests) do not share counters; each serves the
    process collector's series too."""
    one_, two = await start(), await start()
    try:
        for s in (one_, two):
            await s.probe("a")
        await one_.admit("t1", "r1")
        m1, m2 = await one_.scrape(), await two.scrape()
        assert one(m1, "admissions_total", replica="a", service_class="batch") == 1
        assert one(m2, "admissions_total", replica="a", service_class="batch") == 0
        assert "process_resident_memory_bytes" in m1
        assert not any(name.endswith("_created") for name in m1)
    finally:
        for s in (one_, two):
            await s.http.aclose()
            s.writer.cancel()
            await asyncio.gather(s.writer, return_exceptions=True)


def test_event_labels_are_snake_case() -> None:
    assert event_label(TurnRequested) == "turn_requested"
    assert event_label(ReplicaProbed) == "replica_probed"
    assert len({event_label(t) for t in EVENT_TYPES}) == len(EVENT_TYPES) == 15
