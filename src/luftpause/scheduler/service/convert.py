"""The one place that converts between protobuf messages and core types."""

from __future__ import annotations

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.scheduler.core import (
    Admit,
    DataplaneResynced,
    EndpointKind,
    FirstTokenReceived,
    Reject,
    RejectCode,
    RunPhase,
    RunSnapshot,
    ServiceClass,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnSnapshot,
    TurnStarted,
)
from luftpause.scheduler.core.leases import MAX_PAUSE_TOOLS, MAX_TOOL_NAME
from luftpause.scheduler.service.quotas import OverQuota
from luftpause.telemetry import trace_id_of

_CLASS_FROM_PB: dict[int, ServiceClass] = {
    pb.SERVICE_CLASS_UNSPECIFIED: ServiceClass.BATCH,
    pb.SERVICE_CLASS_BATCH: ServiceClass.BATCH,
    pb.SERVICE_CLASS_INTERACTIVE: ServiceClass.INTERACTIVE,
}
_KIND_FROM_PB: dict[int, EndpointKind] = {
    pb.ENDPOINT_KIND_UNSPECIFIED: EndpointKind.GENERATIVE,
    pb.ENDPOINT_KIND_GENERATIVE: EndpointKind.GENERATIVE,
    pb.ENDPOINT_KIND_SINGLE_PASS: EndpointKind.SINGLE_PASS,
}
_PHASE_FROM_PB: dict[int, RunPhase] = {
    pb.RUN_PHASE_UNSPECIFIED: RunPhase.IDLE,
    pb.RUN_PHASE_IDLE: RunPhase.IDLE,
    pb.RUN_PHASE_GENERATING: RunPhase.GENERATING,
    pb.RUN_PHASE_PAUSED_ON_TOOL: RunPhase.PAUSED_ON_TOOL,
}
_REJECT_TO_PB: dict[RejectCode, pb.RejectCode] = {
    RejectCode.UNKNOWN_MODEL: pb.REJECT_CODE_UNKNOWN_MODEL,
    RejectCode.INVALID_REQUEST: pb.REJECT_CODE_INVALID_REQUEST,
}


def service_class(value: int) -> ServiceClass:
    # Unknown enum numbers from a newer peer read as batch, never as an error.
    return _CLASS_FROM_PB.get(value, ServiceClass.BATCH)


def turn_requested(req: pb.AdmitRequest, at: float) -> TurnRequested:
    return TurnRequested(
        at=at,
        turn_id=req.turn_id,
        run_id=req.run_id,
        model=req.model,
        service_class=service_class(req.service_class),
        caller=req.caller,
        kind=_KIND_FROM_PB.get(req.kind, EndpointKind.GENERATIVE),
        dataplane_id=req.dataplane_id,
        trace_id=trace_id_of(req.traceparent),
    )


def turn_event(
    msg: pb.TurnEvent, at: float
) -> TurnStarted | FirstTokenReceived | TurnFinished | TurnFailed | None:
    """A report message as a core event; None for an empty or unknown one."""
    which = msg.WhichOneof("event")
    if which == "started":
        return TurnStarted(at=at, turn_id=msg.turn_id)
    if which == "first_token":
        return FirstTokenReceived(at=at, turn_id=msg.turn_id)
    if which == "finished":
        f = msg.finished
        return TurnFinished(
            at=at,
            turn_id=msg.turn_id,
            paused_on_tool=f.paused_on_tool,
            finish_reason=f.finish_reason,
            prompt_tokens=f.usage.prompt_tokens,
            completion_tokens=f.usage.completion_tokens,
            cached_tokens=f.usage.cached_tokens,
            # (bounded here too: a peer may send more than a dataplane does)
            tool_names=tuple(name[:MAX_TOOL_NAME] for name in f.tool_names[:MAX_PAUSE_TOOLS]),
        )
    if which == "failed":
        return TurnFailed(
            at=at,
            turn_id=msg.turn_id,
            reason=msg.failed.reason,
            replica_unreachable=msg.failed.replica_unreachable,
        )
    return None


def resynced(req: pb.ResyncRequest, at: float) -> DataplaneResynced:
    return DataplaneResynced(
        at=at,
        dataplane_id=req.dataplane_id,
        runs=tuple(
            RunSnapshot(
                run_id=r.run_id,
                phase=_PHASE_FROM_PB.get(r.phase, RunPhase.IDLE),
                replica=r.last_replica or None,
                service_class=service_class(r.service_class),
                caller=r.caller,
            )
            for r in req.runs
        ),
        in_flight=tuple(
            TurnSnapshot(
                turn_id=t.turn_id,
                run_id=t.run_id,
                replica=t.replica,
                model=t.model,
                service_class=service_class(t.service_class),
                caller=t.caller,
                started=t.started,
            )
            for t in req.in_flight
        ),
    )


def admit_response(outcome: Admit | Reject | OverQuota, url: str) -> pb.AdmitResponse:
    if isinstance(outcome, Admit):
        return pb.AdmitResponse(
            admitted=pb.Admitted(
                replica=outcome.replica, url=url, held_s=outcome.held_s, retain_s=outcome.retain_s
            )
        )
    if isinstance(outcome, OverQuota):  # B13: the service's refusal, not the core's
        return pb.AdmitResponse(
            rejected=pb.Rejected(
                code=pb.REJECT_CODE_OVER_QUOTA,
                message=outcome.message,
                retry_after_s=outcome.retry_after_s,
                limit=outcome.limit,
            )
        )
    return pb.AdmitResponse(
        rejected=pb.Rejected(code=_REJECT_TO_PB[outcome.code], message=outcome.message)
    )
