"""The Link over plain TCP: the scheduler's listener (in process, on loopback) spoken
to by a raw framed client and by the dataplane's ``SchedulerLink``.

The Link rpc's own tests (test_scheduler_service.py) hold for what the messages
mean; these check what the carriage adds: hello and welcome, the token, answers
and reports, abandonment and the grace when the connection ends, bad frames, and
the dataplane choosing TCP where offered and the rpc where not.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.auth import bearer
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.linkwire import FrameReader, frame
from luftpause.scheduler.core import (
    ClockTicked,
    EndpointKind,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    initial_state,
)
from luftpause.scheduler.service import convert
from luftpause.scheduler.service.grpc_server import SchedulerServer, start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.tcp_link import DEFAULT_LIMITS, HELLO_MAX_BYTES, LinkLimits

TOKEN = "s3cret"
SPECS = tuple(ReplicaSpec(n, EndpointKind.GENERATIVE, frozenset({"m"})) for n in ("a", "b"))
URLS = {"a": "http://a.invalid", "b": "http://b.invalid"}


@dataclass
class Sched:
    host: Host
    server: SchedulerServer
    writer: asyncio.Task[None]

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def probe(self, replica: str, running: int | None, waiting: int | None) -> None:
        await self.host.apply(
            lambda at: ReplicaProbed(
                at=at, replica=replica, healthy=True, running=running, waiting=waiting
            )
        )

    async def close(self) -> None:
        await self.server.stop(grace=0)
        self.writer.cancel()
        await asyncio.gather(self.writer, return_exceptions=True)


async def start_sched(
    token: str | None = None, link_port: int | None = 0, limits: LinkLimits = DEFAULT_LIMITS
) -> Sched:
    host = Host(initial_state(SPECS, Params(queue_probes=1), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    server = await start_grpc(
        host, URLS, "127.0.0.1:0", token, link_port=link_port, link_limits=limits
    )
    sched = Sched(host, server, writer)
    for name in ("a", "b"):
        await sched.probe(name, None, None)
    return sched


@pytest.fixture
async def sched() -> AsyncIterator[Sched]:
    s = await start_sched()
    yield s
    await s.close()


class RawLink:
    """A framed client, as a dataplane's end would be written from the .proto alone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader()
        self.queue: list[bytes] = []

    @classmethod
    async def open(cls, port: int, dataplane_id: str = "dp1", auth: str = "") -> RawLink:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = cls(reader, writer)
        link.send(pb.LinkHello(dataplane_id=dataplane_id, authorization=auth))
        return link

    def send(self, message: pb.LinkHello | pb.LinkUp) -> None:
        self.writer.write(frame(message.SerializeToString()))

    async def next(self) -> bytes | None:
        """The next frame, or None once the scheduler closed the connection."""
        async with asyncio.timeout(5):
            while not self.queue:
                data = await self.reader.read(65536)
                if not data:
                    return None
                self.queue += self.frames.feed(data)
        return self.queue.pop(0)

    async def welcome(self) -> pb.LinkWelcome:
        data = await self.next()
        assert data is not None, "closed before the welcome"
        return pb.LinkWelcome.FromString(data)

    async def down(self) -> pb.LinkDown:
        data = await self.next()
        assert data is not None, "closed before an answer"
        return pb.LinkDown.FromString(data)

    def close(self) -> None:
        self.writer.close()


def admit_req(turn: str, run: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn,
        run_id=run,
        model="m",
        service_class=pb.SERVICE_CLASS_BATCH,
        caller="c",
        kind=pb.ENDPOINT_KIND_GENERATIVE,
        dataplane_id="dp1",
    )


def finished(turn: str, run: str) -> pb.TurnEvent:
    return pb.TurnEvent(
        turn_id=turn,
        run_id=run,
        finished=pb.TurnFinished(
            usage=pb.Usage(prompt_tokens=10, completion_tokens=5), finish_reason="stop"
        ),
    )


async def wait_for(cond: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_resync_advertises_the_port_and_the_link_answers_in_order(sched: Sched) -> None:
    """D4, D5 over TCP: the resync answer names the port; after the welcome, admissions
    in one frame are each answered once, and a frame's reports are applied before its
    admissions (a slot a finished turn frees serves the admission sent with it)."""
    assert sched.server.link_port > 0
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    link = await RawLink.open(sched.server.link_port)
    assert (await link.welcome()).refused is False
    link.send(pb.LinkUp(admit=[admit_req("t1", "r1"), admit_req("t2", "r2")]))
    answers: dict[str, pb.AdmitResponse] = {}
    while len(answers) < 2:
        answers.update((a.turn_id, a.response) for a in (await link.down()).answers)
    assert {answers[t].admitted.replica for t in ("t1", "t2")} == {"a", "b"}
    link.send(pb.LinkUp(events=[finished("t1", "r1")], admit=[admit_req("t3", "r3")]))
    down = await link.down()
    assert [a.turn_id for a in down.answers] == ["t3"]
    assert down.answers[0].response.admitted.replica == answers["t1"].admitted.replica
    link.writer.write_eof()  # the stream is over: the scheduler closes its side
    assert await link.next() is None


async def test_held_turns_are_abandoned_when_named_or_when_the_connection_ends(
    sched: Sched,
) -> None:
    """D6 over TCP: a held turn named in ``abandoned`` leaves the queue; closing the
    connection abandons the turns still waiting on it."""
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    link = await RawLink.open(sched.server.link_port)
    await link.welcome()
    link.send(pb.LinkUp(admit=[admit_req("t1", "r1"), admit_req("t2", "r2")]))
    got = 0
    while got < 2:
        got += len((await link.down()).answers)
    link.send(pb.LinkUp(admit=[admit_req("t3", "r3"), admit_req("t4", "r4")]))
    await wait_for(lambda: {"t3", "t4"} <= set(sched.host.state.held))
    link.send(pb.LinkUp(abandoned=["t3"]))
    await wait_for(lambda: "t3" not in sched.host.state.held)
    assert "t4" in sched.host.state.held
    link.close()
    await wait_for(lambda: "t4" not in sched.host.state.held)
    assert not {"t3", "t4"} & set(sched.host.state.turns)


async def test_a_dataplane_whose_connection_ends_loses_its_turns_after_the_grace(
    sched: Sched,
) -> None:
    """S11 over TCP: the hello names the dataplane; once its connection ends and it does
    not come back within the grace, its admitted turns are released."""
    state = sched.host.state
    sched.host.state = replace(state, params=replace(state.params, dataplane_grace_s=0.3))
    link = await RawLink.open(sched.server.link_port, dataplane_id="dp-dead")
    await link.welcome()
    req = admit_req("t1", "r1")
    req.dataplane_id = "dp-dead"
    link.send(pb.LinkUp(admit=[req]))
    assert (await link.down()).answers[0].response.WhichOneof("outcome") == "admitted"
    link.close()
    await asyncio.sleep(0.1)
    assert set(sched.host.state.turns) == {"t1"}  # within the grace: still counted
    await asyncio.sleep(0.4)
    await sched.host.apply(lambda at: ClockTicked(at=at))
    assert not sched.host.state.turns


async def test_the_token_is_required_on_the_tcp_link() -> None:
    """X2 over TCP: with a token, a hello without it (or with another) is refused in the
    welcome and the connection closed; with it, the link is welcomed."""
    sched = await start_sched(token=TOKEN)
    try:
        for auth in ("", bearer("other")):
            link = await RawLink.open(sched.server.link_port, auth=auth)
            welcome = await link.welcome()
            assert welcome.refused and "bearer token" in welcome.message
            assert await link.next() is None
        link = await RawLink.open(sched.server.link_port, auth=bearer(TOKEN))
        assert (await link.welcome()).refused is False
        link.close()
    finally:
        await sched.close()


@pytest.mark.parametrize(
    "garbage", [b"\xff\xff\xff\xff", frame(b"\x0a\xff\xff"), b"GET / HTTP/1.1\r\n\r\n"]
)
async def test_what_is_not_a_link_frame_closes_that_connection_only(
    sched: Sched, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input on the port: the connection is closed with a warning; the scheduler
    goes on serving other links."""
    reader, writer = await asyncio.open_connection("127.0.0.1", sched.server.link_port)
    writer.write(garbage)
    with caplog.at_level(logging.WARNING, logger="luftpause.scheduler.link"):
        async with asyncio.timeout(5):
            while await reader.read(65536):
                pass
    assert "closing a Link connection" in caplog.text
    link = await RawLink.open(sched.server.link_port)
    assert (await link.welcome()).refused is False
    link.close()


async def closed_by_scheduler(reader: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """What the scheduler sent before closing the connection (fails if it does not close
    within ``within_s``)."""
    got = b""
    async with asyncio.timeout(within_s):
        try:
            while data := await reader.read(65536):
                got += data
        except ConnectionResetError:
            pass
    return got


async def test_a_connection_without_a_whole_hello_is_closed_after_the_hello_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """X2 on the Link port: with a token, a connection that sends nothing, one that
    sends half a hello and stalls, and one that announces a hello larger than any is
    each closed, with a warning naming the peer; the port goes on welcoming."""
    sched = await start_sched(token=TOKEN, limits=LinkLimits(hello_timeout_s=0.3))
    port = sched.server.link_port
    assert sched.server.link is not None
    try:
        hello = frame(
            pb.LinkHello(dataplane_id="dp1", authorization=bearer(TOKEN)).SerializeToString()
        )
        sent = {"silent": b"", "half": hello[: len(hello) // 2]}
        with caplog.at_level(logging.WARNING, logger="luftpause.scheduler.link"):
            peers = {}
            for name, data in sent.items():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(data)
                peers[name] = (reader, writer)
            for name, (reader, writer) in peers.items():
                assert await closed_by_scheduler(reader) == b"", name
                local = writer.get_extra_info("sockname")
                assert (
                    f"closing a Link connection from 127.0.0.1:{local[1]}: no hello" in caplog.text
                )
                writer.close()
            assert f"({len(sent['half'])} bytes of one received)" in caplog.text
            # Too big to be a hello: closed as soon as that much has come.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write((2 * HELLO_MAX_BYTES).to_bytes(4, "big") + b"\0" * (HELLO_MAX_BYTES + 1))
            assert await closed_by_scheduler(reader) == b""
            writer.close()
            assert f"over {HELLO_MAX_BYTES} bytes received and no whole hello" in caplog.text
            # A hello with the token, but larger than any dataplane's: not welcomed.
            huge = pb.LinkHello(dataplane_id="d" * HELLO_MAX_BYTES, authorization=bearer(TOKEN))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frame(huge.SerializeToString()))
            assert await closed_by_scheduler(reader) == b""
            writer.close()
        assert not sched.server.link.unauthenticated
        link = await RawLink.open(port, auth=bearer(TOKEN))
        assert (await link.welcome()).refused is False
        link.close()
    finally:
        await sched.close()


async def test_a_dataplane_welcomed_within_the_hello_timeout_is_never_timed_out() -> None:
    """X2, D4 on the Link port: a dataplane whose hello arrives in time (in pieces, here)
    is welcomed and keeps being answered long after the hello timeout; a wrong token is
    still refused in the welcome, as before."""
    sched = await start_sched(token=TOKEN, limits=LinkLimits(hello_timeout_s=0.3))
    port = sched.server.link_port
    link_server = sched.server.link
    assert link_server is not None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = RawLink(reader, writer)
        hello = frame(
            pb.LinkHello(dataplane_id="dp1", authorization=bearer(TOKEN)).SerializeToString()
        )
        writer.write(hello[:5])
        await wait_for(lambda: [c.reader.pending for c in link_server.unauthenticated] == [5])
        writer.write(hello[5:])
        assert (await link.welcome()).refused is False
        # A connection opened after the welcome and silent since: once the scheduler has
        # closed it, the hello timeout has passed for the welcomed one too.
        silent, silent_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_scheduler(silent) == b""
        silent_writer.close()
        link.send(pb.LinkUp(admit=[admit_req("t1", "r1")]))
        assert (await link.down()).answers[0].response.WhichOneof("outcome") == "admitted"
        wrong = await RawLink.open(port, auth=bearer("other"))
        welcome = await wrong.welcome()
        assert welcome.refused and "bearer token" in welcome.message
        assert await wrong.next() is None
        link.close()
    finally:
        await sched.close()


async def test_past_the_unauthenticated_limit_a_new_connection_is_closed_at_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X2 on the Link port: while ``max_unauthenticated`` connections wait for their
    hello, each new one is closed at once (one warning for the lot); a welcomed
    dataplane is not counted and keeps being answered, over the raw link and through
    the dataplane's own ``SchedulerLink``; a freed place takes a new connection."""
    from luftpause.scheduler.service import tcp_link

    monkeypatch.setattr(tcp_link, "REFUSAL_LOG_EVERY_S", 3600.0)
    sched = await start_sched(
        token=TOKEN, limits=LinkLimits(hello_timeout_s=60.0, max_unauthenticated=2)
    )
    port = sched.server.link_port
    link_server = sched.server.link
    assert link_server is not None
    dataplane = SchedulerLink(sched.grpc, "dp2", RunTable(time.monotonic, 60), 0.05, token=TOKEN)
    task = await _linked(dataplane)
    try:
        assert dataplane.transport == "tcp"
        welcomed = await RawLink.open(port, auth=bearer(TOKEN))
        assert (await welcomed.welcome()).refused is False
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await wait_for(lambda: len(link_server.unauthenticated) == 2)
        with caplog.at_level(logging.WARNING, logger="luftpause.scheduler.link"):
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert await closed_by_scheduler(reader) == b""
                writer.close()
        refusals = [r for r in caplog.records if "at once" in r.getMessage()]
        assert len(refusals) == 1 and "link_max_unauthenticated" in refusals[0].getMessage()
        assert len(link_server.unauthenticated) == 2
        welcomed.send(pb.LinkUp(admit=[admit_req("t1", "r1")]))
        assert (await welcomed.down()).answers[0].response.WhichOneof("outcome") == "admitted"
        assert isinstance(
            await asyncio.wait_for(dataplane.admit(admit_req("t2", "r2")), 5), Admitted
        )
        assert dataplane.transport == "tcp"
        # A dataplane that comes while the place is full is turned away: it uses the rpc.
        turned_away = SchedulerLink(
            sched.grpc, "dp3", RunTable(time.monotonic, 60), 0.05, token=TOKEN
        )
        other = await _linked(turned_away)
        try:
            assert turned_away.transport == "grpc"
            outcome = await asyncio.wait_for(turned_away.admit(admit_req("t3", "r3")), 5)
            assert isinstance(outcome, Admitted)
        finally:
            await _done(turned_away, other)
        silent[0][1].close()  # a place frees up: a dataplane may say hello again
        await wait_for(lambda: len(link_server.unauthenticated) == 1)
        late = await RawLink.open(port, auth=bearer(TOKEN))
        assert (await late.welcome()).refused is False
        late.close()
        welcomed.close()
        silent[1][1].close()
    finally:
        await _done(dataplane, task)
        await sched.close()


async def test_the_grpc_port_closes_a_connection_that_does_not_finish_its_handshake() -> None:
    """X2 on the gRPC port: the token is checked per call, but a connection that sends
    nothing, or half the HTTP/2 client preface, is closed after the hello timeout (grpc's
    own default is a minute); gRPC calls go on being served."""
    sched = await start_sched(token=TOKEN, limits=LinkLimits(hello_timeout_s=0.3))
    try:
        for sent in (b"", b"PRI * HTTP/2.0\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", sched.server.port)
            writer.write(sent)
            await closed_by_scheduler(reader)  # grpc may first say why, in a GOAWAY
            writer.close()
        async with grpc.aio.insecure_channel(sched.grpc) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            served = await asyncio.wait_for(health.Check(health_pb2.HealthCheckRequest()), 5)
            assert served.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await sched.close()


async def _linked(link: SchedulerLink) -> asyncio.Task[None]:
    task = asyncio.create_task(link.maintain())
    await asyncio.wait_for(link.ready.wait(), 5)
    return task


async def _done(link: SchedulerLink, task: asyncio.Task[None]) -> None:
    await link.close(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_dataplane_uses_tcp_where_offered_and_the_rpc_otherwise() -> None:
    """The dataplane's link takes the Link over TCP when the resync names a port, and
    the Link rpc when the scheduler offers none or the dataplane is told not to; turns
    are admitted either way."""
    for link_port, use_tcp, expected in (
        (0, True, "tcp"),
        (None, True, "grpc"),
        (0, False, "grpc"),
    ):
        sched = await start_sched(link_port=link_port)
        link = SchedulerLink(
            sched.grpc, "dp1", RunTable(time.monotonic, 60), 0.05, tcp_link=use_tcp
        )
        task = await _linked(link)
        try:
            assert link.transport == expected
            outcome = await asyncio.wait_for(link.admit(admit_req("t1", "r1")), 5)
            assert isinstance(outcome, Admitted) and outcome.replica in URLS
        finally:
            await _done(link, task)
            await sched.close()


async def test_an_unreachable_tcp_port_falls_back_to_the_rpc(
    sched: Sched, caplog: pytest.LogCaptureFixture
) -> None:
    """A scheduler whose advertised port cannot be reached (a proxy forwarding only the
    gRPC port): the dataplane says so and uses the rpc; turns are admitted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    assert sched.server.link is not None
    sched.server.link.servicer.link_port = closed_port  # advertise a port nobody serves
    link = SchedulerLink(sched.grpc, "dp1", RunTable(time.monotonic, 60), 0.05)
    with caplog.at_level(logging.WARNING, logger="luftpause.dataplane.scheduler"):
        task = await _linked(link)
    try:
        assert link.transport == "grpc"
        assert f"Link over TCP at 127.0.0.1:{closed_port} cannot be reached" in caplog.text
        assert isinstance(await asyncio.wait_for(link.admit(admit_req("t1", "r1")), 5), Admitted)
    finally:
        await _done(link, task)


async def test_a_held_admission_survives_a_scheduler_restart_over_tcp() -> None:
    """D6 over TCP: a turn waiting for admission when the scheduler stops is asked again,
    with the same turn ID, of the scheduler that comes back on the same gRPC address
    (its Link on a new port, learnt on resync)."""
    sched = await start_sched()
    await sched.probe("a", 1, 1)
    await sched.probe("b", 1, 1)
    address = sched.grpc
    link = SchedulerLink(address, "dp1", RunTable(time.monotonic, 60), 0.05)
    task = await _linked(link)
    try:
        assert isinstance(await link.admit(admit_req("t1", "r1")), Admitted)
        assert isinstance(await link.admit(admit_req("t2", "r2")), Admitted)
        held = asyncio.create_task(link.admit(admit_req("t3", "r3")))
        await wait_for(lambda: "t3" in sched.host.state.held)
        await sched.close()
        port = int(address.rsplit(":", 1)[1])
        host = Host(initial_state(SPECS, Params(), time.monotonic()), time.monotonic)
        writer = asyncio.create_task(host.run())
        server = await start_grpc(host, URLS, f"127.0.0.1:{port}")
        sched = Sched(host, server, writer)
        for name in ("a", "b"):
            await sched.probe(name, None, None)
        outcome = await asyncio.wait_for(held, 10)
        assert isinstance(outcome, Admitted)
        assert link.transport == "tcp"
    finally:
        await _done(link, task)
        await sched.close()


async def test_drain_applies_what_is_queued_once_in_order_from_the_caller() -> None:
    """S1: ``Host.drain`` (the Link over TCP deciding inside its callback) applies the
    queued events in order, at once; the writer task finds them gone and applies
    nothing twice."""
    host = Host(initial_state(SPECS, Params(), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    try:
        for name in ("a", "b"):
            await host.apply(lambda at, n=name: ReplicaProbed(at=at, replica=n, healthy=True))
        answers: list[str] = []
        for turn in ("t1", "t2"):
            req = admit_req(turn, f"r-{turn}")
            host.request(
                turn,
                lambda at, r=req: convert.turn_requested(r, at),
                lambda outcome, t=turn: answers.append(t),
            )
        assert answers == []  # queued, not yet applied
        host.drain()
        assert answers == ["t1", "t2"]
        assert set(host.state.turns) == {"t1", "t2"}
        await asyncio.sleep(0.05)  # the writer runs: nothing is left for it
        assert answers == ["t1", "t2"] and host.counters["admitted"] == 2
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


class _Transport:
    """A transport that records what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True


async def test_frames_written_in_one_pass_go_out_first_alone_then_together() -> None:
    """D4, D5 (admission requests and reports over the Link): the dataplane's first LinkUp frame
    of a pass of the event loop is sent at once; frames written after it in the same pass
    go in one write at the pass's end, in order; ending the stream or closing sends what
    waits first, and nothing is written once the transport is closing."""
    from luftpause.dataplane.tcp_link import TcpLinkCall

    transport = _Transport()
    call = TcpLinkCall(None, transport, "test")  # type: ignore[arg-type]
    ups = [pb.LinkUp(abandoned=[f"t{i}"]) for i in range(4)]
    frames = [frame(u.SerializeToString()) for u in ups]
    for up in ups[:3]:
        call.write_nowait(up)
    assert transport.writes == [frames[0]]  # the first at once
    await asyncio.sleep(0)
    assert transport.writes == [frames[0], frames[1] + frames[2]]
    reader = FrameReader()
    got = [pb.LinkUp.FromString(m) for w in transport.writes for m in reader.feed(w)]
    assert [u.abandoned[0] for u in got] == ["t0", "t1", "t2"]
    call.write_nowait(ups[3])  # a new pass: at once again
    assert transport.writes[-1] == frames[3]
    await asyncio.sleep(0)
    call.write_nowait(ups[1])
    call.write_nowait(ups[2])
    await call.done_writing()
    assert transport.writes[-2:] == [frames[1], frames[2]] and transport.eof
    await asyncio.sleep(0)
    call.write_nowait(ups[0])
    call.write_nowait(ups[1])
    call.close()
    assert transport.writes[-2:] == [frames[0], frames[1]] and transport.closed
    sent = len(transport.writes)
    call.write_nowait(ups[2])
    await asyncio.sleep(0)
    assert len(transport.writes) == sent
