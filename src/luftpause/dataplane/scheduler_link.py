"""The dataplane's connection to the scheduler: Admit, Report, RunEnded, Resync.

One background task keeps the link: on every (re)connect it first sends a
Resync built from the run table (runs and admitted turns), then opens the
Report stream and feeds it from a queue. When the stream breaks (scheduler
killed or restarted) it waits ``reconnect_s`` and starts over. Events queued
before a resync are dropped: the resync already carries their effect.

``admit`` never gives up on its own while the scheduler is unreachable: it
waits for the link to be resynced and retries each ``reconnect_s`` with the
same turn ID, exactly like a held turn (D6). Cancelling it (the client left)
cancels the Admit call, which the scheduler reads as an abandoned turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.auth import bearer
from luftpause.dataplane.runs import GENERATING, PAUSED_ON_TOOL, RunTable

log = logging.getLogger("luftpause.dataplane.scheduler")

_CLASS = {"interactive": pb.SERVICE_CLASS_INTERACTIVE, "batch": pb.SERVICE_CLASS_BATCH}
_PHASE = {
    GENERATING: pb.RUN_PHASE_GENERATING,
    PAUSED_ON_TOOL: pb.RUN_PHASE_PAUSED_ON_TOOL,
}
_STOP = object()
# HTTP/2 keepalive towards the scheduler (which allows a ping every 5 s): a scheduler
# that vanished without closing the connection is noticed, and the link rebuilt.
_KEEPALIVE = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
# Names this dataplane on its report stream, so that a scheduler can release the turns
# of a dataplane whose stream ended and never came back (S11).
DATAPLANE_ID_KEY = "luftpause-dataplane-id"


@dataclass(frozen=True)
class Admitted:
    replica: str
    url: str
    held_s: float
    run_id: str = ""  # the run the scheduler admitted the turn under ("" = as asked)


@dataclass(frozen=True)
class Rejected:
    unknown_model: bool
    message: str


class SchedulerLink:
    def __init__(
        self,
        address: str,
        dataplane_id: str,
        runs: RunTable,
        reconnect_s: float = 1.0,
        token: str | None = None,
    ) -> None:
        self.address = address
        self.dataplane_id = dataplane_id
        self.runs = runs
        self.reconnect_s = reconnect_s
        # X2: every call carries the stack's token, which the scheduler checks.
        self.channel = grpc.aio.insecure_channel(
            address, options=_KEEPALIVE, interceptors=_with_token(token)
        )
        self.stub = pb_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.ready = asyncio.Event()  # resynced and reporting
        self._queue: asyncio.Queue[pb.TurnEvent | object] = asyncio.Queue()
        self._report_call: grpc.aio.StreamUnaryCall | None = None
        self._pending_run_ends: set[str] = set()
        self._resetting = False
        # Reports are queued from the snapshot on, until the link breaks (then the next
        # snapshot covers them). Whenever ``ready`` is set, so is this.
        self._reporting = False
        self._link_up = asyncio.Event()  # replaced after each connect: a generation signal
        self.connects = 0
        self.on_state_change: Callable[[bool], None] = lambda up: None

    # ------------------------------------------------------------- keep-alive

    async def maintain(self) -> None:
        """Forever: resync, then report; on any break pause and start over."""
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
            except Exception:
                log.exception("scheduler link failed; reconnecting")
            self._reporting = False
            if self.ready.is_set():
                self.ready.clear()
                self.on_state_change(False)
            await asyncio.sleep(self.reconnect_s)

    async def _connect_once(self) -> None:
        # Anything queued so far is described by the snapshot we are about to send, so
        # each connection gets a fresh queue. The old one gets a stop: the broken stream's
        # request iterator may still be running, and must not take this link's reports.
        # From the snapshot on, reports are queued again: a turn listed in it that ends
        # while the resync is on its way must still be reported once the stream opens.
        old, self._queue = self._queue, asyncio.Queue()
        old.put_nowait(_STOP)
        snapshot = self.snapshot()
        self._reporting = True
        await self.stub.Resync(snapshot, timeout=10.0, wait_for_ready=False)
        for run_id in sorted(self._pending_run_ends):
            await self.stub.RunEnded(pb.RunEndedRequest(run_id=run_id), timeout=10.0)
        self._pending_run_ends.clear()
        self.connects += 1
        log.info(
            "scheduler link up (%s): resynced %d runs, %d in-flight turns",
            self.address,
            len(snapshot.runs),
            len(snapshot.in_flight),
        )
        self.ready.set()
        self.on_state_change(True)
        up, self._link_up = self._link_up, asyncio.Event()
        up.set()
        call = self.stub.Report(
            self._events(self._queue), metadata=((DATAPLANE_ID_KEY, self.dataplane_id),)
        )
        self._report_call = call
        try:
            await call
        except asyncio.CancelledError:
            if not self._resetting:
                raise
            log.warning("scheduler link reset after a failed admit; resyncing")
        finally:
            self._resetting = False
            self._report_call = None

    @staticmethod
    async def _events(
        queue: asyncio.Queue[pb.TurnEvent | object],
    ) -> AsyncIterator[pb.ReportBatch]:
        """One write per batch: everything queued since the last write goes together."""
        while True:
            batch = pb.ReportBatch()
            item = await queue.get()
            while True:
                if item is _STOP:
                    if batch.events:
                        yield batch
                    return
                assert isinstance(item, pb.TurnEvent)
                batch.events.append(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            yield batch

    def snapshot(self) -> pb.ResyncRequest:
        req = pb.ResyncRequest(dataplane_id=self.dataplane_id)
        for run in self.runs.runs.values():
            req.runs.append(
                pb.RunSnapshot(
                    run_id=run.run_id,
                    last_replica=run.replica or "",
                    phase=_PHASE.get(run.phase, pb.RUN_PHASE_IDLE),
                    service_class=_CLASS[run.service_class],
                    caller=run.caller,
                )
            )
        for turn in self.runs.turns.values():
            req.in_flight.append(
                pb.TurnSnapshot(
                    turn_id=turn.turn_id,
                    run_id=turn.run_id,
                    replica=turn.replica,
                    model=turn.model,
                    service_class=_CLASS[turn.service_class],
                    caller=turn.caller,
                    started=turn.started,
                )
            )
        return req

    def _link_broken(self) -> None:
        """Force a reconnect (and so a resync) after a failed Admit."""
        call = self._report_call
        if call is not None and not self._resetting:
            self._resetting = True
            call.cancel()

    async def _wait_for_new_link(self, generation: int) -> None:
        while self.connects == generation:
            await self._link_up.wait()
        await self.ready.wait()

    # -------------------------------------------------------------- requests

    async def admit(self, req: pb.AdmitRequest) -> Admitted | Rejected:
        req.dataplane_id = self.dataplane_id
        while True:
            await self.ready.wait()
            generation = self.connects
            try:
                resp: pb.AdmitResponse = await self.stub.Admit(req)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.CANCELLED:
                    raise asyncio.CancelledError from exc
                log.warning(
                    "admit %s failed (%s); retrying with the same turn ID once resynced",
                    req.turn_id,
                    exc.code().name,
                )
                self._link_broken()
                await asyncio.sleep(self.reconnect_s)
                await self._wait_for_new_link(generation)
                continue
            if resp.WhichOneof("outcome") == "admitted":
                a = resp.admitted
                return Admitted(a.replica, a.url, a.held_s, a.run_id)
            r = resp.rejected
            return Rejected(r.code == pb.REJECT_CODE_UNKNOWN_MODEL, r.message)

    def report(self, event: pb.TurnEvent) -> None:
        """Queue a turn event; dropped while the link is down and no resync is on its way
        (the next resync's snapshot covers it)."""
        if self._reporting:
            event.dataplane_id = self.dataplane_id
            self._queue.put_nowait(event)

    async def run_ended(self, run_id: str) -> None:
        if not self.ready.is_set():
            self._pending_run_ends.add(run_id)
            return
        try:
            await self.stub.RunEnded(pb.RunEndedRequest(run_id=run_id), timeout=5.0)
        except grpc.aio.AioRpcError:
            self._pending_run_ends.add(run_id)

    async def close(self, flush_s: float = 2.0) -> None:
        """End the link: reports already queued are written first (for up to ``flush_s``),
        so a dataplane that stops does not leave its last turns counted."""
        self._queue.put_nowait(_STOP)
        call = self._report_call
        if call is not None and not call.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(call), flush_s)
        await self.channel.close()


class _Metadata:
    """Adds ``authorization: Bearer <token>`` to a call's metadata."""

    def __init__(self, token: str) -> None:
        self.pair = ("authorization", bearer(token))

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self.pair)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials,
            details.wait_for_ready,
        )  # fmt: skip


class _UnaryToken(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self.details(client_call_details), request)


class _StreamToken(_Metadata, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self.details(client_call_details), request_iterator)


def _with_token(token: str | None) -> list[grpc.aio.ClientInterceptor] | None:
    return [_UnaryToken(token), _StreamToken(token)] if token else None
