"""D10: the dataplane's own Prometheus metrics. ``errors.Outcome`` values are the outcome labels."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The proxy's own time per turn: fine below 5 ms, with edges at 1, 2 and 5 ms so that
# "at most 1 / 2 / 5 ms at p50 or p99" reads off the cumulative counts exactly.
_OWN_BUCKETS = (
    0.00025, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175, 0.002, 0.0025, 0.003,
    0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.5,
)  # fmt: skip

M = TypeVar("M", Counter, Gauge, Histogram)


class Children(Generic[M]):
    """A labelled metric's children by label values, each looked up once: ``labels()``
    checks its values and takes a lock at every call, and a turn makes several. The
    values are bounded sets here (service classes, outcomes)."""

    __slots__ = ("_made", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._made: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series are noise
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_* series
        self.turns = Counter(
            "luftpause_dataplane_turns",
            "Turns by service class and outcome.",
            ["service_class", "outcome"],
            registry=self.registry,
        )
        self.held = Histogram(
            "luftpause_dataplane_held_seconds",
            "Time a turn waited for admission.",
            ["service_class"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "luftpause_dataplane_time_to_first_token_seconds",
            "From forwarding to the engine until the first token.",
            ["service_class"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.own = Histogram(
            "luftpause_dataplane_own_seconds",
            "Per turn whose engine answered 200 and whose reply came in whole: the time "
            "spent in the dataplane less the engine's reply and the scheduler's hold for "
            "capacity.",
            buckets=_OWN_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "luftpause_dataplane_turns_in_flight",
            "Turns admitted and not yet ended.",
            ["service_class"],
            registry=self.registry,
        )
        self.holding = Gauge(
            "luftpause_dataplane_turns_held",
            "Turns waiting for admission.",
            ["service_class"],
            registry=self.registry,
        )
        self.denied = Counter(
            "luftpause_dataplane_class_denied",
            "Turns of a keyed caller that asked for a class its key may not use (B13), by "
            "caller (configured names only) and what was done: downgraded or refused.",
            ["caller", "action"],
            registry=self.registry,
        )
        self.over_quota = Counter(
            "luftpause_dataplane_over_quota",
            "Turns refused with a 429 because their caller had spent its tokens per minute "
            "or its daily tokens (B13), by limit.",
            ["limit"],
            registry=self.registry,
        )

        # the children by label values (see ``Children``)
        self.turns_of = Children(self.turns)
        self.held_of = Children(self.held)
        self.ttft_of = Children(self.ttft)
        self.in_flight_of = Children(self.in_flight)
        self.holding_of = Children(self.holding)
        self.class_denied = Children(self.denied)
        self.over_quota_of = Children(self.over_quota)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
