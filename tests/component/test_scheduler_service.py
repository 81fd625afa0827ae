"""The scheduler's gRPC host in process: admit, hold, abandon by cancel, resync, status."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.scheduler.core import (
    ClockTicked,
    EndpointKind,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    initial_state,
)
from luftpause.scheduler.service.grpc_server import (
    SERVICE_NAME,
    SchedulerServer,
    SchedulerServicer,
    start_grpc,
)
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.status_http import status_app

SPECS = (
    ReplicaSpec("a", EndpointKind.GENERATIVE, frozenset({"m"})),
    ReplicaSpec("b", EndpointKind.GENERATIVE, frozenset({"m"})),
    ReplicaSpec("cls", EndpointKind.SINGLE_PASS, frozenset({"c"})),
)
URLS = {"a": "http://a.invalid", "b": "http://b.invalid", "cls": "http://c.invalid"}


@dataclass
class Sched:
    host: Host
    stub: pb_grpc.SchedulerStub
    channel: grpc.aio.Channel
    server: SchedulerServer
    writer: asyncio.Task[None]

    async def probe(self, replica: str, running: int | None, waiting: int | None) -> None:
        await self.host.apply(
            lambda at: ReplicaProbed(
                at=at, replica=replica, healthy=True, running=running, waiting=waiting
            )
        )

    async def close(self) -> None:
        await self.channel.close()
        await self.server.stop(grace=0)
        self.writer.cancel()
        await asyncio.gather(self.writer, return_exceptions=True)


async def start_sched() -> Sched:
    # One probe with a queue caps here (the persistence rule is the core's, tested there).
    host = Host(initial_state(SPECS, Params(queue_probes=1), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    server = await start_grpc(host, URLS, "127.0.0.1:0")
    port = server.port
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    sched = Sched(host, pb_grpc.SchedulerStub(channel), channel, server, writer)
    for name in ("a", "b", "cls"):
        await sched.probe(name, None, None)
    return sched


@pytest.fixture
async def sched() -> AsyncIterator[Sched]:
    s = await start_sched()
    yield s
    await s.close()


def admit_req(
    turn: str,
    run: str,
    *,
    cls: int = pb.SERVICE_CLASS_BATCH,
    caller: str = "c",
    model: str = "m",
    kind: int = pb.ENDPOINT_KIND_GENERATIVE,
) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn,
        run_id=run,
        model=model,
        service_class=cls,
        caller=caller,
        kind=kind,
        dataplane_id="dp1",
    )


async def finish(stub: pb_grpc.SchedulerStub, *events: pb.TurnEvent) -> None:
    async def gen() -> AsyncIterator[pb.ReportBatch]:
        yield pb.ReportBatch(events=list(events))

    await stub.Report(gen())


def finished(
    turn: str, run: str, paused: bool = False, prompt: int = 10, cached: int = 0
) -> pb.TurnEvent:
    return pb.TurnEvent(
        turn_id=turn,
        run_id=run,
        finished=pb.TurnFinished(
            usage=pb.Usage(prompt_tokens=prompt, completion_tokens=5, cached_tokens=cached),
            finish_reason="stop",
            paused_on_tool=paused,
        ),
    )


async def wait_for(cond: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_admit_immediately_when_a_replica_has_room(sched: Sched) -> None:
    """S2: a replica that reports no load is not limited; the answer names replica and URL."""
    resp = await sched.stub.Admit(admit_req("t1", "r1"))
    assert resp.WhichOneof("outcome") == "admitted"
    assert resp.admitted.replica in ("a", "b")
    assert resp.admitted.url == URLS[resp.admitted.replica]


async def test_held_turn_is_admitted_when_a_slot_frees(sched: Sched) -> None:
    """S2, D4: with both engines queueing, the call stays open until a finish frees a slot."""
    await sched.probe("a", 1, 3)
    await sched.probe("b", 1, 3)
    first = await sched.stub.Admit(admit_req("t1", "r1"))
    second = await sched.stub.Admit(admit_req("t2", "r2"))
    held = asyncio.ensure_future(sched.stub.Admit(admit_req("t3", "r3")))
    await wait_for(lambda: len(sched.host.state.held) == 1)
    assert not held.done()
    await finish(sched.stub, finished("t1", "r1"))
    resp = await asyncio.wait_for(held, 5)
    assert resp.admitted.replica == first.admitted.replica
    assert {first.admitted.replica, second.admitted.replica} == {"a", "b"}
    assert resp.admitted.held_s > 0


async def test_reported_cached_tokens_drive_prefix_keeping(sched: Sched) -> None:
    """Prefix keeping through the wire: the cached tokens a dataplane reports for a
    run's continuing turn reach the core; an evicted prefix lowers that replica's cap."""
    await sched.probe("a", 4, 1)
    await sched.probe("b", 4, 1)
    first = await sched.stub.Admit(admit_req("t1", "r1"))
    replica = first.admitted.replica
    # a first turn has nothing of its own cached: little cached is no eviction
    await finish(sched.stub, finished("t1", "r1", paused=True, prompt=1000, cached=10))
    again = await sched.stub.Admit(admit_req("t2", "r1"))
    assert again.admitted.replica == replica  # S3: back to its prefix
    assert sched.host.state.replicas[replica].cap == 4
    await finish(sched.stub, finished("t2", "r1", paused=True, prompt=1100, cached=100))
    await wait_for(lambda: sched.host.state.replicas[replica].prefix_misses == 1)
    assert sched.host.state.replicas[replica].cap == 3


async def test_reported_tool_names_teach_the_core_each_tool_s_time(sched: Sched) -> None:
    """Tool leases through the wire: the tool names a dataplane reports with a paused turn
    reach the core (bounded as a dataplane bounds them), and the run's return teaches it
    how long those tools took; /status lists them."""
    await sched.stub.Admit(admit_req("t1", "r1"))
    event = finished("t1", "r1", paused=True)
    event.finished.tool_names.extend(["grep", "y" * 100] + [f"t{i}" for i in range(10)])
    await finish(sched.stub, event)
    await wait_for(
        lambda: "r1" in sched.host.state.runs and sched.host.state.runs["r1"].paused_tools
    )
    tools = sched.host.state.runs["r1"].paused_tools
    assert len(tools) == 8 and "grep" in tools and "y" * 64 in tools
    await sched.stub.Admit(admit_req("t2", "r1"))
    times = sched.host.state.tool_times
    assert set(times) == set(tools) and times["grep"].samples == 1


async def test_cancelled_admit_abandons_the_held_turn(sched: Sched) -> None:
    """D4, D6: a client that leaves while held leaves the queue; it is never admitted."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    await sched.stub.Admit(admit_req("t1", "r1"))
    await sched.stub.Admit(admit_req("t2", "r2"))
    call = sched.stub.Admit(admit_req("t3", "r3"))
    task = asyncio.ensure_future(call)
    await wait_for(lambda: "t3" in sched.host.state.held)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: "t3" not in sched.host.state.held)
    await finish(sched.stub, finished("t1", "r1"))
    await wait_for(lambda: "t1" not in sched.host.state.turns)
    assert "t3" not in sched.host.state.turns
    assert sched.host.state.replicas["a"].in_flight + sched.host.state.replicas["b"].in_flight == 1


async def test_unknown_model_is_rejected_at_once(sched: Sched) -> None:
    """S6, D6: an unknown model is rejected before queueing, with the exact message."""
    resp = await sched.stub.Admit(admit_req("t1", "r1", model="nope"))
    assert resp.WhichOneof("outcome") == "rejected"
    assert resp.rejected.code == pb.REJECT_CODE_UNKNOWN_MODEL
    assert resp.rejected.message == "no Generative replica serves model 'nope'"


async def test_single_pass_turn_skips_full_generative_pool(sched: Sched) -> None:
    """S13: a classifier turn is admitted even while every generative slot is taken."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    await sched.stub.Admit(admit_req("t1", "r1"))
    await sched.stub.Admit(admit_req("t2", "r2"))
    resp = await asyncio.wait_for(
        sched.stub.Admit(admit_req("c1", "x", model="c", kind=pb.ENDPOINT_KIND_SINGLE_PASS)), 5
    )
    assert resp.admitted.replica == "cls"
    assert "x" not in sched.host.state.runs


async def test_restart_resync_keeps_affinity_and_original_turn_ids() -> None:
    """S11: a fresh scheduler fed a resync keeps affinity and admits held turns by their IDs."""
    old = await start_sched()
    try:
        await old.probe("a", None, None)
        first = await old.stub.Admit(admit_req("t1", "run", cls=pb.SERVICE_CLASS_INTERACTIVE))
        replica = first.admitted.replica
        await finish(old.stub, finished("t1", "run", paused=True))
        other = await old.stub.Admit(admit_req("o1", "other"))
    finally:
        await old.close()
    new = await start_sched()  # "restarted": empty state
    try:
        resp = await new.stub.Resync(
            pb.ResyncRequest(
                dataplane_id="dp1",
                runs=[
                    pb.RunSnapshot(
                        run_id="run",
                        last_replica=replica,
                        phase=pb.RUN_PHASE_PAUSED_ON_TOOL,
                        service_class=pb.SERVICE_CLASS_INTERACTIVE,
                        caller="c",
                    ),
                    pb.RunSnapshot(
                        run_id="other",
                        last_replica=other.admitted.replica,
                        phase=pb.RUN_PHASE_GENERATING,
                        service_class=pb.SERVICE_CLASS_BATCH,
                        caller="c",
                    ),
                ],
                in_flight=[
                    pb.TurnSnapshot(
                        turn_id="o1",
                        run_id="other",
                        replica=other.admitted.replica,
                        model="m",
                        service_class=pb.SERVICE_CLASS_BATCH,
                        caller="c",
                        started=True,
                    )
                ],
            )
        )
        assert (resp.runs, resp.turns) == (2, 1)
        state = new.host.state
        assert state.replicas[other.admitted.replica].in_flight == 1
        assert state.replicas[replica].reserved == 1
        # A re-sent Admit for the admitted turn gets the same replica back.
        again = await new.stub.Admit(admit_req("o1", "other"))
        assert again.admitted.replica == other.admitted.replica
        # The paused run's next turn goes to its replica even if the other is emptier.
        nxt = await new.stub.Admit(admit_req("t2", "run", cls=pb.SERVICE_CLASS_INTERACTIVE))
        assert nxt.admitted.replica == replica
    finally:
        await new.close()


async def test_run_ended_forgets_the_run(sched: Sched) -> None:
    """D8: RunEnded drops the run's state (and so its affinity)."""
    await sched.stub.Admit(admit_req("t1", "r1"))
    await finish(sched.stub, finished("t1", "r1", paused=True))
    await wait_for(lambda: "t1" not in sched.host.state.turns)
    assert "r1" in sched.host.state.runs
    await sched.stub.RunEnded(pb.RunEndedRequest(run_id="r1"))
    assert "r1" not in sched.host.state.runs


async def test_grpc_health_service_reports_serving(sched: Sched) -> None:
    """S12 companion: the standard grpc.health.v1 service answers SERVING."""
    stub = health_pb2_grpc.HealthStub(sched.channel)
    for service in ("", SERVICE_NAME):
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_status_json_shows_replicas_held_and_runs(sched: Sched) -> None:
    """S12: per replica in-flight and capacity; held turns by class and caller; runs by phase."""
    await sched.probe("a", 1, 2)
    await sched.probe("b", 1, 2)
    await sched.stub.Admit(admit_req("t1", "r1", caller="alice"))
    await sched.stub.Admit(admit_req("t2", "r2", caller="alice"))
    held = asyncio.ensure_future(
        sched.stub.Admit(admit_req("t3", "r3", cls=pb.SERVICE_CLASS_INTERACTIVE, caller="bob"))
    )
    await wait_for(lambda: "t3" in sched.host.state.held)
    app = status_app(sched.host, time.monotonic, lambda: {"grpc_port": 1})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        body = (await c.get("/status")).json()
        assert (await c.get("/health")).status_code == 200
    reps = {r["name"]: r for r in body["replicas"]}
    assert reps["a"]["capacity"] == 1 and reps["a"]["in_flight"] == 1
    assert reps["cls"]["capacity"] is None
    assert body["held"]["interactive"]["bob"]["held"] == 1
    assert body["held"]["interactive"]["bob"]["oldest_wait_s"] >= 0
    assert body["runs"]["generating"]["batch"] == 2
    assert body["counters"]["admitted"] >= 2
    held.cancel()


async def test_turns_of_a_dataplane_that_stops_reporting_are_released_after_its_grace(
    sched: Sched,
) -> None:
    """S11: a dataplane's report stream names it. When the stream ends and the dataplane
    does not come back (it died, or restarted under another ID), its admitted turns are
    released once the grace has passed; a turn of another dataplane is untouched."""
    state = sched.host.state
    sched.host.state = replace(state, params=replace(state.params, dataplane_grace_s=0.5))
    for turn, dp in (("t1", "dp-dead"), ("t2", "dp-alive")):
        req = admit_req(turn, f"run-{turn}")
        req.dataplane_id = dp
        await sched.stub.Admit(req)

    async def events() -> AsyncIterator[pb.ReportBatch]:
        yield pb.ReportBatch()
        await asyncio.sleep(0.2)

    call = sched.stub.Report(events(), metadata=(("luftpause-dataplane-id", "dp-dead"),))
    await call  # the stream ends: the dataplane is gone
    assert set(sched.host.state.turns) == {"t1", "t2"}  # within the grace: still counted
    await asyncio.sleep(0.6)
    await sched.host.apply(lambda at: ClockTicked(at=at))
    assert set(sched.host.state.turns) == {"t2"}
    assert sched.host.counters.get("dropped_released") == 1


async def test_a_dataplane_that_resyncs_but_never_reports_loses_its_turns_after_the_grace(
    sched: Sched,
) -> None:
    """S11: a dataplane that dies between its resync and opening its report stream is
    treated as one whose stream ended: the turns it listed are released after the grace."""
    state = sched.host.state
    sched.host.state = replace(state, params=replace(state.params, dataplane_grace_s=0.3))
    await sched.stub.Resync(
        pb.ResyncRequest(
            dataplane_id="dp-gone",
            in_flight=[
                pb.TurnSnapshot(
                    turn_id="t1",
                    run_id="r1",
                    replica="a",
                    model="m",
                    service_class=pb.SERVICE_CLASS_BATCH,
                    started=True,
                )
            ],
        )
    )
    assert set(sched.host.state.turns) == {"t1"}
    await asyncio.sleep(0.4)
    await sched.host.apply(lambda at: ClockTicked(at=at))
    assert not sched.host.state.turns


def test_the_dataplane_names_itself_under_the_key_the_scheduler_reads() -> None:
    """S11: the report-stream metadata key is written twice (the dataplane may not import
    the scheduler): both sides must agree, or no dataplane is ever found lost."""
    from luftpause.dataplane import scheduler_link
    from luftpause.scheduler.service import grpc_server

    assert scheduler_link.DATAPLANE_ID_KEY == grpc_server.DATAPLANE_ID_KEY


async def test_link_answers_admissions_and_applies_reports_first(sched: Sched) -> None:
    """D4, D5 on the Link stream: several admissions in one write are each answered once,
    keyed by turn ID; reports in a write are applied before its admissions, so a slot a
    finished turn frees serves an admission sent with that report."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    call = sched.stub.Link(metadata=(("luftpause-dataplane-id", "dp1"),))
    await call.write(pb.LinkUp(admit=[admit_req("t1", "r1"), admit_req("t2", "r2")]))
    answers: dict[str, pb.AdmitResponse] = {}
    while len(answers) < 2:
        down = await asyncio.wait_for(call.read(), 5)
        answers.update((a.turn_id, a.response) for a in down.answers)
    assert {answers[t].admitted.replica for t in ("t1", "t2")} == {"a", "b"}
    # Both replicas full: t3 goes out with t1's report and takes t1's slot at once.
    await call.write(pb.LinkUp(events=[finished("t1", "r1")], admit=[admit_req("t3", "r3")]))
    down = await asyncio.wait_for(call.read(), 5)
    assert [a.turn_id for a in down.answers] == ["t3"]
    assert down.answers[0].response.admitted.replica == answers["t1"].admitted.replica
    await call.done_writing()
    assert await call.code() is grpc.StatusCode.OK


async def test_link_abandons_a_turn_named_or_left_waiting_when_the_stream_ends(
    sched: Sched,
) -> None:
    """D4, D6: a held turn named in ``abandoned`` leaves the queue and is never admitted;
    a stream that ends abandons the turns still waiting on it, as a cancelled Admit does."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    await sched.stub.Admit(admit_req("t1", "r1"))
    await sched.stub.Admit(admit_req("t2", "r2"))
    call = sched.stub.Link()
    await call.write(pb.LinkUp(admit=[admit_req("t3", "r3"), admit_req("t4", "r4")]))
    await wait_for(lambda: {"t3", "t4"} <= set(sched.host.state.held))
    await call.write(pb.LinkUp(abandoned=["t3"]))
    await wait_for(lambda: "t3" not in sched.host.state.held)
    assert "t4" in sched.host.state.held
    call.cancel()  # the dataplane went away with t4 still held
    await wait_for(lambda: "t4" not in sched.host.state.held)
    await finish(sched.stub, finished("t1", "r1"))
    await wait_for(lambda: "t1" not in sched.host.state.turns)
    assert not {"t3", "t4"} & set(sched.host.state.turns)


class _Context:
    """What ``Link`` uses of a gRPC server context, for calling it directly."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    async def write(self, message: object) -> None:
        pass

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted: {details}")


@pytest.mark.parametrize("hops", range(6))
async def test_link_abandons_held_turns_even_if_cancelled_while_its_stream_ends(
    sched: Sched, hops: int
) -> None:
    """D6: gRPC cancels the handler when the client goes, and that can arrive while the
    handler is closing a stream that has just ended. Wherever the cancellation lands,
    the turns still held for the stream are abandoned (before: one landing in the
    handler's clean-up skipped it, and the turn stayed held for good)."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    await sched.stub.Admit(admit_req("t1", "r1"))
    await sched.stub.Admit(admit_req("t2", "r2"))
    servicer = SchedulerServicer(sched.host, URLS)
    loop = asyncio.get_running_loop()
    task: asyncio.Task[None] | None = None
    held = asyncio.Event()

    def cancel_after(n: int) -> None:
        assert task is not None
        if n == 0:
            task.cancel()
        else:
            loop.call_soon(cancel_after, n - 1)

    async def ups() -> AsyncIterator[pb.LinkUp]:
        yield pb.LinkUp(admit=[admit_req("t4", "r4")])
        await held.wait()
        cancel_after(hops)  # the client's cancellation, racing the stream's end

    task = asyncio.create_task(servicer.Link(ups(), _Context()))
    await wait_for(lambda: "t4" in sched.host.state.held)
    held.set()
    await asyncio.gather(task, return_exceptions=True)
    await wait_for(lambda: "t4" not in sched.host.state.held)
    assert "t4" not in sched.host.state.turns
