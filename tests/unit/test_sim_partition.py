"""The simulator's engine side behind ops (``sim.partition``; B1, B12): the same report
whatever the shards, refusals decided where a request is sent, the clock's hold."""

from __future__ import annotations

import gc
import json
import math
from dataclasses import replace
from typing import Any

import pytest

from luftpause.fakes.engine.blocks import BlockPrompt
from luftpause.fakes.engine.model import (
    EngineModel,
    EngineParams,
    EngineRequest,
    SubmitError,
    check_request,
)
from luftpause.measure.mix import Group
from luftpause.sim import partition
from luftpause.sim.fleet import Replica
from luftpause.sim.partition import LocalEngines, lookahead
from luftpause.sim.run import SimConfig, simulate
from luftpause.sim.world import World

SMALL = SimConfig(
    groups=(Group("chat", 2, "interactive", "chat"), Group("crowd", 24, "batch", "crowd")),
    replicas=3,
    duration_s=40.0,
    warmup_s=10.0,
)


def report(result: dict[str, Any]) -> str:
    """A result as JSON, less what the wall clock measured."""
    return json.dumps({k: v for k, v in result.items() if k not in ("wall_s", "speedup")})


def test_the_lookahead_is_the_shortest_iteration() -> None:
    """B1: the default replica's shortest iteration is a decode step's fixed cost times its
    two GPU sharers (18 ms); an engine whose iterations may take no time is refused."""
    assert lookahead(EngineParams()) == pytest.approx(0.018)
    assert lookahead(EngineParams(time_scale=2.0)) == pytest.approx(0.009)
    assert lookahead(EngineParams(decode_fixed_s=0.5)) == pytest.approx(2 * 0.010085)
    with pytest.raises(ValueError, match="takes no time"):
        lookahead(EngineParams(decode_fixed_s=0.0))


def test_a_held_flush_runs_before_the_first_event_at_or_after_its_time() -> None:
    """B1: ``hold(t, flush)`` calls ``flush`` before any event at ``t`` or later runs, or
    before ``run`` returns past ``t``; an event scheduled late with a reserved place runs
    where it would have run had it been scheduled when the place was taken."""
    world = World()
    seen: list[str] = []
    place = world.reserve()
    world.at(1.0, lambda: seen.append("later at 1"))

    def flush() -> None:
        seen.append(f"flush at {world.now:g}")
        world.at(1.0, lambda: seen.append("reserved at 1"), place)

    world.at(0.5, lambda: seen.append("at 0.5"))
    world.hold(0.9, flush)
    world.run(until=2.0)
    assert seen == ["at 0.5", "flush at 0.5", "reserved at 1", "later at 1"]
    quiet = World()
    quiet.hold(3.0, lambda: seen.append("quiet flush"))
    quiet.run(until=2.0)
    assert seen[-1] == "later at 1"
    quiet.run(until=3.0)
    assert seen[-1] == "quiet flush" and quiet.horizon == math.inf


def requests() -> list[EngineRequest]:
    """One request for every reason an engine refuses one (and one it takes)."""
    short = "word " * 40
    return [
        EngineRequest("ok", short, reply_tokens=10, max_new_tokens=64),
        EngineRequest("long", "word " * 9000, reply_tokens=10),
        EngineRequest("over", short, reply_tokens=10, max_new_tokens=8190),
        EngineRequest("zero", short, reply_tokens=10, max_new_tokens=0),
        EngineRequest("nan", short, reply_tokens=10, retain_key="r", retain_s=math.nan),
        EngineRequest("keyless", short, reply_tokens=10, retain_s=1.0),
        EngineRequest("blocks", "", reply_tokens=10, prompt=BlockPrompt(40, (1, 2), 64)),
        EngineRequest("given", "", reply_tokens=10, prompt=BlockPrompt(9000, (1,), 32)),
    ]


@pytest.mark.parametrize("request_", requests(), ids=lambda r: r.request_id)
def test_a_refusal_is_decided_where_the_request_is_sent_as_the_model_decides_it(
    request_: EngineRequest,
) -> None:
    """B1: ``check_request`` refuses exactly what ``EngineModel.submit`` refuses, with its
    words, so a replica whose model steps elsewhere ends a refused request at once."""
    params = EngineParams()
    try:
        EngineModel(params).submit(request_, 0.0)
        model_says = None
    except SubmitError as exc:
        model_says = str(exc)
    try:
        check_request(params, request_)
        checked = None
    except SubmitError as exc:
        checked = str(exc)
    assert checked == model_says
    assert (model_says is None) == (request_.request_id == "ok")


def test_a_replica_refuses_a_request_at_once_and_it_never_reaches_the_model() -> None:
    """B1: a refused request raises at ``submit`` (counted as sent), leaves nothing in
    flight and starts no iteration; a duplicate id in flight is refused too."""
    world = World()
    replica = Replica("engine-0", EngineParams(), world)
    ended: list[str] = []
    bad, ok = requests()[1], requests()[0]
    with pytest.raises(SubmitError, match="longer than the model's context"):
        replica.submit(bad, lambda: None, lambda done: ended.append(done.request_id))
    assert (replica.in_flight, replica.submitted, replica.metrics().waiting) == (0, 1, 0)
    replica.submit(ok, lambda: None, lambda done: ended.append(done.request_id))
    with pytest.raises(SubmitError, match="duplicate"):
        replica.submit(ok, lambda: None, lambda done: ended.append(done.request_id))
    world.run(until=10.0)
    assert ended == ["ok"] and replica.in_flight == 0 and replica.tally.steps > 1


def test_metrics_read_mid_iteration_are_the_models_state_then() -> None:
    """B1: a probe between an iteration's start and its end reads the model as it is then
    (the iteration applied), not a copy from the last time results travelled."""
    world = World()
    params = EngineParams()
    replica = Replica("engine-0", params, world)
    model = EngineModel(params)
    request = requests()[0]
    replica.submit(request, lambda: None, lambda done: None)
    model.submit(request, 0.0)
    model.step(0.0)
    seen = []
    world.at(0.001, lambda: seen.append(replica.metrics()))
    world.run(until=0.002)
    assert seen == [model.metrics()] and seen[0].running_gauge == 1


@pytest.mark.parametrize("arm", ["luftpause-retain", "smg"])
def test_shards_do_not_change_the_report(arm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """B1, B12: the replicas dealt over two shards (stepped in this process) give the
    report one shard gives, byte for byte: the ops a model gets and the order of events
    do not depend on when results travel."""
    one = simulate(SMALL, arm)

    def two_shards(world: World, params: EngineParams, replicas: int, workers: int) -> Any:
        return LocalEngines(world, params, shards=2)

    monkeypatch.setattr("luftpause.sim.run.engines", two_shards)
    monkeypatch.setattr(partition, "EARLY_OPS", 3)  # ops travel early, often
    two = simulate(SMALL, arm)
    assert report(two) == report(one)
    assert one["turns"] > 100 and one["error_count"] == 0


def test_one_worker_needs_no_process() -> None:
    """B12: ``workers = 1`` steps every model in this process; more shards than replicas
    are not made."""
    world = World()
    params = EngineParams()
    assert isinstance(partition.engines(world, params, 4, 1), LocalEngines)
    assert isinstance(partition.engines(world, params, 1, 8), LocalEngines)
    assert partition.engines(world, params, 3, 8).shards == 3
    with pytest.raises(ValueError, match="at least 1"):
        partition.engines(world, params, 3, 0)
    assert replace(SMALL).workers == 1


class DirectReplica:
    """The replica as it was before the partition: the model stepped in place, the
    reference the partitioned replica must match event for event."""

    def __init__(self, name: str, params: EngineParams, world: World) -> None:
        self.name, self.world, self.model = name, world, EngineModel(params)
        self.callbacks: dict[str, tuple[Any, Any]] = {}
        self.stepping = False

    def submit(self, request: EngineRequest, first: Any, finished: Any) -> None:
        self.model.submit(request, self.world.now)
        self.callbacks[request.request_id] = (first, finished)
        if not self.stepping:
            self.step()

    def step(self) -> None:
        now = self.world.now
        if not self.model.has_work():
            self.model.step(now)
            self.stepping = False
            return
        self.stepping = True
        step = self.model.step(now)
        self.world.at(step.end, lambda: self.deliver(step))

    def deliver(self, step: Any) -> None:
        for request_id in dict.fromkeys(step.tokens):
            first = self.callbacks.get(request_id)
            if first is not None and first[0] is not None:
                first[0]()
                self.callbacks[request_id] = (None, first[1])
        for done in step.finished:
            self.callbacks.pop(done.request_id)[1](done)
        self.step()


def play(make: Any, seed: int) -> list[tuple[float, str, str]]:
    """Requests at random times on three replicas (first the same one on each at once),
    each reply followed by another now or after a short pause, and a metrics read every
    so often: what happened, when."""
    import random

    rng = random.Random(seed)
    world = World()
    replicas = make(world)
    log: list[tuple[float, str, str]] = []
    count = 0

    def send(replica: Any) -> None:
        nonlocal count
        count += 1
        rid = f"r{count}"
        request = EngineRequest(
            rid, "word " * rng.randrange(5, 600), rng.randrange(1, 60), max_new_tokens=64
        )

        def finished(done: Any) -> None:
            log.append((world.now, "end", f"{rid} {done.completion_tokens}"))
            if world.now < 20.0:
                if rng.random() < 0.5:
                    send(replicas[rng.randrange(len(replicas))])
                else:
                    world.after(rng.random() * 0.05, lambda: send(replica))

        replica.submit(request, lambda: log.append((world.now, "first", rid)), finished)

    def probe() -> None:
        for r in replicas:
            m = r.metrics() if isinstance(r, Replica) else r.model.metrics()
            log.append((world.now, "probe", f"{r.name} {m.running_gauge} {m.used_tokens}"))
        world.after(0.25, probe)

    def tied() -> None:  # the same request on every replica at once: their ends tie
        for r in replicas:
            rid = f"tied-{r.name}"
            request = EngineRequest(rid, "word " * 100, 5, max_new_tokens=64)
            r.submit(request, lambda rid=rid: log.append((world.now, "first", rid)),
                     lambda done, rid=rid: log.append((world.now, "end", rid)))  # fmt: skip

    world.at(0.0, tied)
    for _ in range(12):
        world.at(rng.random() * 0.1, lambda: send(replicas[rng.randrange(len(replicas))]))
    world.at(0.0, probe)
    world.run(until=25.0)
    return log


@pytest.mark.parametrize("seed", [1, 2])
def test_partitioned_replicas_do_what_replicas_stepped_in_place_did(seed: int) -> None:
    """B1: replicas on two shards (ops sent early and late) deliver every first token and
    every end at the time, and in the order, that models stepped in place deliver them,
    and a probe reads what it read from them."""
    params = EngineParams()

    def direct(world: World) -> list[DirectReplica]:
        return [DirectReplica(f"engine-{i}", params, world) for i in range(3)]

    def partitioned(world: World) -> list[Replica]:
        fleet = LocalEngines(world, params, shards=2)
        return [Replica(f"engine-{i}", params, world, engines=fleet) for i in range(3)]

    reference = play(direct, seed)
    assert len([e for e in reference if e[1] == "end"]) > 300
    assert play(partitioned, seed) == reference


def test_a_simulation_collects_young_objects_less_often_and_puts_it_back() -> None:
    """B12: while a simulation runs, the young generation is collected every
    ``GC_YOUNG`` allocations instead of CPython's 700; afterwards as before."""
    before = gc.get_threshold()
    during: list[tuple[int, int, int]] = []
    simulate(replace(SMALL, duration_s=2.0, warmup_s=0.0), "router",
             lambda t, events: during.append(gc.get_threshold()))  # fmt: skip
    assert during and {d[0] for d in during} == {partition.GC_YOUNG}
    assert gc.get_threshold() == before


def test_replicas_join_the_engines_before_the_shards_are_made() -> None:
    """B1: the shards are made with the replicas they hold when the first op travels; a
    replica that comes later is refused, not given a model no shard has."""
    world = World()
    params = EngineParams()
    fleet = LocalEngines(world, params, shards=2)
    first = Replica("engine-0", params, world, engines=fleet)
    assert first.metrics().running == 0
    with pytest.raises(RuntimeError, match="before they first step"):
        Replica("engine-1", params, world, engines=fleet)
