"""B13: configured callers in the scheduler service, in process, from a stack file's
``[[callers]]``: over gRPC (Admit, Report, Link) a caller over its tokens per minute is
refused OVER_QUOTA with ``retry_after_s`` while another is admitted, a caller at its
``max_in_flight`` is held and admitted when one of its turns ends, and ``/status`` and
``/metrics`` show the callers. Time is a clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from _clock import Clock
from prometheus_client.parser import text_string_to_metric_families

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.config import load_config
from luftpause.dataplane.link_codec import Rejected, admit_answer
from luftpause.scheduler.core import ReplicaProbed, initial_state
from luftpause.scheduler.service.grpc_server import SchedulerServer, start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.main import core_params, replica_specs
from luftpause.scheduler.service.quotas import Quotas
from luftpause.scheduler.service.status_http import status_app
from luftpause.status_cli import render_scheduler

STACK = """
[[endpoints]]
name = "a"
url = "http://a.invalid"
models = ["m"]

[[callers]]
name = "alice"
key_env = "ALICE_KEY"
tokens_per_minute = 100

[[callers]]
name = "bob"
key_env = "BOB_KEY"
weight = 2
max_in_flight = 1
daily_tokens = 1000000
"""
NOON = 20_000 * 86_400 + 43_200.0


@dataclass
class Sched:
    host: Host
    clock: Clock
    stub: pb_grpc.SchedulerStub
    channel: grpc.aio.Channel
    server: SchedulerServer
    writer: asyncio.Task[None]
    http: httpx.AsyncClient

    async def admit(self, turn: str, caller: str) -> pb.AdmitResponse:
        return await asyncio.wait_for(self.stub.Admit(request(turn, caller)), 10)

    async def report(self, turn: str, prompt: int, completion: int) -> None:
        """A turn's finish, reported; returns once the writer has applied it."""

        async def batches() -> AsyncIterator[pb.ReportBatch]:
            yield pb.ReportBatch(events=[finished(turn, prompt, completion)])

        await asyncio.wait_for(self.stub.Report(batches()), 10)
        await until(lambda: turn not in self.host.state.turns)


def request(turn: str, caller: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn,
        run_id=f"run-{turn}",
        model="m",
        service_class=pb.SERVICE_CLASS_BATCH,
        caller=caller,
        kind=pb.ENDPOINT_KIND_GENERATIVE,
        dataplane_id="dp1",
    )


def finished(turn: str, prompt: int, completion: int) -> pb.TurnEvent:
    return pb.TurnEvent(
        turn_id=turn,
        run_id=f"run-{turn}",
        finished=pb.TurnFinished(
            usage=pb.Usage(prompt_tokens=prompt, completion_tokens=completion),
            finish_reason="stop",
        ),
    )


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


@pytest.fixture
async def sched(tmp_path: Path) -> AsyncIterator[Sched]:
    path = tmp_path / "stack.toml"
    path.write_text(STACK)
    config, _ = load_config(path, {})
    clock = Clock()
    params = core_params(config.scheduler, config.endpoints, config.callers)
    host = Host(
        initial_state(replica_specs(config), params, clock()),
        clock,
        Quotas.of(config.callers),
        wall=lambda: NOON,
    )
    writer = asyncio.create_task(host.run())
    server = await start_grpc(host, {"a": "http://a.invalid"}, "127.0.0.1:0")
    await host.apply(lambda at: ReplicaProbed(at=at, replica="a", healthy=True))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=status_app(host, clock, dict)), base_url="http://s"
    )
    yield Sched(host, clock, pb_grpc.SchedulerStub(channel), channel, server, writer, http)
    await http.aclose()
    await channel.close()
    await server.stop(grace=0)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def test_a_caller_over_its_tokens_per_minute_is_refused_while_another_is_admitted(
    sched: Sched,
) -> None:
    """B13: alice's finished turn overdraws her 100-token bucket by 50; her next turn,
    and her sub-caller's, are Rejected OVER_QUOTA (retry_after_s 31: the bucket refills
    100/60 a second and is above 0 from then), on Admit and on the Link alike, and the
    core never sees them; bob is admitted meanwhile; 31 s later alice is admitted."""
    assert (await sched.admit("a1", "alice")).WhichOneof("outcome") == "admitted"
    await sched.report("a1", 140, 10)
    refused = await sched.admit("a2", "alice")
    assert refused.WhichOneof("outcome") == "rejected"
    r = refused.rejected
    assert r.code == pb.REJECT_CODE_OVER_QUOTA
    assert (r.retry_after_s, r.limit) == (31.0, "tokens_per_minute")
    assert r.message == "caller 'alice' used its 100 tokens per minute; retry in 31 s"
    assert admit_answer(refused) == Rejected(
        False, r.message, over_quota=True, retry_after_s=31.0, limit="tokens_per_minute"
    )
    assert "a2" not in sched.host.state.held and "a2" not in sched.host.state.turns

    link = sched.stub.Link()
    await link.write(pb.LinkUp(admit=[request("a3", "alice/ci")]))
    down = await asyncio.wait_for(link.read(), 10)
    assert [a.turn_id for a in down.answers] == ["a3"]
    assert down.answers[0].response.rejected.code == pb.REJECT_CODE_OVER_QUOTA
    await link.done_writing()

    assert (await sched.admit("b1", "bob")).WhichOneof("outcome") == "admitted"
    sched.clock.now += 30.0
    assert (await sched.admit("a4", "alice")).rejected.retry_after_s == 1.0
    sched.clock.now += 1.0
    assert (await sched.admit("a5", "alice")).WhichOneof("outcome") == "admitted"


async def test_a_caller_at_its_max_in_flight_is_held_not_refused(sched: Sched) -> None:
    """B13: bob may have one turn in flight; his second waits in the core (no refusal)
    and is admitted once the first ends."""
    assert (await sched.admit("b1", "bob")).WhichOneof("outcome") == "admitted"
    second = asyncio.ensure_future(sched.admit("b2", "bob/ci"))
    await until(lambda: "b2" in sched.host.state.held)
    assert not second.done()
    assert (await sched.admit("c1", "carol")).WhichOneof("outcome") == "admitted"
    await sched.report("b1", 10, 5)
    answer = await asyncio.wait_for(second, 10)
    assert answer.WhichOneof("outcome") == "admitted"


async def test_status_and_metrics_show_the_callers(sched: Sched) -> None:
    """B13: /status lists each configured caller (weight, limits, its account's turns
    in flight and held, tokens, refusals, sub-callers) and sums the unconfigured ones;
    /metrics has the per-caller series under bounded labels. No key appears."""
    assert (await sched.admit("a1", "alice/ci")).WhichOneof("outcome") == "admitted"
    await sched.report("a1", 90, 30)
    await sched.admit("a2", "alice")  # refused: the bucket is at -20
    assert (await sched.admit("b1", "bob/ci")).WhichOneof("outcome") == "admitted"
    held = asyncio.ensure_future(sched.admit("b2", "bob"))
    assert (await sched.admit("c1", "carol/x")).WhichOneof("outcome") == "admitted"
    await until(lambda: "b2" in sched.host.state.held)

    body = (await sched.http.get("/status")).json()
    alice, bob = body["callers"]
    assert alice == {
        "name": "alice",
        "weight": 1.0,
        "max_in_flight": None,
        "in_flight": 0,
        "held": 0,
        "tokens_per_minute": 100,
        "tokens_per_minute_left": -20,
        "daily_tokens": None,
        "tokens_today": 120,
        "tokens_total": 120,
        "refused": {"tokens_per_minute": 1, "daily_tokens": 0},
        "sub_callers": [],
        "sub_callers_more": 0,
    }
    assert bob["weight"] == 2.0 and bob["max_in_flight"] == 1 and bob["daily_tokens"] == 10**6
    assert (bob["in_flight"], bob["held"], bob["tokens_per_minute"]) == (1, 1, None)
    assert bob["sub_callers"] == [{"name": "bob/ci", "in_flight": 1, "held": 0}]
    assert body["unconfigured_callers"] == {"callers": 1, "in_flight": 1, "held": 0}
    assert body["counters"]["over_quota"] == 1

    text = (await sched.http.get("/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    p = "luftpause_scheduler_"
    assert samples[(p + "caller_in_flight", (("caller", "bob/ci"),))] == 1
    assert samples[(p + "caller_in_flight", (("caller", "other"),))] == 1
    assert samples[(p + "caller_in_flight", (("caller", "alice"),))] == 0
    assert samples[(p + "caller_held", (("caller", "bob"),))] == 1
    assert samples[(p + "caller_tokens_total", (("caller", "alice/ci"),))] == 120
    refused = (p + "caller_refused_total", (("caller", "alice"), ("limit", "tokens_per_minute")))
    assert samples[refused] == 1
    assert samples[(p + "rejections_total", (("reason", "over_quota"),))] == 1
    for page in (text, str(body)):
        assert "KEY" not in page

    lines = render_scheduler(body, "http://s")
    at = lines.index("CALLERS (2)")
    assert lines[at + 1].split() == [
        "CALLER", "WEIGHT", "IN", "FLIGHT/MAX", "HELD", "TOKENS/MIN", "LEFT", "TOKENS",
        "TODAY", "REFUSED", "MIN/DAY", "SUB-CALLERS", "(IN", "FLIGHT+HELD)",
    ]  # fmt: skip
    assert lines[at + 2].split() == ["alice", "1", "0", "0", "-20/100", "120", "1/0", "-"]
    assert lines[at + 3].split() == ["bob", "2", "1/1", "1", "-", "0/1.0M", "0/0", "bob/ci", "1+0"]
    assert lines[at + 4] == "  others: 1 callers, 1 in flight, 0 held"
    page = await sched.http.get("/")
    script = await sched.http.get("/ui/status.js")
    assert 'id="configured-callers"' in page.text and "renderCallers(s)" in script.text
    held.cancel()
