"""The simulator's engine models, partitioned across processes (``luftpause sim --workers``).

One simulation runs in two parts. The scheduling side — the virtual clock
(``world.World``), the agents, the arm with its scheduling core, and each replica's
bookkeeping (``fleet.Replica``: requests in flight, callbacks, its step tally) —
runs in the main process. The engine side — each replica's ``EngineModel`` — runs
in *shards*: ``--workers N`` shards, replica *i* on shard *i* mod N, each in a worker
process of its own; with one worker the single shard runs in the main process and
nothing crosses a process boundary.

What a replica's model is told (``fleet.Replica``)
--------------------------------------------------
The model changes only when it is told something, so the main process tells it
everything, in order, as an *op* stamped with the virtual time it happened at:
``SUBMIT`` a request, ``RELEASE`` a retention key, ``STEP`` (start an iteration now)
and ``IDLE`` (the idle step that refreshes the gauges). Which of the last two comes,
and when, the main process decides itself, exactly as the unpartitioned replica did:
an iteration starts when a request arrives at an idle replica, and again right after
each delivery (after its callbacks, so a request they send joins it) while the
replica has requests in flight; with none in flight the model has no work either
(a request leaves the model only by finishing, and a finished request is delivered
before the next iteration starts), so that step is the idle one. A refusal is
decided where the request is sent, before it becomes an op: a duplicate id against
the replica's requests in flight, everything else by ``check_request``, the checks
``EngineModel.submit`` makes. So a refused request ends once, at once, as before.

When a result must be known (the lookahead)
-------------------------------------------
A shard applies ops in the order they were sent and keeps each ``STEP``'s result.
The main process may run ahead of the shards: an iteration started at *s* ends, and
its tokens are delivered, no earlier than *s* + L, where L = ``lookahead(params)``
is the shortest iteration the engine can run (one prefill token, or a decode step's
fixed cost, times the GPU sharers; 18 ms for the default replica). So the first
time the clock would reach an event at or after (earliest unresolved start) + L,
``World`` calls ``Engines.flush``: every shard gets the ops it has not seen and
answers with the results of every iteration started so far, and each delivery is
scheduled at its end, in the place among equal times it had when the iteration
started (``World.reserve``). Before that point no delivery can be missing from the
queue. This is a conservative synchronisation with the engine step as lookahead;
its windows are not fixed but end where the first unresolved iteration could.
Between flushes a shard that has been sent many ops gets them early, so the worker
processes step their models while the main process runs the window.

Metrics are never stale: an arm's probe (``Replica.metrics``), like the window's step
tally (``Replica.tally``), first brings the replica's shard up to date with what it was
sent, and the answer is exactly the model's state at that moment. The metrics a
shard answered stay good until the replica is sent its next op.

Hence every report is the same whatever the number of workers, and the same as
stepping each model in the main process: the ops a model receives, the order of
events in the queue, and what every callback reads do not depend on when the results
travel. ``tests/unit/test_sim_partition.py`` checks that 1 and 2 workers give the
same report byte for byte.

Workers are started by ``spawn`` on the first exchange, ignore Ctrl-C (the main
process handles it), and are stopped by ``close`` on every exit path (the simulator
calls it in a ``finally``); a worker that dies or fails is reported as a
``WorkerError`` naming it, and the main process never waits on a dead one.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import signal
import traceback
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from luftpause.fakes.engine.model import EngineModel, EngineParams
from luftpause.fakes.engine.results import EngineMetrics, StepKind, StepResult
from luftpause.sim.world import World


class Replica(Protocol):
    """What the engines ask of a replica (``fleet.Replica``): where it was placed (its
    shard, and its index there), the model's metrics it knows (None: changed since), and
    to be handed each of its iterations' results."""

    shard: int
    local: int
    known: EngineMetrics | None

    def stepped(self, step: StepResult, seq: int) -> None: ...


# Ops: (kind, replica's index on its shard, virtual time, argument)
SUBMIT, RELEASE, STEP, IDLE = 0, 1, 2, 3
Op = tuple[Any, ...]

# Messages to a worker: ops to apply; ops to apply, then every result since the last
# SYNC and the metrics of some replicas; stop.
_OPS, _SYNC, _STOP = "ops", "sync", "stop"
EARLY_OPS = 64  # a shard gets its ops before the flush once this many wait
POLL_S = 0.5  # how often a wait for a worker checks that it is alive
REPLY_TIMEOUT_S = 600.0  # a worker silent this long (and alive) is taken as hung
# Objects allocated between two young-generation collections while a simulation runs
# (CPython's default: 700). A simulation allocates millions of objects and keeps most:
# at 100 replicas x 10,000 runs over 60 s the default collects 897 times, 3.6 s of the
# 19 s; this, 11 times, 0.6 s. gc.freeze() after the setup saved no more beside it.
GC_YOUNG = 50_000


class WorkerError(RuntimeError):
    """An engine worker died, failed or stopped answering."""


def lookahead(params: EngineParams) -> float:
    """The shortest iteration a replica of ``params`` runs, as the simulator steps it (at
    its ``gpu_sharers``): a prefill of one token, or a decode step's fixed cost."""
    factor = params.gpu_sharers / params.time_scale
    shortest = min(params.decode_fixed_s, params.prefill_fixed_s + params.prefill_token_s)
    if not shortest * factor > 0:
        raise ValueError(
            "the engine's shortest iteration takes no time (decode_fixed_s, or "
            "prefill_fixed_s + prefill_token_s, is 0): the simulator needs it positive"
        )
    return shortest * factor


class Shard:
    """The engine side of some replicas: their models, told what the ops say."""

    def __init__(self, params: EngineParams, replicas: int) -> None:
        self.models = [EngineModel(params) for _ in range(replicas)]
        self.results: list[StepResult] = []

    def apply(self, ops: Sequence[Op]) -> None:
        models, results = self.models, self.results
        for op in ops:
            kind, model = op[0], models[op[1]]
            if kind == STEP:
                step = model.step(op[2])
                if step.kind is StepKind.IDLE:
                    raise RuntimeError(f"an iteration was started on idle replica {op[1]}")
                results.append(step)
            elif kind == SUBMIT:
                model.submit(op[3], op[2])
            elif kind == IDLE:
                if model.step(op[2]).kind is not StepKind.IDLE:
                    raise RuntimeError(f"an idle step was asked of busy replica {op[1]}")
            else:
                model.release(op[3])

    def answer(self, metrics: Sequence[int] | None) -> tuple[list[StepResult], list[EngineMetrics]]:
        """Every result since the last answer, and the metrics of the ``metrics`` replicas."""
        results, self.results = self.results, []
        return results, [self.models[i].metrics() for i in metrics or ()]


class Engines:
    """The main process's side: the ops each shard has not seen, the iterations started
    whose results are not back, and when the world must wait for them. Subclasses move
    ops and answers (``LocalEngines``: in this process; ``ProcessEngines``: to workers)."""

    def __init__(self, world: World, params: EngineParams, shards: int = 1) -> None:
        if shards < 1:
            raise ValueError("a simulation needs at least one engine shard")
        self.world = world
        self.params = params
        self.lookahead = lookahead(params)
        self.shards = shards
        self._ops: list[list[Op]] = [[] for _ in range(shards)]
        self._members: list[list[Replica]] = [[] for _ in range(shards)]
        # iterations started and not yet answered, per shard, in the order they started
        self._started: list[deque[tuple[Replica, int]]] = [deque() for _ in range(shards)]
        self._unresolved = 0
        self._sealed = False  # the shards are made (on the first op sent): no more replicas
        self.closed = False

    def attach(self, replica: Replica) -> tuple[int, int, list[Op]]:
        """Place ``replica`` on the next shard in turn: (shard, index there, its ops)."""
        if self._sealed:
            raise RuntimeError("replicas join a simulation's engines before they first step")
        count = sum(len(m) for m in self._members)
        shard = count % self.shards
        self._members[shard].append(replica)
        return shard, len(self._members[shard]) - 1, self._ops[shard]

    def started(self, replica: Replica, seq: int) -> None:
        """``replica`` appended a STEP op: its result is owed before now + lookahead."""
        shard = replica.shard
        self._started[shard].append((replica, seq))
        if not self._unresolved:
            self.world.hold(self.world.now + self.lookahead, self.flush)
        self._unresolved += 1
        ops = self._ops[shard]
        if len(ops) >= EARLY_OPS:
            self._sealed = True
            self._send(shard, ops)
            ops.clear()

    def flush(self) -> None:
        """Bring every shard up to date and schedule every delivery it owes."""
        self._exchange([s for s in range(self.shards) if self._ops[s] or self._started[s]], {})

    def settle(self, shard: int) -> None:
        """Bring ``shard`` up to date (its replicas' iterations so far are all known)."""
        if self._ops[shard] or self._started[shard]:
            self._exchange([shard], {})

    def read(self, shard: int) -> None:
        """Bring ``shard`` up to date and learn the metrics of its replicas that changed."""
        changed = [r.local for r in self._members[shard] if r.known is None]
        self._exchange([shard], {shard: changed})

    def finish(self) -> None:
        """Bring every shard up to date with every replica's metrics, then ``close``: the
        replicas' tallies and metrics stay readable."""
        shards = list(range(self.shards))
        wanted = {s: [r.local for r in self._members[s] if r.known is None] for s in shards}
        self._exchange([s for s in shards if self._ops[s] or self._started[s] or wanted[s]], wanted)
        self.close()

    def close(self) -> None:
        """Stop the workers, if any (idempotent)."""
        self.closed = True

    def _exchange(self, shards: list[int], metrics: dict[int, list[int]]) -> None:
        if not shards:
            return
        if self.closed:
            raise RuntimeError("the simulation's engines are closed")
        asks = [(s, self._ops[s], metrics.get(s)) for s in shards]
        self._sealed = True
        answers = self._ask(asks)
        for (shard, ops, wanted), (results, known) in zip(asks, answers, strict=True):
            ops.clear()
            started = self._started[shard]
            if len(results) != len(started):
                raise RuntimeError(
                    f"engine shard {shard} answered {len(results)} iterations of {len(started)}"
                )
            for step in results:
                replica, seq = started.popleft()
                replica.stepped(step, seq)
            self._unresolved -= len(results)
            members = self._members[shard]
            for local, m in zip(wanted or (), known, strict=True):
                members[local].known = m

    def _shard_sizes(self) -> list[int]:
        return [len(m) for m in self._members]

    def _send(self, shard: int, ops: list[Op]) -> None:
        raise NotImplementedError

    def _ask(
        self, asks: list[tuple[int, list[Op], list[int] | None]]
    ) -> list[tuple[list[StepResult], list[EngineMetrics]]]:
        raise NotImplementedError


class LocalEngines(Engines):
    """Every shard in this process (``--workers 1``; a replica made on its own)."""

    def __init__(self, world: World, params: EngineParams, shards: int = 1) -> None:
        super().__init__(world, params, shards)
        self._shards: list[Shard] | None = None

    def _local(self) -> list[Shard]:
        if self._shards is None:
            self._shards = [Shard(self.params, n) for n in self._shard_sizes()]
        return self._shards

    def _send(self, shard: int, ops: list[Op]) -> None:
        self._local()[shard].apply(ops)

    def _ask(
        self, asks: list[tuple[int, list[Op], list[int] | None]]
    ) -> list[tuple[list[StepResult], list[EngineMetrics]]]:
        shards = self._local()
        answers = []
        for shard, ops, wanted in asks:
            shards[shard].apply(ops)
            answers.append(shards[shard].answer(wanted))
        return answers


def serve(conn: Connection, params: EngineParams, replicas: int) -> None:
    """A worker process: one shard, driven by the messages on ``conn`` until told to stop
    (or the main process is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    shard = Shard(params, replicas)
    failure: str | None = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == _STOP:
            return
        if failure is None:
            try:
                shard.apply(message[1])
            except Exception:
                failure = traceback.format_exc()
        if kind == _SYNC:
            conn.send(("failed", failure) if failure is not None else shard.answer(message[2]))
            if failure is not None:
                return


class ProcessEngines(Engines):
    """Each shard in a worker process of its own (``--workers N``, N > 1)."""

    def __init__(self, world: World, params: EngineParams, shards: int) -> None:
        super().__init__(world, params, shards)
        self._workers: list[tuple[Connection, BaseProcess]] = []

    def _start(self) -> list[tuple[Connection, BaseProcess]]:
        if not self._workers:
            if self.closed:
                raise RuntimeError("the simulation's engines are closed")
            context = multiprocessing.get_context("spawn")
            for shard, size in enumerate(self._shard_sizes()):
                mine, theirs = context.Pipe()
                process = context.Process(
                    target=serve,
                    args=(theirs, self.params, size),
                    name=f"luftpause-sim-engines-{shard}",
                    daemon=True,
                )
                self._workers.append((mine, process))
                process.start()
                theirs.close()
        return self._workers

    def _put(self, shard: int, message: tuple[Any, ...]) -> None:
        conn, process = self._start()[shard]
        try:
            conn.send(message)
        except OSError as exc:
            raise WorkerError(self._gone(shard, process)) from exc

    def _send(self, shard: int, ops: list[Op]) -> None:
        self._put(shard, (_OPS, ops))

    def _ask(
        self, asks: list[tuple[int, list[Op], list[int] | None]]
    ) -> list[tuple[list[StepResult], list[EngineMetrics]]]:
        for shard, ops, wanted in asks:  # every worker at once, then every answer
            self._put(shard, (_SYNC, ops, wanted))
        return [self._answer(shard) for shard, _, _ in asks]

    def _answer(self, shard: int) -> tuple[list[StepResult], list[EngineMetrics]]:
        conn, process = self._workers[shard]
        waited = 0.0
        while not conn.poll(POLL_S):
            waited += POLL_S
            if not process.is_alive():
                raise WorkerError(self._gone(shard, process))
            if waited >= REPLY_TIMEOUT_S:
                raise WorkerError(
                    f"engine worker {shard} (pid {process.pid}) did not answer in "
                    f"{REPLY_TIMEOUT_S:g} s"
                )
        try:
            reply = conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerError(self._gone(shard, process)) from exc
        if reply[0] == "failed":
            raise WorkerError(f"engine worker {shard} failed:\n{reply[1]}")
        results, known = reply
        return results, known

    @staticmethod
    def _gone(shard: int, process: BaseProcess) -> str:
        process.join(POLL_S)
        return (
            f"engine worker {shard} (pid {process.pid}) ended unexpectedly "
            f"(exit code {process.exitcode})"
        )

    def close(self) -> None:
        super().close()
        workers, self._workers = self._workers, []
        for conn, _ in workers:
            with contextlib.suppress(OSError):
                conn.send((_STOP,))
        for conn, process in workers:
            process.join(2.0)
            if process.is_alive():
                process.terminate()
                process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(2.0)
            conn.close()


def engines(world: World, params: EngineParams, replicas: int, workers: int) -> Engines:
    """The engine side of a simulation of ``replicas`` replicas on ``workers`` processes
    (at most one per replica; 1: in this process)."""
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    shards = min(workers, max(1, replicas))
    return LocalEngines(world, params) if shards == 1 else ProcessEngines(world, params, shards)
