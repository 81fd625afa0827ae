"""One Link stream's admissions, whatever carries it: the Link rpc or the Link over TCP."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.scheduler.core import Admit as Admitted
from luftpause.scheduler.core import Reject
from luftpause.scheduler.service import convert, tracing
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.quotas import OverQuota

log = logging.getLogger("luftpause.scheduler.grpc")


class Servicer(Protocol):
    """What a Link stream needs of the servicer it belongs to
    (``grpc_server.SchedulerServicer``), named here so that the Link's modules need
    not import the gRPC server that builds them."""

    host: Host

    def _accept(self, events: Iterable[pb.TurnEvent]) -> int: ...

    def _join_known_run(self, request: pb.AdmitRequest) -> None: ...

    def _response(
        self, request: pb.AdmitRequest, outcome: Admitted | Reject | OverQuota
    ) -> pb.AdmitResponse: ...

    def stream_opened(self, dataplane_id: str) -> None: ...

    def stream_closed(self, dataplane_id: str) -> None: ...


class LinkSession:
    """One Link stream's admissions, whatever carries it (the Link rpc, or the Link over
    plain TCP): each admission request is asked of the writer, and its answer handed to
    ``send`` as soon as it is decided. Abandoning a turn, or closing the session (the
    stream ended), withdraws its request, exactly as cancelling an Admit call does.
    ``fail`` is called if an answer cannot be built (logged): the stream must end."""

    def __init__(
        self,
        servicer: Servicer,
        send: Callable[[pb.AdmitAnswer], None],
        fail: Callable[[], None],
    ) -> None:
        self.servicer = servicer
        self.send = send
        self.fail = fail
        self.waiting: dict[str, Callable[[], None]] = {}  # turn ID -> abandon its request

    def up(self, up: pb.LinkUp) -> None:
        """Apply one LinkUp: reports, then abandoned turns, then admission requests."""
        self.servicer._accept(up.events)
        for turn_id in up.abandoned:
            abandon = self.waiting.pop(turn_id, None)
            if abandon is not None:
                abandon()
        for request in up.admit:
            if request.turn_id not in self.waiting:  # asked twice: one answer is enough
                self._ask(request)

    def _ask(self, request: pb.AdmitRequest) -> None:
        servicer = self.servicer
        servicer._join_known_run(request)
        span = tracing.start_admit(request)

        def answer(outcome: Admitted | Reject | OverQuota) -> None:
            self.waiting.pop(request.turn_id, None)
            try:
                tracing.decided(span, outcome)
                span.end()
                response = servicer._response(request, outcome)
            except Exception:
                log.exception("answering turn %s failed", request.turn_id)
                self.fail()
                return
            self.send(pb.AdmitAnswer(turn_id=request.turn_id, response=response))

        self.waiting[request.turn_id] = servicer.host.request(
            request.turn_id, lambda at: convert.turn_requested(request, at), answer
        )

    def close(self) -> None:
        """The stream ended: turns still waiting on it are abandoned."""
        waiting, self.waiting = self.waiting, {}
        for abandon in waiting.values():
            abandon()
