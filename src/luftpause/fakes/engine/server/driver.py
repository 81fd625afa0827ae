"""The driver (H1): runs the pure ``EngineModel`` in real time on the event loop.

One asyncio task calls ``model.step(now)``, sleeps until the step's modelled end,
then hands the produced tokens to per-request queues. It sleeps on an event
while the model is idle (no busy loop). When the host's CPU makes a step start
late, the delay is counted (``late_s`` in ``/debug/state``), never hidden. A
request whose client leaves is cancelled in the model, which frees its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from luftpause.fakes.engine.model import EngineModel, EngineRequest
from luftpause.fakes.engine.results import FinishedRequest, StepTally

log = logging.getLogger("luftpause.fake_engine")


@dataclass(frozen=True)
class Tokens:
    """``count`` tokens of one request were produced by the last step."""

    count: int


Event = Tokens | FinishedRequest


class EngineDriver:
    """Runs an ``EngineModel`` in real time on the event loop."""

    def __init__(
        self,
        model: EngineModel,
        clock: Callable[[], float] = time.monotonic,
        keep_finished: int = 200,
    ) -> None:
        self.model = model
        self._clock = clock
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_finished)
        self.submitted = 0
        self.plan_keyed = 0  # chat requests that came with a plan key (server.chat)
        # Steps run back to back in model time; the host's own work (HTTP, streaming,
        # other processes on the same cores) can still make one start late. ``late_s``
        # sums how far each step started behind the previous one's end, against
        # ``tally.busy_s`` of model time: the share of wall time the model fell behind.
        self.tally = StepTally()
        self.late_s = 0.0

    def now(self) -> float:
        return self._clock()

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-steps")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: EngineRequest) -> asyncio.Queue[Event]:
        """Queue a request in the model; raises ``SubmitError``."""
        self.ensure_started()
        self.model.submit(request, self.now())
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self.submitted += 1
        self._wake.set()
        return queue

    def release(self, key: str) -> bool:
        """End the KV retention kept under ``key`` early; False if none is kept."""
        return self.model.release(key)

    def cancel(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is not None:
            self.model.cancel(request_id, self.now())

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception:  # a model bug must not hang every client silently
            log.exception("engine step loop failed; failing in-flight requests")
            for rid in list(self._queues):
                self.cancel(rid)
            raise

    async def _loop(self) -> None:
        prev_end: float | None = None
        while True:
            if not self.model.has_work():
                self.model.step(self.now())  # an idle step: refreshes the metric gauges
                self._wake.clear()
                await self._wake.wait()
                prev_end = None
                continue
            now = self.now()
            if prev_end is not None and now > prev_end:
                self.late_s += now - prev_end
            step = self.model.step(now)
            self.tally.add(step)
            prev_end = step.end
            # Sleep until the step's modelled end, not for its duration after the
            # bookkeeping: the time ``step`` itself took is part of the step.
            await asyncio.sleep(max(0.0, step.end - self.now()))
            counts: dict[str, int] = {}
            for rid in step.tokens:
                counts[rid] = counts.get(rid, 0) + 1
            for rid, n in counts.items():
                queue = self._queues.get(rid)
                if queue is not None:
                    queue.put_nowait(Tokens(n))
            for done in step.finished:
                self.recent.append({"request_id": done.request_id, **finished_json(done)})
                queue = self._queues.pop(done.request_id, None)
                if queue is not None:
                    queue.put_nowait(done)


async def collect(queue: asyncio.Queue[Event]) -> FinishedRequest:
    """Wait for the request's end, ignoring its tokens (a reply that is not streamed)."""
    while True:
        event = await queue.get()
        if isinstance(event, FinishedRequest):
            return event


async def collect_half(queue: asyncio.Queue[Event], total: int) -> None:
    """Wait until half of ``total`` tokens are produced (or the request ends)."""
    seen = 0
    while seen < max(1, total // 2):
        event = await queue.get()
        if isinstance(event, FinishedRequest):
            return
        seen += event.count


def finished_json(done: FinishedRequest) -> dict[str, Any]:
    return {
        "finish_reason": done.reason.value,
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": done.cached_tokens,
        "completion_tokens": done.completion_tokens,
        "timing": timing_json(done),
    }


def timing_json(done: FinishedRequest) -> dict[str, float]:
    t = done.timing
    return {
        "queued_s": round(t.queued_s, 6),
        "prefill_s": round(t.prefill_s, 6),
        "decode_s": round(t.decode_s, 6),
    }
