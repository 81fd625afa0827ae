"""The dataplane's connection to the scheduler: one Link stream, plus Resync and RunEnded.

One background task keeps the link: on every (re)connect it first sends a
Resync built from the run table (runs and admitted turns), then opens the Link
stream, on which everything else travels. A single writer sends, in one message
per write, whatever accumulated since its last one: turn reports, turns
abandoned while held, and admission requests; a reader resolves the admission
answers the scheduler sends back. When the stream breaks (scheduler killed or
restarted) the link waits ``reconnect_s`` and starts over. Reports queued before
a resync are dropped: the resync already carries their effect.

Where the scheduler offers the Link over plain TCP (its resync answer names a
port), the link uses that instead of the Link rpc (``tcp_link.py``): the same
messages without HTTP/2, and an admission request written from the turn's own
task rather than handed to the writer; if that port cannot be reached from here,
the rpc is used.

Admission requests go out at once. Reports may wait up to ``report_flush_s`` to
share a write with the next ones (or go with the next admission request): they
are bookkeeping, and a write costs more CPU on both sides than the message in it.

``admit`` never gives up on its own while the scheduler is unreachable: a request
still waiting when the link breaks is sent again, with the same turn ID, on the
next link once resynced, exactly like a held turn (D6). Cancelling it (the client
left) tells the scheduler the turn was abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.auth import bearer
from luftpause.dataplane import link_codec
from luftpause.dataplane.link_codec import Admitted, Rejected
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.tcp_link import LinkBroken, LinkRefused, TcpLinkCall

log = logging.getLogger("luftpause.dataplane.scheduler")

# HTTP/2 keepalive towards the scheduler (which allows a ping every 5 s): a scheduler
# that vanished without closing the connection is noticed, and the link rebuilt.
_KEEPALIVE = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
# Names this dataplane on its Link stream, so that a scheduler can release the turns
# of a dataplane whose stream ended and never came back (S11).
DATAPLANE_ID_KEY = "luftpause-dataplane-id"
REPORT_FLUSH_S = 0.005


class SchedulerLink:
    def __init__(
        self,
        address: str,
        dataplane_id: str,
        runs: RunTable,
        reconnect_s: float = 1.0,
        token: str | None = None,
        report_flush_s: float = REPORT_FLUSH_S,
        tcp_link: bool = True,
    ) -> None:
        self.address = address
        self.tcp_link = tcp_link  # use the Link over TCP where the scheduler offers it
        self.transport = ""  # what carries the open link: "tcp", "grpc" ("" while down)
        self.dataplane_id = dataplane_id
        self.runs = runs
        self.reconnect_s = reconnect_s
        self.report_flush_s = report_flush_s
        self.channel = grpc.aio.insecure_channel(address, options=_KEEPALIVE)
        # X2: every call carries the stack's token, which the scheduler checks.
        self._auth: tuple[tuple[str, str], ...] = (
            (("authorization", bearer(token)),) if token else ()
        )
        self.stub = pb_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.ready = asyncio.Event()  # resynced, and the Link stream open
        # Admission requests waiting for their answer, across reconnects.
        self._waiting: dict[str, tuple[pb.AdmitRequest, asyncio.Future[pb.AdmitResponse]]] = {}
        # What the next write carries.
        self._events: list[pb.TurnEvent] = []
        self._abandoned: list[str] = []
        self._admit: list[pb.AdmitRequest] = []
        self._wake = asyncio.Event()  # something is ready to be written
        self._written: list[asyncio.Future[None]] = []  # resolved by the next write
        self._flush: asyncio.TimerHandle | None = None
        self._closing = False
        self._call: grpc.aio.StreamStreamCall | TcpLinkCall | None = None
        self._pending_run_ends: set[str] = set()
        # Reports are queued from the snapshot on, until the link breaks (then the next
        # snapshot covers them). Whenever ``ready`` is set, so is this.
        self._reporting = False
        self.connects = 0
        self.on_state_change: Callable[[bool], None] = lambda up: None

    # ------------------------------------------------------------- keep-alive

    async def maintain(self) -> None:
        """Forever: resync, then link; on any break pause and start over."""
        while True:
            try:
                await self._connect_once()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                    # Turns wait as if held until the tokens agree; say why, every time.
                    log.error(
                        "the scheduler at %s refused this dataplane's token: give both the "
                        "same LUFTPAUSE_TOKEN (%s)",
                        self.address,
                        exc.details(),
                    )
                elif self.ready.is_set():
                    log.warning("scheduler link lost (%s); reconnecting", exc.code().name)
                else:
                    log.debug("scheduler at %s unreachable: %s", self.address, exc.code().name)
            except LinkRefused as exc:
                log.error(
                    "the scheduler at %s refused this dataplane's token on the Link: give both "
                    "the same LUFTPAUSE_TOKEN (%s)",
                    self.address,
                    exc,
                )
            except (LinkBroken, OSError) as exc:
                log.warning("scheduler link lost (%s); reconnecting", exc)
            except Exception:
                log.exception("scheduler link failed; reconnecting")
            self._reporting = False
            self.transport = ""
            if self.ready.is_set():
                self.ready.clear()
                self.on_state_change(False)
            if self._closing:
                return
            await asyncio.sleep(self.reconnect_s)

    async def _connect_once(self) -> None:
        # Anything reported so far is described by the snapshot we are about to send,
        # and turns abandoned so far were held on a stream that is gone (which abandons
        # them), so each link starts empty. From the snapshot on, reports are queued
        # again: a turn listed in it that ends while the resync is on its way must
        # still be reported once the link opens. Requests still waiting go out again.
        self._events.clear()
        self._abandoned.clear()
        snapshot = self.snapshot()
        self._reporting = True
        resynced = await self.stub.Resync(
            snapshot, timeout=10.0, wait_for_ready=False, metadata=self._auth
        )
        # Runs ended while the link was down, and runs ended whose turns are still in
        # flight (the snapshot lists them: a restarted scheduler must hear of the end).
        for run_id in sorted(self._pending_run_ends | set(self.runs.over())):
            await self.stub.RunEnded(
                link_codec.run_ended(run_id), timeout=10.0, metadata=self._auth
            )
        self._pending_run_ends.clear()
        self.connects += 1
        call: grpc.aio.StreamStreamCall | TcpLinkCall | None = None
        if self.tcp_link and resynced.link_port:
            call = await self._open_tcp(resynced.link_port)
        if call is None:
            call = self.stub.Link(metadata=((DATAPLANE_ID_KEY, self.dataplane_id), *self._auth))
        self.transport = "tcp" if isinstance(call, TcpLinkCall) else "grpc"
        log.info(
            "scheduler link up (%s, %s): resynced %d runs, %d in-flight turns",
            self.address,
            f"Link over TCP at {call.where}" if isinstance(call, TcpLinkCall) else "Link rpc",
            len(snapshot.runs),
            len(snapshot.in_flight),
        )
        self._call = call
        self._admit = [request for request, _ in self._waiting.values()]
        self._wake.set()
        self.ready.set()
        self.on_state_change(True)
        writer = asyncio.create_task(self._write(call), name="scheduler-link-writer")
        try:
            if isinstance(call, TcpLinkCall):
                await call.wait_closed()  # answers arrive through _answered meanwhile
                if not self._closing:  # the scheduler stopped or restarted
                    raise LinkBroken("the scheduler closed the connection")
            else:
                async for down in call:
                    self._answered(down)
        finally:
            self._call = None
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if isinstance(call, TcpLinkCall):
                call.close()

    async def _open_tcp(self, port: int) -> TcpLinkCall | None:
        """The Link over TCP on the scheduler's host; None (use the rpc) if it cannot be
        reached from here, e.g. behind a proxy that forwards only the gRPC port."""
        host = self.address.rsplit(":", 1)[0].strip("[]")
        auth = self._auth[0][1] if self._auth else ""
        try:
            return await TcpLinkCall.open(host, port, self.dataplane_id, auth, self._answered)
        except (OSError, TimeoutError, LinkBroken) as exc:
            log.warning(
                "the scheduler's Link over TCP at %s:%d cannot be reached (%s); using the "
                "Link rpc on %s",
                host,
                port,
                exc or type(exc).__name__,
                self.address,
            )
            return None

    def _answered(self, down: pb.LinkDown) -> None:
        for answer in down.answers:
            entry = self._waiting.pop(answer.turn_id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(answer.response)

    async def _write(self, call: grpc.aio.StreamStreamCall | TcpLinkCall) -> None:
        """The one writer of ``call``: each write takes everything queued so far. On
        close it writes what is left and half-closes the stream."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            up = self._take()
            written, self._written = self._written, []
            if up is not None:
                await call.write(up)
            for future in written:
                if not future.done():
                    future.set_result(None)
            if self._closing:
                await call.done_writing()
                return

    def _take(self) -> pb.LinkUp | None:
        """Everything queued, as one LinkUp (None: nothing); the flush timer is off."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not (self._events or self._abandoned or self._admit):
            return None
        up = link_codec.link_up(self._events, self._abandoned, self._admit)
        self._events, self._abandoned, self._admit = [], [], []
        return up

    def snapshot(self) -> pb.ResyncRequest:
        return link_codec.snapshot(self.dataplane_id, self.runs)

    # -------------------------------------------------------------- requests

    async def admit(self, req: pb.AdmitRequest) -> Admitted | Rejected:
        """Ask for admission and wait for the answer, across scheduler restarts."""
        req.dataplane_id = self.dataplane_id
        answer: asyncio.Future[pb.AdmitResponse] = asyncio.get_running_loop().create_future()
        self._waiting[req.turn_id] = (req, answer)
        call = self._call
        if call is not None:  # else it goes out once the next link is up
            self._admit.append(req)
            if isinstance(call, TcpLinkCall) and not self._closing:
                # Written now, from this task, with whatever else is queued (in order).
                up = self._take()
                if up is not None:
                    call.write_nowait(up)
            else:
                self._wake.set()
        try:
            return link_codec.admit_answer(await answer)
        except asyncio.CancelledError:
            if self._waiting.pop(req.turn_id, None) is not None and self._call is not None:
                self._abandoned.append(req.turn_id)
                self._wake.set()
            raise

    def report(self, event: pb.TurnEvent) -> None:
        """Queue a turn event; dropped while the link is down and no resync is on its way
        (the next resync's snapshot covers it)."""
        if not self._reporting:
            return
        event.dataplane_id = self.dataplane_id
        self._events.append(event)
        if self.report_flush_s <= 0:
            self._wake.set()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.report_flush_s, self._wake.set)

    async def run_ended(self, run_id: str) -> None:
        if not self.ready.is_set():
            self._pending_run_ends.add(run_id)
            return
        if self._events:  # the run's last reports go first (the scheduler takes either order)
            written = asyncio.get_running_loop().create_future()
            self._written.append(written)
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(written, 1.0)
        try:
            await self.stub.RunEnded(link_codec.run_ended(run_id), timeout=5.0, metadata=self._auth)
        except grpc.aio.AioRpcError:
            self._pending_run_ends.add(run_id)

    async def close(self, flush_s: float = 2.0) -> None:
        """End the link: reports already queued are written first (for up to ``flush_s``),
        so a dataplane that stops does not leave its last turns counted."""
        self._closing = True
        self._wake.set()
        call = self._call
        if call is not None and not call.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(_ended(call)), flush_s)
        if isinstance(call, TcpLinkCall):
            call.close()
        await self.channel.close()


async def _ended(call: grpc.aio.StreamStreamCall | TcpLinkCall) -> None:
    if isinstance(call, TcpLinkCall):
        await call.wait_closed()
        return
    await call.wait_for_connection()
    await call.code()
