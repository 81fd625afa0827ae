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

The models themselves live in ``partition.Engines``, perhaps in other processes: a
replica sends its model what it is asked (a request, a release, an iteration to start
now) and learns each iteration's result before the loop can reach its end
(``partition``'s module docstring); what happens, and when, is the same as stepping the
model here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from luftpause.fakes.engine.model import EngineParams, EngineRequest, SubmitError, check_request
from luftpause.fakes.engine.results import EngineMetrics, FinishedRequest, StepResult, StepTally
from luftpause.sim.partition import IDLE, RELEASE, STEP, SUBMIT, Engines, LocalEngines
from luftpause.sim.world import World


@dataclass
class _Waiting:
    on_first_token: Callable[[], None]
    on_finished: Callable[[FinishedRequest], None]
    first_token: bool = False
    produced: int = 0


class Replica:
    def __init__(
        self,
        name: str,
        params: EngineParams,
        world: World,
        first_chunk_tokens: int = 1,
        engines: Engines | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.first_chunk_tokens = first_chunk_tokens
        self.world = world
        self._engines = LocalEngines(world, params) if engines is None else engines
        self.shard, self.local, self._ops = self._engines.attach(self)
        self._requests: dict[str, _Waiting] = {}
        self._stepping = False
        self._tally = StepTally()  # its busy steps, as the fake engine counts them
        self.submitted = 0  # requests sent here (accepted or refused)
        self.known: EngineMetrics | None = None  # the model's metrics, while still true

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished (queued or running)."""
        return len(self._requests)

    @property
    def tally(self) -> StepTally:
        """Every iteration started so far, as the fake engine counts its busy steps."""
        self._engines.settle(self.shard)
        return self._tally

    def metrics(self) -> EngineMetrics:
        """The model's metrics now (after everything it was sent)."""
        if self.known is None:
            self._engines.read(self.shard)
        assert self.known is not None
        return self.known

    def submit(
        self,
        request: EngineRequest,
        on_first_token: Callable[[], None],
        on_finished: Callable[[FinishedRequest], None],
    ) -> None:
        """Queue ``request``; raises the model's ``SubmitError`` for one it cannot take."""
        self.submitted += 1
        if request.request_id in self._requests:
            raise SubmitError(f"duplicate request id {request.request_id!r}")
        check_request(self.params, request)
        self._ops.append((SUBMIT, self.local, self.world.now, request))
        self.known = None
        self._requests[request.request_id] = _Waiting(on_first_token, on_finished)
        if not self._stepping:
            self._step()

    def release(self, key: str) -> None:
        """End the retention kept under ``key`` early (the model's ``release``)."""
        self._ops.append((RELEASE, self.local, self.world.now, key))
        self.known = None

    def _step(self) -> None:
        self.known = None
        if not self._requests:  # the model has no work either
            self._ops.append((IDLE, self.local, self.world.now))  # refreshes the gauges
            self._stepping = False
            return
        self._stepping = True
        self._ops.append((STEP, self.local, self.world.now))
        self._engines.started(self, self.world.reserve())

    def stepped(self, step: StepResult, seq: int) -> None:
        """The result of the iteration that started at ``step.start``: delivered at its end,
        in the place among equal times it had when it started (``seq``)."""
        self._tally.add(step)
        self.world.at(step.end, lambda: self._deliver(step), seq)

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
