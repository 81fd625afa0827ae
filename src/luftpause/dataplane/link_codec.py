"""The one place the dataplane builds and reads the scheduler's protobuf messages.

Everything the dataplane sends the scheduler (admission requests, turn reports, the
resync snapshot, run ends, the Link's writes and its TCP hello) is built here, and
everything it receives (admission answers, the Link's messages) is read here, into
the dataplane's own values (``Admitted``, ``Rejected``). The scheduler's side of the
same wire is ``scheduler/service/convert.py``; the contract is ``scheduler.proto``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.runs import GENERATING, PAUSED_ON_TOOL, RunTable

_CLASS = {"interactive": pb.SERVICE_CLASS_INTERACTIVE, "batch": pb.SERVICE_CLASS_BATCH}
_PHASE = {
    GENERATING: pb.RUN_PHASE_GENERATING,
    PAUSED_ON_TOOL: pb.RUN_PHASE_PAUSED_ON_TOOL,
}


# ------------------------------------------------------------------ admission


@dataclass(frozen=True)
class Admitted:
    replica: str
    url: str
    held_s: float
    run_id: str = ""  # the run the scheduler admitted the turn under ("" = as asked)
    retain_s: float = 0.0  # B8: how long to ask the engine to keep the prefix (0: no hint)


@dataclass(frozen=True)
class Rejected:
    unknown_model: bool
    message: str
    # B13: the caller's account spent its tokens_per_minute or daily_tokens
    # (REJECT_CODE_OVER_QUOTA): a 429, with Retry-After from retry_after_s
    over_quota: bool = False
    retry_after_s: float = 0.0
    limit: str = ""  # which: "tokens_per_minute" | "daily_tokens"


def admit_request(
    turn_id: str,
    run_id: str,
    model: str,
    service_class: str,
    caller: str,
    *,
    single_pass: bool = False,
    echoed_tool_call_ids: Sequence[str] = (),
    traceparent: str = "",
) -> pb.AdmitRequest:
    """A turn's admission request (``service_class``: "interactive" or "batch")."""
    return pb.AdmitRequest(
        turn_id=turn_id,
        run_id=run_id,
        model=model,
        service_class=_CLASS[service_class],
        caller=caller,
        kind=pb.ENDPOINT_KIND_SINGLE_PASS if single_pass else pb.ENDPOINT_KIND_GENERATIVE,
        echoed_tool_call_ids=echoed_tool_call_ids,
        traceparent=traceparent,
    )


def admit_answer(response: pb.AdmitResponse) -> Admitted | Rejected:
    """The scheduler's answer to an admission request."""
    if response.WhichOneof("outcome") == "admitted":
        a = response.admitted
        return Admitted(a.replica, a.url, a.held_s, a.run_id, a.retain_s)
    r = response.rejected
    return Rejected(
        r.code == pb.REJECT_CODE_UNKNOWN_MODEL,
        r.message,
        over_quota=r.code == pb.REJECT_CODE_OVER_QUOTA,
        retry_after_s=r.retry_after_s if r.code == pb.REJECT_CODE_OVER_QUOTA else 0.0,
        limit=r.limit if r.code == pb.REJECT_CODE_OVER_QUOTA else "",
    )


# --------------------------------------------------------------- turn reports


def started(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, started=pb.TurnStarted())


def first_token(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, first_token=pb.FirstToken())


def finished(
    turn_id: str, run_id: str, outcome: TurnOutcome, tool_call_ids: Sequence[str]
) -> pb.TurnEvent:
    """The report of a reply that ended well. Raises ``TypeError`` or ``ValueError`` for
    a reply value a report cannot carry."""
    return pb.TurnEvent(
        turn_id=turn_id,
        run_id=run_id,
        finished=pb.TurnFinished(
            usage=pb.Usage(
                prompt_tokens=outcome.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                cached_tokens=outcome.cached_tokens,
            ),
            finish_reason=outcome.finish_reason,
            paused_on_tool=outcome.paused_on_tool,
            tool_call_ids=tool_call_ids,  # the scheduler remembers them for every dataplane (D2)
            tool_names=outcome.tool_names,  # (bounded as they are read)
        ),
    )


def failed(
    turn_id: str, run_id: str, reason: str, *, replica_unreachable: bool = False
) -> pb.TurnEvent:
    return pb.TurnEvent(
        turn_id=turn_id,
        run_id=run_id,
        failed=pb.TurnFailed(reason=reason, replica_unreachable=replica_unreachable),
    )


# ----------------------------------------------------------------- the link


def snapshot(dataplane_id: str, runs: RunTable) -> pb.ResyncRequest:
    """The resync: every run and every admitted turn the run table holds."""
    req = pb.ResyncRequest(dataplane_id=dataplane_id)
    for run in runs.runs.values():
        req.runs.append(
            pb.RunSnapshot(
                run_id=run.run_id,
                last_replica=run.replica or "",
                phase=_PHASE.get(run.phase, pb.RUN_PHASE_IDLE),
                service_class=_CLASS[run.service_class],
                caller=run.caller,
            )
        )
    for turn in runs.turns.values():
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


def run_ended(run_id: str) -> pb.RunEndedRequest:
    return pb.RunEndedRequest(run_id=run_id)


def link_up(
    events: list[pb.TurnEvent], abandoned: list[str], admit: list[pb.AdmitRequest]
) -> pb.LinkUp:
    """One write of the Link: reports, turns abandoned while held, admission requests."""
    return pb.LinkUp(events=events, abandoned=abandoned, admit=admit)


def hello(dataplane_id: str, authorization: str) -> pb.LinkHello:
    """The first message of the Link over TCP."""
    return pb.LinkHello(dataplane_id=dataplane_id, authorization=authorization)


def welcome(message: bytes) -> pb.LinkWelcome:
    """The scheduler's answer to the hello (raises ``DecodeError`` if it is not one)."""
    return cast(pb.LinkWelcome, pb.LinkWelcome.FromString(message))


def link_down(message: bytes) -> pb.LinkDown:
    """One message the scheduler sent down the Link over TCP."""
    return cast(pb.LinkDown, pb.LinkDown.FromString(message))
