"""The single writer: one asyncio task owns the scheduler state.

Everything that changes state is an event put on one queue; the writer stamps
it with the clock, calls ``decide`` and carries out the actions (answering
held Admit calls, logging drops). Readers (status HTTP) look at the latest
state object, which is immutable, so they need no lock.

B13: the writer also keeps the callers' token limits (:mod:`.quotas`). A new turn
(``TurnRequested`` of a turn the core does not know) whose account has spent a limit
is answered :class:`~.quotas.OverQuota` there and then, and the core never sees it; a
finished turn (``TurnFinished`` of a turn the core knows: its caller is read from the
state before the event is applied) is charged its prompt + completion tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    DataplaneResynced,
    DropTurn,
    Event,
    ForgetRun,
    Reject,
    RunEnded,
    State,
    TurnAbandoned,
    TurnFinished,
    TurnRequested,
    decide,
)
from luftpause.scheduler.service.metrics import CallerLabels, SchedulerMetrics
from luftpause.scheduler.service.quotas import OverQuota, Quotas

log = logging.getLogger("luftpause.scheduler")

Stamp = Callable[[float], Event]  # builds an event once the writer knows the time
Outcome = Admit | Reject | OverQuota  # the answer to a requested turn
Answer = Callable[[Outcome], None]  # told the decision on a requested turn


class Host:
    def __init__(
        self,
        state: State,
        clock: Callable[[], float],
        quotas: Quotas | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.clock = clock
        self.wall = wall  # the UTC day of the daily budgets (B13)
        self.quotas = quotas if quotas is not None else Quotas({})
        self._queue: asyncio.Queue[tuple[Stamp, asyncio.Future[None] | None]] = asyncio.Queue()
        self._waiters: dict[str, list[Answer]] = {}
        self.counters: dict[str, int] = {}
        self.metrics = SchedulerMetrics(  # GET /metrics
            lambda: self.state, clock, CallerLabels(self.quotas.names)
        )

    # ----------------------------------------------------------------- inputs

    def post(self, stamp: Stamp) -> None:
        """Queue an event; it is stamped and applied by the writer in order."""
        self._queue.put_nowait((stamp, None))

    async def apply(self, stamp: Stamp) -> None:
        """Queue an event and wait until the writer has applied it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((stamp, done))
        await done

    async def admit(self, turn_id: str, make: Callable[[float], TurnRequested]) -> Outcome:
        """Request a turn and wait (no deadline) until it is admitted or rejected.

        If the caller is cancelled (its client left) and no other call waits for
        the same turn, the turn is abandoned: a held turn leaves the queue, an
        admitted one whose answer never arrived frees its slot.
        """
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def answer(outcome: Outcome) -> None:
            if not fut.done():
                fut.set_result(outcome)

        abandon = self.request(turn_id, make, answer)
        try:
            return await fut
        except asyncio.CancelledError:
            abandon()
            raise

    def request(
        self, turn_id: str, make: Callable[[float], TurnRequested], answer: Answer
    ) -> Callable[[], None]:
        """Request a turn; the writer calls ``answer`` once it is admitted or rejected.
        Returns the function that abandons the request: once no request waits for
        the turn, it is abandoned as ``admit`` describes."""
        self._waiters.setdefault(turn_id, []).append(answer)
        self.post(make)

        def abandon() -> None:
            waiting = self._waiters.get(turn_id)
            if waiting is not None and answer in waiting:
                waiting.remove(answer)
                if not waiting:
                    del self._waiters[turn_id]
            if turn_id not in self._waiters:
                self.post(lambda at: TurnAbandoned(at=at, turn_id=turn_id))

        return abandon

    # ----------------------------------------------------------------- writer

    async def run(self) -> None:
        while True:
            stamp, done = await self._queue.get()
            self._apply(stamp, done)

    def drain(self) -> None:
        """Apply everything queued now, in order, from the caller (a transport's callback
        that has just queued a turn's events): the answer goes out without waiting for the
        writer task's turn on the event loop. The writer finds the queue empty and waits
        on; one writer either way, since nothing else runs until this returns."""
        while not self._queue.empty():
            stamp, done = self._queue.get_nowait()
            self._apply(stamp, done)

    def _apply(self, stamp: Stamp, done: asyncio.Future[None] | None) -> None:
        event = stamp(self.clock())
        if type(event) is TurnRequested and self.quotas.limited:
            refused = self._over_quota(event)
            if refused is not None:
                self._execute(refused)
                if done is not None and not done.done():
                    done.set_result(None)
                return
        elif type(event) is TurnFinished:
            self._charge(event)
        started = time.perf_counter()
        try:
            state, actions = decide(self.state, event)
        except Exception:  # decide must never raise; if it does, keep serving
            log.exception("decide raised on %r; event dropped", event)
            actions = ()
        else:
            elapsed = time.perf_counter() - started
            try:
                self.metrics.decided(event, elapsed, self.state, state, actions)
            except Exception:  # a metrics bug must not stop the writer
                log.exception("metrics failed on %r", event)
            self.state = state
        for action in actions:
            self._execute(action)
        if done is not None and not done.done():
            done.set_result(None)

    def _over_quota(self, event: TurnRequested) -> OverQuota | None:
        """B13: the refusal of a new turn whose account spent a token limit (a turn the
        core already knows, asked for again, is the core's to answer)."""
        state = self.state
        if event.turn_id in state.turns or event.turn_id in state.held:
            return None
        refused = self.quotas.admit(event.turn_id, event.caller, event.at, self.wall())
        if refused is not None:
            self.metrics.over_quota(event.caller, refused.limit)
        return refused

    def _charge(self, event: TurnFinished) -> None:
        """B13: a finished turn's tokens, charged to its caller (known from the state
        before the event is applied)."""
        turn = self.state.turns.get(event.turn_id)
        if turn is None:
            return
        tokens = max(0, event.prompt_tokens) + max(0, event.completion_tokens)
        self.quotas.charge(turn.caller, tokens, event.at, self.wall())
        self.metrics.charged(turn.caller, tokens)

    def _execute(self, action: Admit | Reject | OverQuota | DropTurn | ForgetRun) -> None:
        match action:
            case Admit() | Reject() | OverQuota():
                label = (
                    "admitted"
                    if isinstance(action, Admit)
                    else "rejected"
                    if isinstance(action, Reject)
                    else "over_quota"
                )
                self.counters[label] = self.counters.get(label, 0) + 1
                for answer in self._waiters.pop(action.turn_id, ()):
                    try:
                        answer(action)
                    except Exception:  # one bad answer must not stop the writer
                        log.exception("answering turn %s failed", action.turn_id)
            case DropTurn():
                self.counters[f"dropped_{action.reason.value}"] = (
                    self.counters.get(f"dropped_{action.reason.value}", 0) + 1
                )
                log.warning(
                    "turn %s on %s dropped: %s%s",
                    action.turn_id,
                    action.replica,
                    action.reason.value,
                    f" (trace {action.trace_id})" if action.trace_id else "",
                )
            case ForgetRun():
                self.counters["runs_forgotten"] = self.counters.get("runs_forgotten", 0) + 1
                log.info("run %s forgotten after its idle expiry", action.run_id)

    # ----------------------------------------------------------------- helpers

    async def tick_forever(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            self.post(lambda at: ClockTicked(at=at))

    async def run_ended(self, run_id: str) -> None:
        await self.apply(lambda at: RunEnded(at=at, run_id=run_id))

    async def resync(self, make: Callable[[float], DataplaneResynced]) -> None:
        await self.apply(make)
