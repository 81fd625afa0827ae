"""Engine replicas in virtual time: the fake engine's ``EngineModel``, stepped as its driver does.

A replica runs one iteration at a time: ``step(now)`` applies the iteration and
says how long it takes; its tokens and finished requests are delivered when that
time has passed, and the next iteration starts then (``fakes.engine.server.driver``
does the same with ``asyncio.sleep``). A request submitted while an iteration runs
waits for the next one. While idle, an idle step refreshes the metric gauges.

The first token a client sees is the request's first produced token: SGLang streams
it alone whatever its ``--stream-interval``, and so does the fake engine since
47dc5bb. ``first_chunk_tokens`` > 1 models an engine that holds the first token
until that many are ready (the fake engine before 47dc5bb with ``--chunk-tokens``,
as the floods ran it); a reply shorter than that shows its first token at its end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from luftpause.fakes.engine.model import (
    EngineMetrics,
    EngineModel,
    EngineParams,
    EngineRequest,
    FinishedRequest,
    StepResult,
    StepTally,
)
from luftpause.sim.world import World


@dataclass
class _Waiting:
    on_first_token: Callable[[], None]
    on_finished: Callable[[FinishedRequest], None]
    first_token: bool = False
    produced: int = 0


class Replica:
    def __init__(
        self, name: str, params: EngineParams, world: World, first_chunk_tokens: int = 1
    ) -> None:
        self.name = name
        self.first_chunk_tokens = first_chunk_tokens
        self.model = EngineModel(params)
        self.world = world
        self._requests: dict[str, _Waiting] = {}
        self._stepping = False
        self.tally = StepTally()  # its busy steps, as the fake engine counts them
        self.submitted = 0  # requests sent here (accepted or refused)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished (queued or running)."""
        return len(self._requests)

    def metrics(self) -> EngineMetrics:
        return self.model.metrics()

    def submit(
        self,
        request: EngineRequest,
        on_first_token: Callable[[], None],
        on_finished: Callable[[FinishedRequest], None],
    ) -> None:
        """Queue ``request``; raises the model's ``SubmitError`` for one it cannot take."""
        self.submitted += 1
        self.model.submit(request, self.world.now)
        self._requests[request.request_id] = _Waiting(on_first_token, on_finished)
        if not self._stepping:
            self._step()

    def _step(self) -> None:
        now = self.world.now
        if not self.model.has_work():
            self.model.step(now)  # idle: refreshes the gauges a probe reads
            self._stepping = False
            return
        self._stepping = True
        step = self.model.step(now)
        self.tally.add(step)
        self.world.at(step.end, lambda: self._deliver(step))

    def _deliver(self, step: StepResult) -> None:
        for request_id in step.tokens:
            waiting = self._requests.get(request_id)
            if waiting is not None and not waiting.first_token:
                waiting.produced += 1
                if waiting.produced >= self.first_chunk_tokens:
                    waiting.first_token = True
                    waiting.on_first_token()
        for done in step.finished:
            finished = self._requests.pop(done.request_id, None)
            if finished is not None:
                if not finished.first_token and finished.produced:
                    finished.first_token = True
                    finished.on_first_token()
                finished.on_finished(done)
        self._step()
