"""``Turn``: the one owner of an admitted turn's lifetime.

A turn admitted by the scheduler holds a slot there, an entry in the run table
(what a resync re-sends) and a place in the in-flight gauge. All three are
given back in exactly one place, ``Turn.end``, which runs once whatever
happens: the reply finished, the engine failed, the client left, or our own
code raised. The routes open a turn by constructing a ``Turn`` and either end it
themselves or hand it to the stream relay, whose ``finally`` ends it; the
``serve`` ends any turn still open when the work that carries it raises, with
the outcome the exception carries (``errors.TurnError``) or ``internal_error``
for anything else.

A turn whose engine never received the request (its connection failed, ``not_sent``)
may be placed again: where the route allows it, ``serve`` ends it as
``placed_again`` and raises ``PlaceAgain``, and the route asks the scheduler to admit
it once more as a new turn (``Turn.successor``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from opentelemetry.trace import INVALID_SPAN, Span
from starlette.responses import Response

from luftpause.dataplane import link_codec, tracing
from luftpause.dataplane.errors import (
    ClientLeft,
    ErrorShape,
    InternalError,
    Outcome,
    TurnError,
    openai_error,
)
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.runs import RunTable, TurnRecord
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.tool_calls import ToolCallOrigin, ToolCallOrigins, reportable

log = logging.getLogger("luftpause.dataplane")


class Turn:
    """An admitted turn (see the module docstring). Constructing one takes over a turn
    the scheduler just admitted: it is counted and reported started, and from here on
    it must end once."""

    def __init__(
        self,
        record: TurnRecord,
        *,
        link: SchedulerLink,
        metrics: Metrics,
        runs: RunTable | None = None,
        memory: ToolCallOrigins | None = None,
        span: Span = INVALID_SPAN,
    ) -> None:
        self.record = record
        self.span = span  # the turn's span (tracing.py); ended with the turn
        self._link = link
        self._metrics = metrics
        self._runs = runs  # None: a single-pass turn, which never enters run state (S13)
        self._memory = memory  # the turn behind each tool call (D2; GET /v1/tool_calls)
        self.started_at = time.monotonic()
        self.ended: Outcome | None = None
        if runs is not None:
            runs.admitted(record)
            runs.started(record.turn_id)
        metrics.in_flight_of(record.service_class).inc()
        self._link.report(link_codec.started(record.turn_id, record.run_id))

    def first_token(self, *, streamed: bool = True) -> None:
        """The reply's first token arrived. Only a streamed one is reported: the scheduler
        reads a replica's decode pace from first token to end (``interactive_pace_s``),
        and a reply that arrives whole would read as instant."""
        if self.ended is None:
            self._metrics.ttft_of(self.record.service_class).observe(
                time.monotonic() - self.started_at
            )
            if streamed:
                self._link.report(link_codec.first_token(self.record.turn_id, self.record.run_id))

    def finished(self, outcome: TurnOutcome) -> None:
        """The engine's reply ended well."""
        if self.ended is not None:
            return
        paused = outcome.paused_on_tool
        call_ids = reportable(outcome.tool_call_ids)
        try:
            event = link_codec.finished(self.record.turn_id, self.record.run_id, outcome, call_ids)
        except (TypeError, ValueError) as exc:  # a reply value a report cannot carry
            log.exception("turn %s: cannot report its reply", self.record.turn_id)
            self.failed(InternalError.of(exc))
            return
        if self._memory is not None and call_ids:
            record = self.record
            self._memory.remember(
                call_ids,
                ToolCallOrigin(
                    "",
                    record.run_id,
                    record.service_class,
                    record.caller,
                    tracing.traceparent_of(self.span) or None,
                ),
            )
        self._link.report(event)
        self._end(
            Outcome.PAUSED_ON_TOOL if paused else Outcome.FINISHED,
            paused_on_tool=paused,
            usage=(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens),
        )

    def successor(self, turn_id: str, replica: str, span: Span = INVALID_SPAN) -> Turn:
        """The turn this one is placed again as (this one has ended): admitted as
        ``turn_id`` to ``replica``, in the same run, class and caller, for the same model."""
        record = self.record
        return Turn(
            TurnRecord(
                turn_id, record.run_id, replica, record.model, record.service_class, record.caller
            ),
            link=self._link,
            metrics=self._metrics,
            runs=self._runs,
            memory=self._memory,
            span=span,
        )

    def failed(
        self,
        error: TurnError,
        *,
        outcome: Outcome | None = None,
        reason: str | None = None,
        replica_unreachable: bool | None = None,
    ) -> None:
        """The turn failed after admission: its slot is freed and its run left idle (D5).
        ``outcome``, ``reason`` and ``replica_unreachable`` replace what ``error`` says
        (its metric label, its report's reason and flag)."""
        if self.ended is not None:
            return
        if outcome is None:
            outcome = error.outcome
        if replica_unreachable is None:
            replica_unreachable = error.replica_unreachable
        reason = (reason or error.message)[:1000].encode("utf-8", "replace").decode("utf-8")
        trace_id = self.span.get_span_context().trace_id
        log.info(
            "turn %s of run %s on %s ended %s: %s%s",
            self.record.turn_id,
            self.record.run_id,
            self.record.replica,
            outcome.value,
            reason[:200],
            f" (trace {trace_id:032x})" if trace_id else "",
        )
        try:
            self._link.report(
                link_codec.failed(
                    self.record.turn_id,
                    self.record.run_id,
                    reason,
                    replica_unreachable=replica_unreachable,
                )
            )
        finally:  # the slot is ours to give back whatever the report did
            self._end(outcome, paused_on_tool=False)

    def _end(
        self,
        outcome: Outcome,
        *,
        paused_on_tool: bool,
        usage: tuple[int, int, int] | None = None,
    ) -> None:
        self.ended = outcome
        if self._runs is not None:
            self._runs.ended(self.record.turn_id, paused_on_tool=paused_on_tool)
        self._metrics.in_flight_of(self.record.service_class).dec()
        self._metrics.turns_of(self.record.service_class, outcome.value).inc()
        prompt, completion, cached = usage if usage is not None else (None, None, None)
        try:  # last, and never in the way: the bookkeeping above is what must happen
            tracing.end(
                self.span,
                outcome.value,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
            )
        except Exception:
            log.exception("turn %s: cannot end its span", self.record.turn_id)


class PlaceAgain(Exception):
    """Raised by ``serve`` for a turn whose engine never received the request, where
    the route may place it again: the turn has ended (reported failed, counted
    ``placed_again``); ``error`` is what the client gets if it cannot be placed again."""

    def __init__(self, error: TurnError) -> None:
        super().__init__(error.message)
        self.error = error


async def serve(
    turn: Turn,
    work: Awaitable[Response],
    shape: ErrorShape = openai_error,
    *,
    may_place_again: Callable[[], bool] | None = None,
) -> Response:
    """Await the work that carries ``turn`` to its end (it ends the turn itself or hands
    it to the stream relay). If it raises first, the turn ends here: a ``TurnError``
    with the outcome it carries, and its answer goes to the client (or, with
    ``may_place_again`` answering yes when asked then, one that says the engine never
    received the request ends it as ``placed_again`` and raises ``PlaceAgain``);
    cancellation (the client left) as ``client_left``; anything else as
    ``internal_error``, re-raised for the route to log and answer."""
    try:
        return await work
    except TurnError as exc:
        if exc.not_sent and may_place_again is not None and may_place_again():
            turn.failed(exc, outcome=Outcome.PLACED_AGAIN)
            raise PlaceAgain(exc) from None
        turn.failed(exc)
        return exc.response(turn.record.run_id, shape)
    except BaseException as exc:
        if isinstance(exc, Exception):
            turn.failed(InternalError.of(exc))
        else:
            turn.failed(ClientLeft("client left"))
        raise
