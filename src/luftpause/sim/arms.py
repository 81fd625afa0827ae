"""Who decides where and when a turn enters an engine (see the package docstring)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    DropTurn,
    EndpointKind,
    Event,
    FirstTokenReceived,
    Params,
    Reject,
    ReplicaProbed,
    ReplicaSpec,
    ServiceClass,
    State,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    WorkingSet,
    decide,
    initial_state,
)
from luftpause.sim.fleet import Replica
from luftpause.sim.placement import (
    SMG_LOAD_POLL_S,
    LeastLoad,
    LoadReport,
    Placement,
    SmgCacheAware,
    router_placement,
    smg_placement,
)
from luftpause.sim.vllm_router import (
    METRICS_INTERVAL_S,
    PROGRAM_PRIORITY,
    QUEUE_TIMEOUT_S,
    ProgramScheduler,
    Retained,
)
from luftpause.sim.world import World

ARMS = ("luftpause", "router", "engine-prio", "smg")
# luftpause with one default policy off (as tools/bench/flood.py's ablation arms)
ABLATED_ARMS = ("luftpause-no-pace",)
# luftpause sending engines retention hints (B8, ``Params.kv_retention``)
RETAIN_ARMS = ("luftpause-retain",)
# luftpause with an optional policy on: working-set admission (``Params.working_set``)
# instead of prefix keeping's run limit, and beside it
WSET_ARMS = {"luftpause-wset": WorkingSet.REPLACE, "luftpause-wset-both": WorkingSet.BOTH}
# luftpause with a held-turn order option on (scheduler/core/order.py): the Params
# fields each arm sets. Token fairness (B3); attained service (B2), by tokens or time.
ORDER_ARMS: dict[str, dict[str, str]] = {
    "luftpause-vtc": {"fairness": "tokens"},
    "luftpause-attained": {"batch_order": "attained"},
    "luftpause-attained-time": {"batch_order": "attained", "attained_measure": "time"},
}
# Arms named with a number: SMG's priority scheduler with C slots, its legacy FIFO cap,
# and luftpause with a decode pace target of MS milliseconds per token
# (``interactive_pace_s``).
SIZED_ARMS = ("smg-cap", "smg-fifo", "luftpause-pace", "vllm-prog-kv")
# vLLM's router (``vllm-router`` 0.1.17), named as tools/bench/flood.py names its arms:
# without program scheduling (its default ``cache_aware`` policy), program scheduling with
# its defaults, and the same with ``token_capacity_per_target`` the engine's KV pool
# (``vllm-prog-kvT``: T tokens).
VLLM_ROUTER_ARMS = ("vllm-router", "vllm-prog", "vllm-prog-kv")
# Body priorities of the engine-prio arm (as tools/bench/flood.py sends them).
ENGINE_PRIORITY = {"interactive": 10, "batch": 0}
# SGLang Model Gateway 1.13's priority scheduler as tools/bench/flood.py configures it:
# slots reserved for interactive (one per interactive agent of the flood), and its
# built-in starvation thresholds in model seconds (a queue head waiting longer goes
# ahead of the classes above it). Batch turns are sent as its ``bulk`` class.
SMG_INTERACTIVE_RESERVED = 4
SMG_STARVATION_S = {"system": 5.0, "interactive": 5.0, "default": 30.0, "bulk": 120.0}
SMG_CLASS = {"interactive": "interactive", "batch": "bulk"}


# placements that price engines by the load SMG reads of them
LoadPriced = LeastLoad | SmgCacheAware


@dataclass(frozen=True)
class Ask:
    """A turn asking to run."""

    turn_id: str
    run_id: str
    model: str
    cls: str
    caller: str
    agent: int  # the agent's index (engine-prio pins agents to replicas by it)
    # what a gateway places the turn by: its conversation's text
    # (``placement.routing_text``), which extends the run's last turn's
    routing_text: str = ""
    # What an agent framework knows of the turn and vLLM's router reads from
    # ``vllm_xargs.agentic_context``: whether another turn of the run follows this one
    # (False on the turn that answers), and the prompt's tokens (the router's estimate of
    # the context, taken as exact).
    expected_resume: bool = True
    context_tokens: int = 0


Admitted = Callable[[str, float], None]  # replica, seconds held
Refused = Callable[[str], None]  # why


@dataclass
class TurnEnd:
    paused_on_tool: bool
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Arm(Protocol):
    name: str
    holds: bool  # True when turns may wait in the arm (a held time is reported)

    def start(self) -> None: ...

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None: ...

    def priority(self, cls: str) -> int: ...

    def retain_s(self, turn_id: str) -> float: ...

    def started(self, turn_id: str) -> None: ...

    def first_token(self, turn_id: str) -> None: ...

    def finished(self, ask: Ask, end: TurnEnd) -> None: ...


def counted_median(counts: Counter[int | None]) -> float | None:
    """The median (as ``statistics.median``) of the values counted, None left out."""
    known = sorted((v, n) for v, n in counts.items() if v is not None and n > 0)
    total = sum(n for _, n in known)
    if not total:
        return None
    picks = []
    for position in sorted({(total - 1) // 2, total // 2}):
        seen = 0
        for value, n in known:
            if seen + n > position:
                picks.append(value)
                break
            seen += n
    return statistics.fmean(picks) if len(picks) == 2 else float(picks[0])


class LuftpauseArm:
    """The scheduler's pure core, fed what the real service feeds it."""

    holds = True

    def __init__(
        self,
        world: World,
        replicas: Sequence[Replica],
        models: frozenset[str],
        params: Params,
        probe_s: float = 2.0,
        tick_s: float = 1.0,
        log: list[Event] | None = None,
        admits: list[Admit] | None = None,
        class_priority: bool = True,
        name: str = "luftpause",
    ) -> None:
        self.name = name
        # B8 (``Params.kv_retention``, the ``luftpause-retain`` arm): each admitted turn's
        # retention hint, handed to its engine request (``retain_s``); a run's last turn
        # releases what it kept, as the dataplane does when a client ends the run.
        self._retain: dict[str, float] = {}
        self.world = world
        # As the flood's endpoints declare ``class_priority``: the dataplane sends each
        # turn to its engine with its class's priority (interactive 10, batch 0).
        self.class_priority = class_priority
        self.replicas = list(replicas)
        self.probe_s = probe_s
        self.tick_s = tick_s
        # With class priority the engines order their queues by class, and the service
        # then never holds an interactive turn for the cap (S4): the same spec here.
        specs = tuple(
            ReplicaSpec(r.name, EndpointKind.GENERATIVE, models, orders_classes=class_priority)
            for r in replicas
        )
        self.state: State = initial_state(specs, params, world.now)
        self._waiting: dict[str, tuple[Admitted, Refused]] = {}
        self.log = log  # every event decided, in order (the core's input, for replay)
        self.admits = admits  # every admission made, in order
        self.dropped = 0
        # What the service's /status would say, read every second of the window as the
        # flood reads it (``watch``): per replica, how often each cap, pace limit and
        # in-flight count was read (counts, not every reading: a long run at a thousand
        # replicas stays small), and how often each number of held turns.
        self._seen: dict[str, tuple[Counter[int | None], ...]] = {}
        self._held: Counter[int | None] = Counter()

    def watch(self, since: float, every: float = 1.0) -> None:
        """Read the core's replicas and held turns every ``every`` s from ``since``."""

        def sample() -> None:
            for name, rep in self.state.replicas.items():
                seen = self._seen.get(name)
                if seen is None:
                    seen = self._seen[name] = (Counter(), Counter(), Counter())
                seen[0][rep.cap] += 1
                seen[1][rep.pace_cap] += 1
                seen[2][rep.in_flight] += 1
            self._held[len(self.state.held)] += 1
            self.world.after(every, sample)

        self.world.at(since, sample)

    def scheduler_figures(self) -> dict[str, Any]:
        """Medians of the readings, as the flood reports a luftpause arm's /status: per
        replica its cap and batch limit from the pace (each over the readings that had
        one: null is "not limited") and turns in flight; the turns held in all."""
        if not self._held:
            return {}
        return {
            "samples": self._held.total(),
            "replicas": {
                name: {
                    "capacity": counted_median(seen[0]),
                    "batch_limit_from_pace": counted_median(seen[1]),
                    "in_flight": counted_median(seen[2]),
                }
                for name, seen in sorted(self._seen.items())
            },
            "held": counted_median(self._held),
        }

    def start(self) -> None:
        self._probe()  # the service probes every replica before it admits anything
        self.world.after(self.tick_s, self._tick)

    def _apply(self, event: Event) -> None:
        if self.log is not None:
            self.log.append(event)
        self.state, actions = decide(self.state, event)
        for action in actions:
            if isinstance(action, Admit):
                if self.admits is not None:
                    self.admits.append(action)
                if action.retain_s > 0:
                    self._retain[action.turn_id] = action.retain_s
                answer = self._waiting.pop(action.turn_id, None)
                if answer is not None:
                    answer[0](action.replica, action.held_s)
            elif isinstance(action, Reject):
                answer = self._waiting.pop(action.turn_id, None)
                if answer is not None:
                    answer[1](action.message)
            elif isinstance(action, DropTurn):
                self.dropped += 1

    def _probe(self) -> None:
        now = self.world.now
        for replica in self.replicas:
            m = replica.metrics()
            self._apply(
                ReplicaProbed(
                    at=now,
                    replica=replica.name,
                    healthy=True,
                    running=m.running_gauge,
                    waiting=m.queue_gauge,
                    kv_usage=m.token_usage,
                    kv_tokens=m.max_tokens,  # (as the service reads the engine's pool)
                )
            )
        self.world.after(self.probe_s, self._probe)

    def _tick(self) -> None:
        self._apply(ClockTicked(at=self.world.now))
        self.world.after(self.tick_s, self._tick)

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        self._waiting[ask.turn_id] = (admitted, refused)
        self._apply(
            TurnRequested(
                at=self.world.now,
                turn_id=ask.turn_id,
                run_id=ask.run_id,
                model=ask.model,
                service_class=ServiceClass(ask.cls),
                caller=ask.caller,
                dataplane_id="sim",
            )
        )

    def priority(self, cls: str) -> int:
        return ENGINE_PRIORITY[cls] if self.class_priority else 0

    def retain_s(self, turn_id: str) -> float:
        return self._retain.pop(turn_id, 0.0)

    def started(self, turn_id: str) -> None:
        self._apply(TurnStarted(at=self.world.now, turn_id=turn_id))

    def first_token(self, turn_id: str) -> None:
        self._apply(FirstTokenReceived(at=self.world.now, turn_id=turn_id))

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        if self.state.params.kv_retention and not end.paused_on_tool:
            for replica in self.replicas:  # the run's last turn: it ends (B8's release)
                replica.release(ask.run_id)
        self._apply(
            TurnFinished(
                at=self.world.now,
                turn_id=ask.turn_id,
                paused_on_tool=end.paused_on_tool,
                finish_reason=end.finish_reason,
                prompt_tokens=end.prompt_tokens,
                completion_tokens=end.completion_tokens,
                cached_tokens=end.cached_tokens,
            )
        )


class _Unhosted:
    """An arm with no scheduler to start or to tell how a turn is going."""

    def start(self) -> None:
        return None

    def started(self, turn_id: str) -> None:
        return None

    def first_token(self, turn_id: str) -> None:
        return None

    def retain_s(self, turn_id: str) -> float:
        return 0.0


@dataclass
class RouterArm(_Unhosted):
    """No admission; every turn placed by the SGLang router's ``cache_aware`` (0.3.2, as the
    flood runs it; ``placement``). A turn's text extends its run's last, so a run's turns
    stay on the replica of its first unless the loads grow far apart."""

    replicas: Sequence[Replica]
    name: str = "router"
    holds: bool = False
    placement: Placement = field(default_factory=router_placement)

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        admitted(self.placement.place(ask.routing_text, self.replicas), 0.0)

    def priority(self, cls: str) -> int:
        return 0

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        return None


@dataclass
class EnginePriorityArm(_Unhosted):
    """Straight to the engines: agent i on replica i mod N, the class as body priority."""

    replicas: Sequence[Replica]
    name: str = "engine-prio"
    holds: bool = False

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        admitted(self.replicas[ask.agent % len(self.replicas)].name, 0.0)

    def priority(self, cls: str) -> int:
        return ENGINE_PRIORITY[cls]

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        return None


@dataclass
class _Queued:
    ask: Ask
    admitted: Admitted
    since: float


class SmgArm(_Unhosted):
    """The SGLang Model Gateway (PyPI ``smg`` 1.13) in front of the replicas, as
    ``tools/bench/flood.py`` runs it, modelled from its documented behaviour and what the
    flood measured of it (``docs/benchmarks/fidelity.md`` says what is left out).

    Placement: sticky sessions keyed on the run ID: a run's turns go to the replica of its
    first turn, which ``placement`` chooses (SMG's ``--policy``: ``cache_aware`` by
    default, as SMG's own default and the flood's). A placement that prices engines by
    their load (``cache_aware``, ``least_load``) hears a read of every engine's gauges
    from the start and every ``poll_s`` model seconds after (SMG's
    ``--load-monitor-interval``). Every turn carries its class's engine priority, as the
    flood's SMG arms send it. Admission, one of three:

    * ``capacity=None`` (the ``smg`` arm): the priority scheduler with the capacity the fake
      engines report (3,437 running requests each), so nothing ever waits in it;
    * ``priority=True`` (``smg-capC``): the priority scheduler with ``capacity`` slots over
      all replicas, ``reserved`` of them kept for interactive turns; queues by class,
      interactive first, first come first served within a class, except that a queue head
      that has waited longer than its class's starvation threshold goes first;
    * ``priority=False`` (``smg-fifoC``): the legacy admission, ``capacity`` slots and one
      first-come-first-served queue, blind to classes.
    """

    holds = True

    def __init__(
        self,
        world: World,
        replicas: Sequence[Replica],
        capacity: int | None = None,
        priority: bool = True,
        reserved: int = SMG_INTERACTIVE_RESERVED,
        name: str = "smg",
        placement: Placement | None = None,
        poll_s: float = SMG_LOAD_POLL_S,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError("an SMG arm's capacity must be at least 1")
        if not poll_s > 0:
            raise ValueError(f"an SMG arm's load poll must be a positive interval, not {poll_s}")
        if capacity is not None and priority and capacity <= reserved:
            raise ValueError(
                f"SMG's priority scheduler needs more slots ({capacity}) than it reserves for "
                f"interactive turns ({reserved})"
            )
        self.world = world
        self.replicas = list(replicas)
        self.capacity = capacity
        self.by_class = priority
        self.reserved = reserved if priority else 0
        self.name = name
        self.placement = smg_placement("cache_aware") if placement is None else placement
        self.poll_s = poll_s
        self.in_flight = 0
        self.interactive_in_flight = 0
        # one FIFO per class (priority scheduler) or a single one (legacy admission)
        self._queues: dict[str, list[_Queued]] = {"interactive": [], "batch": []}
        self._pins: dict[str, str] = {}

    def start(self) -> None:
        if isinstance(self.placement, LoadPriced):
            self._poll()

    def _poll(self) -> None:
        """SMG's load monitor: every engine's gauges, read now, then again after
        ``poll_s``."""
        assert isinstance(self.placement, LoadPriced)
        reports = {}
        for replica in self.replicas:
            m = replica.metrics()
            reports[replica.name] = LoadReport(m.running_gauge, m.queue_gauge, m.token_usage)
        self.placement.poll(reports)
        self.world.after(self.poll_s, self._poll)

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        queue = self._queues[ask.cls if self.by_class else "batch"]
        queue.append(_Queued(ask, admitted, self.world.now))
        self._dispatch()

    def priority(self, cls: str) -> int:
        return ENGINE_PRIORITY[cls]

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        self.in_flight -= 1
        if ask.cls == "interactive":
            self.interactive_in_flight -= 1
        if not end.paused_on_tool:
            self._pins.pop(ask.run_id, None)  # the run is over; its next run starts afresh
        self._dispatch()

    def _fits(self, cls: str) -> bool:
        if self.capacity is None:
            return True
        free = self.capacity - self.in_flight
        if cls == "interactive":
            return free > 0
        # the slots reserved for interactive turns and not used by them stay free
        return free > max(0, self.reserved - self.interactive_in_flight)

    def _next(self) -> _Queued | None:
        """The queue head to admit next, if it fits."""
        now = self.world.now
        heads = [(cls, q[0]) for cls, q in self._queues.items() if q]
        if not heads:
            return None
        # class order, a starved head first (SMG's starvation promotion)
        heads.sort(
            key=lambda h: (
                now - h[1].since <= SMG_STARVATION_S[SMG_CLASS[h[0]]],
                h[0] != "interactive",
            )
        )
        for cls, head in heads:
            # a batch head that does not fit leaves the slots reserved for interactive
            # turns to an interactive head; an interactive head fits wherever one does
            if self._fits(head.ask.cls):
                self._queues[cls].pop(0)
                return head
        return None

    def _dispatch(self) -> None:
        while (head := self._next()) is not None:
            ask = head.ask
            self.in_flight += 1
            if ask.cls == "interactive":
                self.interactive_in_flight += 1
            replica = self._pins.get(ask.run_id)
            if replica is None:
                replica = self.placement.place(ask.routing_text, self.replicas)
                self._pins[ask.run_id] = replica
            head.admitted(replica, self.world.now - head.since)


class VllmRouterArm(_Unhosted):
    """vLLM's router (PyPI ``vllm-router`` 0.1.17) with ``--enable-program-scheduling``, as
    ``vllm_router.py`` models it: each turn a request of program ``run_id`` with its
    class's ``priority`` (interactive 1, batch 0, as ``luftpause loadgen --program-context
    xargs`` sends them: larger resumes first) and
    ``expected_resume`` (False on a run's last turn); the engines' metrics read every
    ``poll_s`` (``metrics_interval_seconds``), the periodic decisions run after each read.
    ``token_capacity``: ``token_capacity_per_target`` (None: unset, the default).
    ``clock_scale``: model seconds per second of the router's own clock. The scheduler
    runs on that clock (model time over ``clock_scale``): its metrics interval, progress
    TTL, force-resume and queue timeouts, and the return intervals and latencies its
    TTL fit reads. tools/bench/flood.py's ``--time-scale`` S runs the engines and tools S
    times faster than real time and vLLM's router in real seconds, so a flood at S is
    reproduced with ``clock_scale`` S (at 5 the fitted TTL covers a 1-model-second tool
    call, at 1 it does not).

    Assumptions (``docs/benchmarks/fidelity.md``): the requests carry no body ``priority`` for the
    engine (the class goes to the router only); a request the router gives up after its
    queue timeout is refused; the HTTP path completes every request with
    ``terminate=false``, as the source's ``program_adapter.rs`` does."""

    holds = True

    def __init__(
        self,
        world: World,
        replicas: Sequence[Replica],
        token_capacity: int | None = None,
        name: str = "vllm-prog",
        poll_s: float = METRICS_INTERVAL_S,
        stats_window: int | None = None,
        clock_scale: float = 1.0,
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"vLLM router's metrics interval must be positive, not {poll_s}")
        if not clock_scale > 0:
            raise ValueError(f"vLLM router's clock scale must be positive, not {clock_scale}")
        self.world = world
        self.clock_scale = clock_scale
        self.replicas = list(replicas)
        self.name = name
        self.poll_s = poll_s
        kwargs = {} if stats_window is None else {"stats_window": stats_window}
        self.scheduler = ProgramScheduler(
            [r.name for r in self.replicas], self._dispatched, token_capacity, poll_s, **kwargs
        )
        self._asks: dict[str, tuple[Ask, Admitted, float]] = {}

    def _clock(self) -> float:
        """The router's own clock: model time over ``clock_scale``."""
        return self.world.now / self.clock_scale

    def start(self) -> None:
        self._poll()

    def _poll(self) -> None:
        now = self._clock()
        for replica in self.replicas:
            m = replica.metrics()
            self.scheduler.observe(replica.name, m.token_usage, m.running_gauge, m.queue_gauge, now)
        self.scheduler.tick(now)
        self.world.after(self.poll_s * self.clock_scale, self._poll)

    def _dispatched(self, request: Retained, target: str) -> None:
        _, admitted, since = self._asks[request.token]
        admitted(target, self.world.now - since)

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        now = self._clock()
        retained = Retained(ask.turn_id, now, ask.context_tokens, PROGRAM_PRIORITY[ask.cls])
        self._asks[ask.turn_id] = (ask, admitted, self.world.now)

        def timeout() -> None:
            if self.scheduler.cancel(ask.run_id, retained, self._clock()):
                self._asks.pop(ask.turn_id, None)
                refused(f"retained in vLLM router's request pool for {QUEUE_TIMEOUT_S:g} s")

        self.world.after(QUEUE_TIMEOUT_S * self.clock_scale, timeout)
        self.scheduler.acquire(ask.run_id, retained, now, ask.expected_resume)

    def priority(self, cls: str) -> int:
        return 0

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        self._asks.pop(ask.turn_id, None)
        self.scheduler.complete(
            ask.run_id, end.prompt_tokens, end.completion_tokens, end.cached_tokens,
            self._clock(), success=end.finish_reason != "error", terminate=False,
        )  # fmt: skip
