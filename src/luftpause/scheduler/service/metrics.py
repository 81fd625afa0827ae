"""The scheduler's Prometheus metrics (``GET /metrics`` on the status HTTP port).

Two kinds of series, all prefixed ``luftpause_scheduler_``:

* **State gauges**, computed at scrape time from the current (immutable) state by a
  custom collector, so the writer pays nothing per event for them: per replica
  health, in-flight turns, cap, reservations, pinned runs, batch turns in flight and
  the decode pace's limit, smoothed pace, target pace and withheld batch slots (the
  interactive target's cost), the engine's running and
  waiting requests and KV-cache usage from the last probe; held turns, distinct
  callers with held turns and the oldest held turn's age by class; in-flight turns by
  class; runs by phase and class; lost dataplanes; prefix misses per replica.
* **Event counters and histograms**, updated by the host right after each ``decide``
  call from the actions it returned: admissions (by replica and class), rejections and
  drops (by reason), forgotten runs, the wait of each admitted turn, and the time of
  the ``decide`` call itself (by event type).

Label cardinality is bounded by the configuration (replicas) and by enums (class,
phase, reason, event type); runs never become labels. Callers do only as
:class:`CallerLabels` bounds them (B13): a configured caller's name, up to
:data:`SUB_LABELS` of its sub-callers (``alice/ci``, the first seen), then
``alice/other``; every caller that is not configured is ``other``. Without
``[[callers]]`` every caller is ``other``.

Each :class:`SchedulerMetrics` has its own registry, so several schedulers in one
process (tests) do not share counters. The series are listed in
docs/reference/metrics.md, generated from the registries; docs/reference/scheduler-api.md
says what the help texts leave out.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from luftpause.scheduler.core import (
    Action,
    Admit,
    DropReason,
    DropTurn,
    Event,
    ForgetRun,
    Reject,
    RejectCode,
    RunPhase,
    ServiceClass,
    State,
    target,
    working_set,
)
from luftpause.scheduler.core.view import lapsed_by_replica

PREFIX = "luftpause_scheduler_"

# One decide call takes microseconds; the upper buckets catch a pathological event.
DECIDE_BUCKETS = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    1e-2,
    0.1,
)
# How long an admitted turn was held: nothing (idle pool) to minutes (saturated pool).
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

CLASSES = tuple(c.value for c in ServiceClass)
OVER_QUOTA = "over_quota"  # the rejections' reason for B13's refusals (not a core code)


def event_label(event_type: type) -> str:
    """``TurnRequested`` -> ``turn_requested`` (the ``event`` label of decide's histogram)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", event_type.__name__).lower()


EVENT_TYPES: tuple[type, ...] = get_args(Event)

SUB_LABELS = 8  # sub-callers of a configured caller with their own label value
OTHER = "other"


class CallerLabels:
    """A caller's ``caller`` label value, bounded (see the module docstring): at most
    ``len(configured) * (SUB_LABELS + 2) + 1`` values, whatever callers come."""

    def __init__(self, configured: Iterable[str] = (), per_caller: int = SUB_LABELS) -> None:
        self.configured = tuple(configured)
        self.per_caller = per_caller
        self._subs: dict[str, dict[str, None]] = {name: {} for name in self.configured}

    def __call__(self, caller: str) -> str:
        name, slash, sub = caller.partition("/")
        subs = self._subs.get(name)
        if subs is None:
            return OTHER
        if not slash:
            return name
        if sub in subs:
            return caller
        if len(subs) < self.per_caller and sub != OTHER:
            subs[sub] = None
            return caller
        return f"{name}/{OTHER}"


class _StateCollector(Collector):
    """Gauges read from the latest state at scrape time (a read, like ``/status``)."""

    def __init__(
        self, state: Callable[[], State], clock: Callable[[], float], labels: CallerLabels
    ) -> None:
        self._state = state
        self._clock = clock
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        now = self._clock()
        yield from self._replicas(state, now)
        yield from self._held(state, now)
        yield from self._turns_and_runs(state)
        yield from self._callers(state)

    @staticmethod
    def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

    def _replicas(self, state: State, now: float) -> Iterator[Metric]:
        g = self._gauge
        healthy = g("replica_healthy", "1 if the replica's last probe passed, else 0", ["replica"])
        in_flight = g(
            "replica_turns_in_flight",
            "Turns admitted to the replica and not yet ended",
            ["replica"],
        )
        cap = g(
            "replica_turn_cap",
            "In-flight turn cap set from the engine's load (S2); +Inf while not limited",
            ["replica"],
        )
        reserved = g(
            "replica_reserved_turns",
            "Slots kept free for interactive runs paused on a tool there (S4)",
            ["replica"],
        )
        pinned = g(
            "replica_pinned_runs",
            "Runs generating or paused on a tool on the replica (S3)",
            ["replica"],
        )
        run_limit = g(
            "replica_run_limit",
            "Prefix keeping: runs that may live on the replica before new batch runs wait; "
            "+Inf while not limited",
            ["replica"],
        )
        lapsed = g(
            "replica_lapsed_runs",
            "Runs paused on a tool there past their tool's lease: not counted as pinned, "
            "no reservation",
            ["replica"],
        )
        running = g(
            "engine_requests_running",
            "Requests the engine reported running at the last probe (absent: no load reported)",
            ["replica"],
        )
        waiting = g(
            "engine_requests_waiting",
            "Requests the engine reported queued at the last probe (absent: no load reported)",
            ["replica"],
        )
        kv = g(
            "engine_kv_cache_usage_ratio",
            "KV-cache usage the engine reported at the last probe, 0 to 1",
            ["replica"],
        )
        batch = g(
            "replica_batch_turns_in_flight",
            "Batch turns admitted to the replica and not yet ended",
            ["replica"],
        )
        pace_limit = g(
            "replica_batch_pace_limit",
            "Batch turns the replica takes while an interactive run lives there, set from "
            "its replies' decode pace; +Inf while not limited",
            ["replica"],
        )
        pace = g(
            "replica_reply_pace_seconds",
            "Smoothed seconds per token of the replies streamed there (absent: none yet)",
            ["replica"],
        )
        target_pace = g(
            "replica_target_pace_seconds",
            "The interactive target there: seconds per reply token its interactive replies "
            "should stay under (absent: none yet, or the decode pace is off)",
            ["replica"],
        )
        withheld = g(
            "replica_batch_withheld_by_target",
            "Batch slots the interactive target's limit keeps empty that the cap and the "
            "reservations would allow: what meeting the target costs batch work now "
            "(absent: the replica has no cap)",
            ["replica"],
        )
        wset = g(
            "replica_working_set_tokens",
            "Tokens the runs living on the replica are expected to hold in its engine's KV "
            "cache: their last prompts, a run with none counted at their mean",
            ["replica"],
        )
        pool = g(
            "replica_kv_pool_tokens",
            "The engine's KV pool in tokens, from its metrics or the endpoint's kv_tokens "
            "(absent: unknown)",
            ["replica"],
        )
        probe_age = g(
            "replica_probe_age_seconds",
            "Time since the replica's last probe result",
            ["replica"],
        )
        misses = CounterMetricFamily(
            PREFIX + "prefix_misses",
            "Turns back from a tool that found their run's prefix evicted on the replica",
            labels=["replica"],
        )
        lapsed_on = lapsed_by_replica(state)
        for name in sorted(state.replicas):
            rep = state.replicas[name]
            labels = [name]
            run_limit.add_metric(labels, float("inf") if rep.run_limit is None else rep.run_limit)
            lapsed.add_metric(labels, lapsed_on[name])
            healthy.add_metric(labels, 1.0 if rep.healthy else 0.0)
            in_flight.add_metric(labels, rep.in_flight)
            cap.add_metric(labels, float("inf") if rep.cap is None else rep.cap)
            reserved.add_metric(labels, rep.reserved)
            pinned.add_metric(labels, rep.pinned_runs)
            batch.add_metric(labels, rep.batch_in_flight)
            pace_limit.add_metric(labels, float("inf") if rep.pace_cap is None else rep.pace_cap)
            if rep.pace_s is not None:
                pace.add_metric(labels, rep.pace_s)
            goal = target.target_pace(state.params, rep.pace_best_s)
            if goal is not None:
                target_pace.add_metric(labels, goal)
            kept = target.withheld(rep)
            if kept is not None:
                withheld.add_metric(labels, kept)
            if rep.running is not None:
                running.add_metric(labels, rep.running)
            if rep.waiting is not None:
                waiting.add_metric(labels, rep.waiting)
            if rep.kv_usage is not None:
                kv.add_metric(labels, rep.kv_usage)
            if rep.probed_at is not None:
                probe_age.add_metric(labels, max(0.0, now - rep.probed_at))
            misses.add_metric(labels, rep.prefix_misses)
            wset.add_metric(labels, working_set.working_set(rep))
            if rep.kv_tokens is not None:
                pool.add_metric(labels, rep.kv_tokens)
        yield from (healthy, in_flight, cap, reserved, pinned, run_limit, lapsed, batch)
        yield from (pace_limit, pace, target_pace, withheld)
        yield from (running, waiting, kv, wset, pool, probe_age)
        yield misses

    def _held(self, state: State, now: float) -> Iterator[Metric]:
        count = dict.fromkeys(CLASSES, 0)
        callers: dict[str, set[str]] = {c: set() for c in CLASSES}
        oldest: dict[str, float] = {}
        for h in state.held.values():
            cls = h.service_class.value
            count[cls] += 1
            callers[cls].add(h.caller)
            oldest[cls] = min(oldest.get(cls, h.requested_at), h.requested_at)
        held = self._gauge("held_turns", "Turns held by the scheduler, by class", ["service_class"])
        held_callers = self._gauge(
            "held_callers", "Distinct callers with held turns, by class", ["service_class"]
        )
        age = self._gauge(
            "held_oldest_age_seconds",
            "How long the oldest held turn has waited, by class (0 when none is held)",
            ["service_class"],
        )
        for cls in CLASSES:
            held.add_metric([cls], count[cls])
            held_callers.add_metric([cls], len(callers[cls]))
            age.add_metric([cls], max(0.0, now - oldest[cls]) if cls in oldest else 0.0)
        yield from (held, held_callers, age)

    def _turns_and_runs(self, state: State) -> Iterator[Metric]:
        turns = dict.fromkeys(CLASSES, 0)
        for t in state.turns.values():
            turns[t.service_class.value] += 1
        in_flight = self._gauge(
            "turns_in_flight",
            "Admitted turns not yet ended (all replicas, both kinds), by class",
            ["service_class"],
        )
        for cls in CLASSES:
            in_flight.add_metric([cls], turns[cls])
        yield in_flight
        runs = {(p.value, c): 0 for p in RunPhase for c in CLASSES}
        for r in state.runs.values():
            runs[(r.phase.value, r.service_class.value)] += 1
        by_phase = self._gauge(
            "runs", "Runs the scheduler knows, by phase and class", ["phase", "service_class"]
        )
        for (phase, cls), n in runs.items():
            by_phase.add_metric([phase, cls], n)
        yield by_phase
        yield GaugeMetricFamily(
            PREFIX + "callers_in_flight",
            "Distinct callers with generative turns in flight",
            value=len(state.caller_in_flight),
        )
        yield GaugeMetricFamily(
            PREFIX + "dataplanes_lost",
            "Dataplanes whose report stream ended and whose turns are not yet released (S11)",
            value=len(state.lost_dataplanes),
        )
        by_dataplane = GaugeMetricFamily(
            PREFIX + "dataplane_turns_in_flight",
            "Admitted turns per dataplane (B6)",
            labels=["dataplane"],
        )
        for dataplane, n in sorted(
            collections.Counter(t.dataplane_id for t in state.turns.values()).items()
        ):
            by_dataplane.add_metric([dataplane], n)
        yield by_dataplane

    def _callers(self, state: State) -> Iterator[Metric]:
        """B13: turns in flight and held per caller label (every configured caller's,
        0 included; the others while they have turns)."""
        label = self._labels
        in_flight = dict.fromkeys(label.configured, 0)
        held = dict.fromkeys(label.configured, 0)
        for caller, n in state.caller_in_flight.items():
            key = label(caller)
            in_flight[key] = in_flight.get(key, 0) + n
        for h in state.held.values():
            key = label(h.caller)
            held[key] = held.get(key, 0) + 1
        by_in_flight = self._gauge(
            "caller_in_flight",
            "Generative turns in flight per caller (B13): a configured caller's own, each "
            "of its first 8 sub-callers' (NAME/SUB), the rest's (NAME/other); every "
            "caller not configured as other",
            ["caller"],
        )
        by_held = self._gauge(
            "caller_held",
            "Turns held by the scheduler per caller, labelled as caller_in_flight (B13)",
            ["caller"],
        )
        for key in sorted(in_flight):
            by_in_flight.add_metric([key], in_flight[key])
        for key in sorted(held):
            by_held.add_metric([key], held[key])
        yield from (by_in_flight, by_held)


class SchedulerMetrics:
    """The registry of one scheduler: state gauges plus counters fed by :meth:`decided`."""

    def __init__(
        self,
        state: Callable[[], State],
        clock: Callable[[], float],
        labels: CallerLabels | None = None,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series are noise
        self.registry = CollectorRegistry()
        self.labels = labels or CallerLabels(state().params.callers)
        self.registry.register(_StateCollector(state, clock, self.labels))
        ProcessCollector(registry=self.registry)
        self.admissions = Counter(
            PREFIX + "admissions",
            "Turns admitted, by replica and class (a re-sent Admit is not counted again)",
            ["replica", "service_class"],
            registry=self.registry,
        )
        self.rejections = Counter(
            PREFIX + "rejections",
            "Turns rejected before queueing, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.drops = Counter(
            PREFIX + "drops",
            "Admitted turns dropped without a report, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.runs_forgotten = Counter(
            PREFIX + "runs_forgotten",
            "Runs forgotten after their idle expiry (S10)",
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            PREFIX + "admission_wait_seconds",
            "Time from a turn's request to its admission, by class",
            ["service_class"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.caller_tokens = Counter(
            PREFIX + "caller_tokens",
            "Prompt + completion tokens of finished turns per caller, labelled as "
            "caller_in_flight (B13)",
            ["caller"],
            registry=self.registry,
        )
        self.caller_refused = Counter(
            PREFIX + "caller_refused",
            "Turns refused for a caller's token limit (B13), by caller (labelled as "
            "caller_in_flight) and limit (tokens_per_minute or daily_tokens)",
            ["caller", "limit"],
            registry=self.registry,
        )
        decide_time = Histogram(
            PREFIX + "decide_duration_seconds",
            "Time of one decide(state, event) call of the pure core, by event type",
            ["event"],
            buckets=DECIDE_BUCKETS,
            registry=self.registry,
        )
        # Children bound once: the writer observes on every event.
        self._decide_time = {t: decide_time.labels(event_label(t)) for t in EVENT_TYPES}
        self._wait = {c: self.admission_wait.labels(c.value) for c in ServiceClass}
        for code in RejectCode:
            self.rejections.labels(code.value)
        self.rejections.labels(OVER_QUOTA)
        for name in self.labels.configured:
            self.caller_tokens.labels(name)
        for reason in DropReason:
            self.drops.labels(reason.value)
        self._admitted = {
            (replica, cls): self.admissions.labels(replica, cls.value)
            for replica in sorted(state().replicas)
            for cls in ServiceClass
        }

    def decided(
        self,
        event: Event,
        seconds: float,
        before: State,
        after: State,
        actions: Sequence[Action],
    ) -> None:
        """Account for one ``decide`` call: its duration and the actions it returned."""
        timer = self._decide_time.get(type(event))
        if timer is not None:
            timer.observe(seconds)
        if before.replicas is not after.replicas and len(after.replicas) < len(before.replicas):
            self._forget_replicas(set(before.replicas) - set(after.replicas))
        for action in actions:
            match action:
                case Admit():
                    if action.turn_id in before.turns:
                        continue  # the answer to a re-sent Admit: admitted before
                    turn = after.turns.get(action.turn_id)
                    if turn is None:
                        continue
                    key = (action.replica, turn.service_class)
                    counter = self._admitted.get(key)
                    if counter is None:
                        counter = self._admitted[key] = self.admissions.labels(
                            action.replica, turn.service_class.value
                        )
                    counter.inc()
                    self._wait[turn.service_class].observe(action.held_s)
                case Reject():
                    self.rejections.labels(action.code.value).inc()
                case DropTurn():
                    self.drops.labels(action.reason.value).inc()
                case ForgetRun():
                    self.runs_forgotten.inc()

    def charged(self, caller: str, tokens: int) -> None:
        """A finished turn of ``caller`` used ``tokens`` (prompt + completion)."""
        if tokens > 0:
            self.caller_tokens.labels(self.labels(caller)).inc(tokens)

    def over_quota(self, caller: str, limit: str) -> None:
        """A turn of ``caller`` was refused for its account's ``limit`` (B13)."""
        self.rejections.labels(OVER_QUOTA).inc()
        self.caller_refused.labels(self.labels(caller), limit).inc()

    def _forget_replicas(self, names: set[str]) -> None:
        """B11: a replica the core dropped (it left) takes its label values with it, so
        a fleet that churns does not grow the series without bound."""
        for name in sorted(names):
            for cls in ServiceClass:
                if self._admitted.pop((name, cls), None) is not None:
                    self.admissions.remove(name, cls.value)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
