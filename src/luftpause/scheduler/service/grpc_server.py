"""The gRPC face of the scheduler: Link, Resync, RunEnded, Admit, Report, plus grpc.health.v1.

A dataplane uses Resync, then Link (admission and reports on one stream, see the
.proto), and RunEnded. Admit and Report do what Link does one call at a time.

With a token (``LUFTPAUSE_TOKEN``), every Scheduler call must carry it as
``authorization: Bearer <token>`` metadata (X2); a call without it ends with
``UNAUTHENTICATED`` before it reaches the servicer. The health service stays open,
as ``/health`` does on every HTTP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.auth import REFUSED, bearer_ok
from luftpause.scheduler.core import (
    Admit as Admitted,
)
from luftpause.scheduler.core import (
    DataplaneConnected,
    DataplaneDisconnected,
    Event,
    Reject,
    RunEnded,
)
from luftpause.scheduler.service import convert, tracing
from luftpause.scheduler.service.host import Host, Stamp
from luftpause.scheduler.service.link_session import LinkSession
from luftpause.scheduler.service.quotas import OverQuota
from luftpause.scheduler.service.tcp_link import DEFAULT_LIMITS, LinkLimits, TcpLink
from luftpause.tool_calls import ToolCallMemory

log = logging.getLogger("luftpause.scheduler.grpc")

SERVICE_NAME = "luftpause.scheduler.v1.Scheduler"
TOOL_CALL_MEMORY_S = 1800.0  # as the dataplane's tool_call_id_memory_s default
TOOL_CALL_SWEEP_S = 60.0
# Report-stream metadata naming the dataplane, so the scheduler knows whose stream ended.
DATAPLANE_ID_KEY = "luftpause-dataplane-id"
# HTTP/2 keepalive: a dataplane whose host vanished without closing its connection is
# found within ~15 s (its report stream then ends, S11). Dataplanes ping every 10 s.
KEEPALIVE_SERVER = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
)


class SchedulerServicer(pb_grpc.SchedulerServicer):
    def __init__(
        self, host: Host, urls: Mapping[str, str], tool_calls: ToolCallMemory | None = None
    ) -> None:
        self.host = host
        self.urls = urls
        self._streams: Counter[str] = Counter()  # open report streams per dataplane
        # Every dataplane's tool calls -> their runs (D2 across dataplanes and restarts).
        self.tool_calls = tool_calls or ToolCallMemory(host.clock, TOOL_CALL_MEMORY_S)
        self._swept_at = host.clock()
        self.link_port = 0  # the Link over TCP, advertised in ResyncResponse (0: none)

    async def Admit(self, request: pb.AdmitRequest, context: Any) -> pb.AdmitResponse:
        return await self._answer(request)

    async def _answer(self, request: pb.AdmitRequest) -> pb.AdmitResponse:
        """Wait until the turn is admitted or rejected."""
        self._join_known_run(request)
        with tracing.admit_span(request) as span:
            outcome = await self.host.admit(
                request.turn_id, lambda at: convert.turn_requested(request, at)
            )
            tracing.decided(span, outcome)
        return self._response(request, outcome)

    def _join_known_run(self, request: pb.AdmitRequest) -> None:
        """A turn echoing a tool call the scheduler knows continues that call's run (D2)."""
        if request.echoed_tool_call_ids:
            known = self.tool_calls.lookup(request.echoed_tool_call_ids)
            if known is not None:
                request.run_id = known

    def _response(
        self, request: pb.AdmitRequest, outcome: Admitted | Reject | OverQuota
    ) -> pb.AdmitResponse:
        url = self.urls.get(getattr(outcome, "replica", ""), "")
        response = convert.admit_response(outcome, url)
        if response.WhichOneof("outcome") == "admitted":
            response.admitted.run_id = request.run_id
        return response

    def _remember_tool_calls(self, msg: pb.TurnEvent) -> None:
        if msg.WhichOneof("event") != "finished" or not msg.finished.tool_call_ids:
            return
        self.tool_calls.remember(msg.finished.tool_call_ids, msg.run_id)
        now = self.host.clock()
        if now - self._swept_at >= TOOL_CALL_SWEEP_S:
            self._swept_at = now
            self.tool_calls.sweep()

    def _accept(self, events: Iterable[pb.TurnEvent]) -> int:
        """Queue reported events for the writer, in order; returns how many were usable."""
        accepted = 0
        for msg in events:
            self._remember_tool_calls(msg)
            stamp = _report_stamp(msg)
            if stamp is not None:
                self.host.post(stamp)
                accepted += 1
        return accepted

    def stream_opened(self, dataplane_id: str) -> None:
        """A report stream of ``dataplane_id`` (Report, Link, or the Link over TCP) opened."""
        if dataplane_id:
            self._streams[dataplane_id] += 1
            if self._streams[dataplane_id] == 1:
                self.host.post(lambda at: DataplaneConnected(at=at, dataplane_id=dataplane_id))

    def stream_closed(self, dataplane_id: str) -> None:
        """It ended (the dataplane closed it, died, or the link broke): once its last
        stream is gone its turns are released unless it comes back (S11)."""
        if dataplane_id:
            self._streams[dataplane_id] -= 1
            if self._streams[dataplane_id] <= 0:
                del self._streams[dataplane_id]
                log.info("dataplane %s stopped reporting", dataplane_id)
                self.host.post(lambda at: DataplaneDisconnected(at=at, dataplane_id=dataplane_id))

    @contextlib.contextmanager
    def _stream_of(self, dataplane_id: str) -> Iterator[None]:
        """A dataplane's report stream is open for the ``with`` body."""
        self.stream_opened(dataplane_id)
        try:
            yield
        finally:
            self.stream_closed(dataplane_id)

    async def Report(
        self, request_iterator: AsyncIterator[pb.ReportBatch], context: Any
    ) -> pb.ReportSummary:
        accepted = 0
        with self._stream_of(_metadata(context, DATAPLANE_ID_KEY)):
            async for batch in request_iterator:
                accepted += self._accept(batch.events)
        return pb.ReportSummary(accepted=accepted)

    async def Link(self, request_iterator: AsyncIterator[pb.LinkUp], context: Any) -> None:
        """Reports and admissions on one stream (see the .proto). Each admission request
        is answered by the writer as soon as it is decided; answers go out with whatever
        else was decided since the last write."""
        out: asyncio.Queue[pb.AdmitAnswer | _Ended] = asyncio.Queue()
        session = LinkSession(self, out.put_nowait, lambda: out.put_nowait(_Ended(failed=True)))

        async def read() -> None:
            try:
                async for up in request_iterator:
                    session.up(up)
            finally:
                out.put_nowait(_Ended(failed=False))

        with self._stream_of(_metadata(context, DATAPLANE_ID_KEY)):
            reader = asyncio.create_task(read())
            try:
                ended: _Ended | None = None
                while ended is None:
                    answers: list[pb.AdmitAnswer] = []
                    item = await out.get()
                    while True:
                        if isinstance(item, _Ended):
                            ended = item
                            break
                        answers.append(item)
                        if out.empty():
                            break
                        item = out.get_nowait()
                    if answers:
                        await context.write(pb.LinkDown(answers=answers))
                if ended.failed:
                    await context.abort(grpc.StatusCode.INTERNAL, "the scheduler failed (logged)")
            finally:
                # Nothing here may wait before the turns are abandoned: gRPC cancels this
                # handler when the client goes, and that can land while the end of the
                # stream is being handled here, cutting a wait short.
                reader.cancel()  # it applies nothing more once cancelled
                session.close()  # turns still held for this stream: abandoned
                await asyncio.gather(reader, return_exceptions=True)

    async def RunEnded(self, request: pb.RunEndedRequest, context: Any) -> pb.RunEndedResponse:
        run_id = request.run_id
        await self.host.apply(lambda at: RunEnded(at=at, run_id=run_id))
        return pb.RunEndedResponse()

    async def Resync(self, request: pb.ResyncRequest, context: Any) -> pb.ResyncResponse:
        await self.host.apply(lambda at: convert.resynced(request, at))
        dataplane_id = request.dataplane_id
        if dataplane_id and not self._streams.get(dataplane_id):
            # Its report stream opens next; if it never does (the dataplane died right
            # after the resync), the grace runs from here.
            self.host.post(lambda at: DataplaneDisconnected(at=at, dataplane_id=dataplane_id))
        log.info(
            "dataplane %s resynced: %d runs, %d in-flight turns",
            request.dataplane_id or "(unnamed)",
            len(request.runs),
            len(request.in_flight),
        )
        return pb.ResyncResponse(
            runs=len(request.runs), turns=len(request.in_flight), link_port=self.link_port
        )


@dataclass(frozen=True)
class _Ended:
    """The end of a Link's answers: its reader finished, or an admission failed."""

    failed: bool


def _metadata(context: Any, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return ""


def _report_stamp(msg: pb.TurnEvent) -> Stamp | None:
    """A report as a stamp for the writer; None for an empty or unknown message."""
    if convert.turn_event(msg, 0.0) is None:
        return None

    def stamp(at: float) -> Event:
        event = convert.turn_event(msg, at)
        assert event is not None
        return event

    return stamp


class TokenCheck(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """X2: Scheduler calls need ``authorization: Bearer <token>`` metadata."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        given = next(
            (v for k, v in details.invocation_metadata or () if k == "authorization"), None
        )
        if bearer_ok(given, self.token):
            return handler
        return _refuse(handler)


def _refuse(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape that ends the call with ``UNAUTHENTICATED``."""
    message = f"the scheduler refused this call: {REFUSED}"

    async def unary(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}  # fmt: skip
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kinds)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **kinds)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(unary, **kinds)
    return grpc.stream_stream_rpc_method_handler(unary, **kinds)


@dataclass
class SchedulerServer:
    """The scheduler's listeners for dataplanes: gRPC, and the Link over TCP."""

    grpc: grpc.aio.Server
    port: int
    link: TcpLink | None = None

    @property
    def link_port(self) -> int:
        return self.link.port if self.link is not None else 0

    async def stop(self, grace: float) -> None:
        if self.link is not None:
            self.link.close()
        await self.grpc.stop(grace=grace)


async def start_grpc(
    host: Host,
    urls: Mapping[str, str],
    address: str,
    token: str | None = None,
    tool_call_memory_s: float = TOOL_CALL_MEMORY_S,
    link_port: int | None = 0,
    link_limits: LinkLimits = DEFAULT_LIMITS,
) -> SchedulerServer:
    """Start the gRPC server on ``address`` (port 0 picks one) and, unless ``link_port``
    is None, the Link over TCP on the same host at ``link_port`` (0 picks one; its port
    is advertised to dataplanes in ResyncResponse), its connections not yet welcomed
    bounded by ``link_limits`` (whose hello timeout also bounds the gRPC port's HTTP/2
    handshake). With ``token``, every Scheduler call and Link connection must carry it
    (X2). Tool call IDs are remembered ``tool_call_memory_s`` (the dataplane's
    ``tool_call_id_memory_s``)."""
    # The token is checked per call, so the gRPC port cannot tell a dataplane's channel
    # from anyone else's until a call comes; but a connection that has not finished the
    # HTTP/2 handshake (the client preface) within the Link's hello timeout is closed
    # (grpc core's own default: about 60 s, measured).
    handshake = ("grpc.server_handshake_timeout_ms", round(link_limits.hello_timeout_s * 1000))
    server = grpc.aio.server(
        options=(*KEEPALIVE_SERVER, handshake),
        interceptors=[TokenCheck(token)] if token else None,
    )
    servicer = SchedulerServicer(host, urls, ToolCallMemory(host.clock, tool_call_memory_s))
    pb_grpc.add_SchedulerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise SystemExit(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise SystemExit(f"cannot listen on {address}: address in use or unavailable")
    listeners = SchedulerServer(server, port)
    if link_port is not None:
        listen_host = address.rsplit(":", 1)[0].strip("[]")
        listeners.link = TcpLink(servicer, token, link_limits)
        servicer.link_port = await listeners.link.start(listen_host, link_port)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    return listeners
