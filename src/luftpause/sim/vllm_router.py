"""vLLM's router (PyPI ``vllm-router`` 0.1.17) with program scheduling, as the simulator's
``vllm-prog`` and ``vllm-prog-kvT`` arms use it.

Modelled on the router's Rust source (``src/program_scheduling/``: ``scheduler_state.rs``
for the defaults, ``scheduler_admission.rs`` for admission and resume order,
``scheduler_lifecycle.rs`` for completion, the acting TTL and capacity repair,
``policy.rs`` and ``factors.rs`` for the progress TTL, ``scheduler.rs`` for the logical
KV ledger, ``observations.rs`` for the metrics it reads, ``binding/mod.rs`` for the
consistent hash, ``routers/http/program_adapter.rs`` for what the HTTP path tells it);
``docs/benchmarks/fidelity.md`` ("vLLM router's program scheduling, as modelled") says which
versions were read and what is left out. In short:

* A *program* is a run (``program_id`` = the run ID). Its first request binds it to a
  *home* engine by a consistent hash (160 virtual nodes per engine); a paused program
  resumes only there (``global_queue`` is off by default).
* A request of a program that holds its engine (*active*) goes straight there. Otherwise
  the program waits in the router's request pool until admission lets it in: never while
  the engine's last read ``vllm:num_requests_waiting`` is 1 or more; with no token
  capacity configured (the default), while fewer than 64 programs are active there; with
  ``token_capacity_per_target`` T, while the engine's logical KV (its read KV usage times
  T, scaled up to the programs the router has running there, plus idle programs' private
  tokens, plus what the router admitted since the read) leaves room for the program's
  private tokens (context less its observed shared prefix, plus 100 for decode) and, once
  100 requests have been seen there, a growth reserve. A program waiting longer than
  300 s (the force-resume bound) is admitted regardless of count and tokens, though not of
  the waiting gate; a request retained 600 s is refused.
* Resume order: force-resumed first, then the larger request ``priority``, then the most
  recently finished program (MRU), then the longest queued.
* When a program's request ends it stays active (*acting*: its tool runs) for its
  *progress TTL*, then is paused and frees its engine's count and tokens. The TTL is 0
  until 100 same-program return intervals have been seen on that engine, then the
  lognormal fit of those intervals that maximises ``P(T<d) C - E[T; T<d] - d P(T>=d)``
  for the request's recompute cost C, capped at min(10 s, C); a request's
  ``kv_retention_ttl_seconds`` replaces it.
* ``expected_resume`` is parsed and kept, but the HTTP path completes every request with
  ``terminate=false``: a run's last turn is held for its TTL like any other. The core
  releases a program at once only when told to terminate (``complete(..., terminate)``).
* The router reads every engine's ``/metrics`` every second (``metrics_interval``) and
  runs its periodic decisions (TTL expiry, capacity repair, resume) after each read.
* Every time here is on the router's own clock: a program's ``ttl_deadline``,
  ``last_request_finished_at``, ``queued_at`` and ``force_resume_deadline`` are
  ``Option<Instant>`` (``scheduler_state.rs``), the return intervals ``factors.rs`` fits
  and the metrics loop's interval are real seconds. The arm (``sim/arms.py``,
  ``clock_scale``) maps that clock to model time. A
  flood at ``--time-scale`` S runs the engines and tools S times faster and the router in
  real seconds: there a 1-model-second tool call returns in 0.2 router seconds, inside a
  TTL capped at the recompute cost (about 0.37 s for 2,000 uncached tokens), where at
  S = 1 it would return past it and the program would be paused every turn.

Not modelled: the batch-gain bypass of the growth reserve, the segment-round yield
(``max_segment_rounds``), cross-engine resume (``global_queue``, off by default), the
workload-derived shortening of the 300 s force-resume deadline, and observation I/O time.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# ProgramSchedulerConfig::default() and ProgressTtlConfig::default()
METRICS_INTERVAL_S = 1.0
MAX_ACTIVE_PROGRAMS_PER_TARGET = 64
ADMISSION_WAITING_REQUEST_THRESHOLD = 1
QUEUE_TIMEOUT_S = 600.0
FORCE_RESUME_TIMEOUT_S = 300.0
PAUSED_RETENTION_TTL_S = 1800.0
SHARED_PREFIX_FRESHNESS_WARMUP_S = 100.0
SHARED_PREFIX_FRESHNESS_KV_TURNOVERS = 2.0
HASH_VIRTUAL_NODES = 160
DECODE_BUFFER_TOKENS = 100
MAX_ACTING_TTL_S = 10.0
HIGH_WATERMARK_RATIO = 1.0
LOW_WATERMARK_RATIO = 1.0
MAX_SEGMENT_ROUNDS = 14
STATS_WINDOW_SIZE = 100
# prefill_cost_model defaults
PREFILL_INTERCEPT_S = 0.06600061907132926
PREFILL_LINEAR_S_PER_1K = 0.05702024012166613
PREFILL_QUADRATIC_S_PER_1K2 = 0.0044057347937978475
DECODE_THROUGHPUT_ALPHA = 0.15
# scheduler_lifecycle.rs
CACHE_CONTINUITY_HIT_RATIO = 0.9
# A class's request ``priority`` in ``agentic_context``: larger resumes first.
# the agentic_context priority per class, as luftpause loadgen --program-context sends it
PROGRAM_PRIORITY = {"interactive": 1, "batch": 0}


def cache_miss_impact_s(uncached_prompt_tokens: int) -> float:
    """``ProgressTtlPolicyMath::cache_miss_impact_seconds``: recomputing that many tokens."""
    if uncached_prompt_tokens <= 0:
        return 0.0
    x = uncached_prompt_tokens / 1000.0
    prefill = PREFILL_INTERCEPT_S + PREFILL_LINEAR_S_PER_1K * x
    prefill += PREFILL_QUADRATIC_S_PER_1K2 * x * x
    return prefill * (2.0 - DECODE_THROUGHPUT_ALPHA)


def _normal_cdf(value: float) -> float:
    """The source's Abramowitz-Stegun erf (``policy.rs``)."""
    x = value / math.sqrt(2.0)
    sign = -1.0 if x < 0 else 1.0
    x = abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = ((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736
    poly = (poly * t + 0.254829592) * t
    erf = sign * (1.0 - poly * math.exp(-x * x))
    return min(max(0.5 * (1.0 + erf), 0.0), 1.0)


def fitted_acting_ttl_s(
    intervals: Sequence[float],
    impact_s: float,
    window: int = STATS_WINDOW_SIZE,
    cap_s: float = MAX_ACTING_TTL_S,
) -> float:
    """``fitted_acting_ttl``: 0 until ``window`` intervals are known, then the candidate TTL
    of best utility under a lognormal fit of them (0 where none is positive)."""
    if window <= 0 or len(intervals) < window:
        return 0.0
    xs = [i for i in intervals if math.isfinite(i) and i > 0]
    if not xs:
        return 0.0
    logs = [math.log(i) for i in xs]
    mu = sum(logs) / len(logs)
    sigma = max(math.sqrt(sum((v - mu) ** 2 for v in logs) / len(logs)), 1e-6)
    max_ttl = min(cap_s, impact_s)
    if max_ttl <= 0 or impact_s <= 0:
        return 0.0
    min_ttl = min(0.05, max_ttl)
    candidates = [0.0, min_ttl, max_ttl]
    if max_ttl > min_ttl:
        lo, hi = math.log(min_ttl), math.log(max_ttl)
        candidates += [math.exp(lo + (hi - lo) * k / 31) for k in range(32)]
    mean = math.exp(mu + sigma * sigma / 2)
    best, best_u = 0.0, -math.inf
    for ttl in candidates:
        if ttl <= 0:
            u = 0.0
        else:
            p = _normal_cdf((math.log(ttl) - mu) / sigma)
            truncated = mean * _normal_cdf((math.log(ttl) - mu - sigma * sigma) / sigma)
            u = impact_s * p - truncated - ttl * (1 - p)
        if u >= best_u:
            best, best_u = ttl, u
    return 0.0 if best_u < 0 else best


def _hash64(text: str) -> int:
    # Assumption: a stable 64-bit hash stands in for ``ConsistentHashPolicy::fbi_hash``
    # (not read); only the spread of keys over the ring matters here.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHashRing:
    """``ConsistentHashBinding``: ``virtual_nodes`` points per target, ``target:i``
    hashed; a key goes to the first point at or after its hash (wrapping)."""

    def __init__(self, targets: Sequence[str], virtual_nodes: int = HASH_VIRTUAL_NODES) -> None:
        points = sorted(
            (_hash64(f"{t}:{i}"), t) for t in sorted(targets) for i in range(virtual_nodes)
        )
        self._hashes = [h for h, _ in points]
        self._targets = [t for _, t in points]

    def target(self, key: str) -> str:
        at = bisect_left(self._hashes, _hash64(key))
        return self._targets[at % len(self._targets)]


@dataclass
class _RequestSample:
    prompt: int
    completion: int
    cached: int
    growth: int | None
    e2e_s: float
    rounds_since_ttl_pause: int


@dataclass
class RankFactors:
    """``ProgressTtlFactors``: per engine, the last ``STATS_WINDOW_SIZE`` requests and
    same-program return intervals."""

    window: int = STATS_WINDOW_SIZE
    requests: deque[_RequestSample] = field(default_factory=deque)
    intervals: deque[float] = field(default_factory=deque)

    def push_request(self, sample: _RequestSample) -> None:
        if len(self.requests) == self.window:
            self.requests.popleft()
        self.requests.append(sample)

    def push_interval(self, interval_s: float) -> None:
        if len(self.intervals) == self.window:
            self.intervals.popleft()
        self.intervals.append(interval_s)

    def request_window_complete(self) -> bool:
        return self.window > 0 and len(self.requests) >= self.window

    def mean(self, values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    def target_rounds(self) -> float:
        if not self.request_window_complete():
            return 0.0
        avg = self.mean([float(s.rounds_since_ttl_pause) for s in self.requests])
        return min(max(math.ceil(2 * avg), 1.0), float(MAX_SEGMENT_ROUNDS))

    def growth_reserve(self, active_remaining: list[float]) -> float:
        rounds = self.target_rounds()
        growth = self.mean([float(s.growth) for s in self.requests if s.growth is not None])
        if rounds <= 0 or growth <= 0:
            return 0.0
        return growth * (rounds + sum(active_remaining))


@dataclass
class Retained:
    """One request in the router's request pool."""

    token: Any  # the caller's handle, given back on dispatch
    arrived_at: float
    context_tokens: int
    priority: int = 0
    kv_retention_ttl_s: float | None = None
    starts_placement: bool = False  # set on dispatch: the first of a placement
    dispatched_at: float | None = None


@dataclass
class Program:
    program_id: str
    home: str
    expected_resume: bool = True
    active: bool = False
    acting: bool = False  # status: acting (its tool runs) or reasoning
    placement: str | None = None
    in_flight: list[Retained] = field(default_factory=list)
    waiting: list[Retained] = field(default_factory=list)
    placement_start_pending: bool = False
    context_tokens: int = 0
    shrink_observations: int = 0
    shared_prefix: int = 0
    shared_prefix_observed: bool = False
    freshness_anchor: float = 0.0
    fresh_until: float | None = None
    completed: int = 0
    rounds_since_activation: int = 0
    rounds_since_ttl_pause: int = 0
    segment_started_at: float | None = None
    last_context: int | None = None
    last_finished_at: float | None = None
    last_impact_s: float = 0.0
    ttl_deadline: float | None = None
    queued_at: float | None = None
    force_deadline: float | None = None
    paused_at: float | None = None
    pause_reason: str | None = None
    pause_when_idle: bool = False
    terminate_when_idle: bool = False

    def private_tokens(self) -> float:
        return float(max(0, self.context_tokens - self.shared_prefix) + DECODE_BUFFER_TOKENS)

    def priority(self) -> int:
        return self.waiting[0].priority if self.waiting else 0


@dataclass
class _Observation:
    kv_usage: float
    running: int
    waiting: int
    at: float
    tokens: float | None  # estimated active program tokens (with a token capacity)


Dispatched = Callable[[Retained, str], None]  # the request, its engine


class ProgramScheduler:
    """The router's ``ProgramScheduler`` with ``global_queue`` off, in virtual time: every
    method takes the time it happens at; ``dispatched`` hears each request sent."""

    def __init__(
        self,
        targets: Sequence[str],
        dispatched: Dispatched,
        token_capacity: int | None = None,
        metrics_interval_s: float = METRICS_INTERVAL_S,
        stats_window: int = STATS_WINDOW_SIZE,
    ) -> None:
        if token_capacity is not None and token_capacity < 1:
            raise ValueError("token_capacity_per_target must be at least 1 token")
        self.targets = list(targets)
        self.ring = ConsistentHashRing(self.targets)
        self.dispatched = dispatched
        self.token_capacity = token_capacity
        self.metrics_interval_s = metrics_interval_s
        self.programs: dict[str, Program] = {}
        self.queues: dict[str, list[str]] = {t: [] for t in self.targets}
        self.factors = {t: RankFactors(stats_window) for t in self.targets}
        self.observations: dict[str, _Observation] = {}
        self.delta: dict[str, float] = dict.fromkeys(self.targets, 0.0)
        self.transitions: list[tuple[float, str, str]] = []  # (time, program, what)

    # ------------------------------------------------------------ observation

    def observe(self, target: str, kv_usage: float, running: int, waiting: int, now: float) -> None:
        """One read of ``target``'s metrics (``apply_observations``)."""
        tokens = None
        if self.token_capacity is not None:
            native = kv_usage * self.token_capacity
            reasoning = [p for p in self._active(target) if not p.acting]
            if running > 0:
                est = native * max(len(reasoning), running) / running
            elif reasoning:
                est = sum(p.private_tokens() for p in reasoning)
            else:
                est = native
            acting = sum(p.private_tokens() for p in self._active(target) if p.acting)
            tokens = est + acting
        self.observations[target] = _Observation(kv_usage, running, waiting, now, tokens)
        self.delta[target] = 0.0  # the read includes everything admitted before it

    def _fresh(self, target: str, now: float) -> _Observation | None:
        o = self.observations.get(target)
        if o is not None and now - o.at <= 3 * self.metrics_interval_s:
            return o
        return None

    def _active(self, target: str) -> list[Program]:
        return [p for p in self.programs.values() if p.active and p.placement == target]

    def usage(self, target: str, now: float) -> float:
        """``target_usage``: the read estimate plus the router's changes since, or (no
        fresh read with a token estimate) its ledger of active programs."""
        o = self._fresh(target, now)
        if o is not None and o.tokens is not None:
            return max(0.0, o.tokens + self.delta[target])
        return sum(p.private_tokens() for p in self._active(target))

    # ------------------------------------------------------------ requests

    def acquire(self, program_id: str, request: Retained, now: float,
                expected_resume: bool = True) -> None:  # fmt: skip
        """A request of ``program_id`` arrives (``acquire_synced``)."""
        p = self.programs.get(program_id)
        if p is None:
            p = Program(program_id, self.ring.target(program_id), expected_resume, paused_at=now)
            p.queued_at = now
            p.context_tokens = request.context_tokens
            self.programs[program_id] = p
            previous = 0.0
        else:
            if not p.in_flight and p.last_finished_at is not None:
                self.factors[p.home].push_interval(now - p.last_finished_at)
            previous = p.private_tokens()
            if request.context_tokens >= p.context_tokens:
                p.context_tokens = request.context_tokens
                p.shrink_observations = 0
        p.expected_resume = expected_resume
        p.acting = False
        p.waiting.append(request)
        if p.active:
            if not p.pause_when_idle and p.private_tokens() > previous:
                self.delta[p.home] += p.private_tokens() - previous
        else:
            if program_id not in self.queues[p.home]:
                self.queues[p.home].append(program_id)
            if p.queued_at is None:
                p.queued_at = now
            if p.force_deadline is None:
                # Assumption: the static bound; the source may shorten it from the
                # queued work and the measured request rate.
                p.force_deadline = now + FORCE_RESUME_TIMEOUT_S
        self._release_expired_paused(now)
        self._expire_ttls(now)
        self._repair_capacity(now)
        self._schedule(now)
        if p.active and p.waiting:
            self._claim(p, now)

    def cancel(self, program_id: str, request: Retained, now: float) -> bool:
        """A retained request given up (its queue timeout); False if it was sent."""
        p = self.programs.get(program_id)
        if p is None or request not in p.waiting:
            return False
        p.waiting.remove(request)
        if not p.in_flight and not p.waiting:
            p.acting = True
            if p.active:
                self.delta[p.home] -= p.private_tokens()
                p.active, p.placement = False, None
                p.paused_at, p.pause_reason = now, "request_cancelled"
            if program_id in self.queues[p.home]:
                self.queues[p.home].remove(program_id)
            if p.completed == 0:
                self.release(program_id, now)
        self._schedule(now)
        return True

    def complete(self, program_id: str, prompt_tokens: int, completion_tokens: int,
                 cached_tokens: int, now: float, *, success: bool = True,
                 terminate: bool = False) -> None:  # fmt: skip
        """A request of ``program_id`` ended (``complete``)."""
        p = self.programs.get(program_id)
        if p is None or not p.active or not p.in_flight:
            return
        request = p.in_flight.pop(0)
        target = p.home
        before = p.private_tokens()
        shared = min(p.shared_prefix, prompt_tokens)
        impact = cache_miss_impact_s(prompt_tokens - shared)
        if request.kv_retention_ttl_s is not None:
            ttl = request.kv_retention_ttl_s
        else:
            ttl = fitted_acting_ttl_s(
                list(self.factors[target].intervals), impact, self.factors[target].window
            )
        idle = not p.in_flight and not p.waiting
        if idle:
            p.acting = True
        if not p.in_flight and p.waiting:
            p.pause_when_idle = False  # a successor continues the placement
        p.terminate_when_idle |= terminate
        action = None
        if idle:
            if p.terminate_when_idle:
                action = "terminate"
            elif p.pause_when_idle or not success:
                action = "pause"
                self._pause(p, "capacity_repair" if p.pause_when_idle else "request_failed", now)
            else:
                action = "ttl"
        previous = p.last_context
        growth = None
        if previous and 0 < prompt_tokens - previous < previous:
            growth = prompt_tokens - previous
        continuous = previous is None or cached_tokens >= CACHE_CONTINUITY_HIT_RATIO * previous
        new_segment = request.starts_placement and (previous is None or not continuous)
        due = new_segment and (
            not p.shared_prefix_observed or p.fresh_until is None or now >= p.fresh_until
        )
        if prompt_tokens >= p.context_tokens:
            p.context_tokens, p.shrink_observations = prompt_tokens, 0
        else:
            p.shrink_observations += 1
            if p.shrink_observations >= 2:
                p.context_tokens, p.shrink_observations = prompt_tokens, 0
        if success:
            if new_segment:
                p.segment_started_at = request.dispatched_at
                if due:
                    p.shared_prefix = min(cached_tokens, prompt_tokens)
                    p.shared_prefix_observed = True
                    p.fresh_until = p.freshness_anchor + self._freshness(target)
            p.completed += 1
            p.rounds_since_activation += int(continuous)
            p.rounds_since_ttl_pause += int(continuous)
            p.last_context = prompt_tokens
            p.last_finished_at = now
            p.last_impact_s = impact
            self.factors[target].push_request(
                _RequestSample(prompt_tokens, completion_tokens, cached_tokens, growth,
                               now - request.arrived_at, p.rounds_since_ttl_pause)
            )  # fmt: skip
        if action == "ttl":
            p.ttl_deadline = now + ttl
            self.transitions.append((now, program_id, f"ttl:{ttl:g}"))
        if p.active:
            self.delta[target] += p.private_tokens() - before
        if action == "terminate":
            self.release(program_id, now)
        self.tick(now)

    def tick(self, now: float) -> None:
        """``run_periodic_decisions``."""
        self._expire_ttls(now)
        self._release_expired_paused(now)
        self._repair_capacity(now)
        self._schedule(now)

    # ------------------------------------------------------------ transitions

    def _claim(self, p: Program, now: float) -> None:
        """``claim_dispatch``: the front request goes to the program's engine."""
        request = p.waiting.pop(0)
        assert p.placement is not None
        p.in_flight.append(request)
        p.acting = False
        request.starts_placement = p.placement_start_pending
        request.dispatched_at = now
        p.placement_start_pending = False
        self.dispatched(request, p.placement)

    def _admit(self, p: Program, target: str, now: float, forced: bool) -> None:
        """``commit_admission``, then the dispatch it wakes."""
        p.active, p.acting, p.placement = True, False, target
        p.rounds_since_activation = 0
        p.ttl_deadline = None
        if p.segment_started_at is None:
            p.segment_started_at = now
        p.paused_at = p.pause_reason = None
        p.pause_when_idle = False
        p.queued_at = p.force_deadline = None
        p.placement_start_pending = True
        self.delta[target] += p.private_tokens()
        if p.program_id in self.queues[target]:
            self.queues[target].remove(p.program_id)
        self.transitions.append((now, p.program_id, "force_resume" if forced else "admit"))
        self._claim(p, now)

    def _pause(self, p: Program, reason: str, now: float) -> bool:
        """``pause_idle``: an idle active program frees its engine's count and tokens."""
        if not p.active or p.in_flight:
            return False
        tokens = p.private_tokens()
        p.active, p.placement = False, None
        p.paused_at, p.pause_reason = now, reason
        p.rounds_since_activation = 0
        p.ttl_deadline = None
        p.pause_when_idle = False
        if p.fresh_until is not None:
            p.fresh_until = now + (p.fresh_until - p.freshness_anchor)
        p.freshness_anchor = now
        self.delta[p.home] -= tokens
        self.transitions.append((now, p.program_id, f"pause:{reason}"))
        return True

    def release(self, program_id: str, now: float) -> None:
        """``release_program``: the program's state, binding and any tokens it held go."""
        p = self.programs.get(program_id)
        if p is None or p.in_flight or p.waiting:
            return
        for queue in self.queues.values():
            if program_id in queue:
                queue.remove(program_id)
        if p.active:
            self.delta[p.home] -= p.private_tokens()
        del self.programs[program_id]
        self.transitions.append((now, program_id, "release"))

    def _expire_ttls(self, now: float) -> None:
        for p in list(self.programs.values()):
            due = p.ttl_deadline is not None and p.ttl_deadline <= now
            idle = p.active and p.acting and not p.in_flight
            if idle and due and self._pause(p, "ttl_expired", now):
                p.rounds_since_ttl_pause = 0

    def _release_expired_paused(self, now: float) -> None:
        for p in list(self.programs.values()):
            if (
                not p.active and p.acting and not p.in_flight and not p.waiting
                and p.paused_at is not None and now - p.paused_at >= PAUSED_RETENTION_TTL_S
            ):  # fmt: skip
                self.release(p.program_id, now)

    def _freshness(self, target: str) -> float:
        f = self.factors[target]
        if self.token_capacity is None or not f.request_window_complete():
            return SHARED_PREFIX_FRESHNESS_WARMUP_S
        reasoning = sum(1 for p in self._active(target) if not p.acting)
        uncached = f.mean([float(s.prompt - s.cached) for s in f.requests])
        latency = f.mean([s.e2e_s for s in f.requests])
        if reasoning == 0 or uncached <= 0 or latency <= 0:
            return SHARED_PREFIX_FRESHNESS_WARMUP_S
        turnovers = SHARED_PREFIX_FRESHNESS_KV_TURNOVERS
        return turnovers * self.token_capacity * latency / reasoning / uncached

    def _repair_capacity(self, now: float) -> None:
        """Pause idle programs (and mark running ones) while the projected logical KV is
        above the high watermark, down to the low one."""
        if self.token_capacity is None:
            return
        high = self.token_capacity * HIGH_WATERMARK_RATIO
        low = self.token_capacity * LOW_WATERMARK_RATIO
        for target in self.targets:
            f = self.factors[target]
            avg_completion = math.ceil(f.mean([float(s.completion) for s in f.requests]))
            avg_prompt = max(f.mean([float(s.prompt) for s in f.requests]), 1.0)
            reasoning = marked = 0
            future_relief = ledger = 0.0
            victims: list[tuple[float, float, str]] = []
            for p in self._active(target):
                tokens = p.private_tokens()
                ledger += tokens
                if not p.acting and p.pause_when_idle:
                    marked += 1
                    future_relief += tokens
                if (p.acting and not p.in_flight) or (
                    not p.acting and not p.pause_when_idle and p.in_flight
                ):
                    elapsed = 0.0 if p.segment_started_at is None else now - p.segment_started_at
                    size = (p.last_context or p.context_tokens) if p.acting else p.context_tokens
                    score = elapsed * max(1.0 / math.sqrt(max(size / avg_prompt, 1e-6)), 0.5)
                    victims.append((score, tokens, p.program_id))
                if not p.acting:
                    reasoning += 1
            o = self._fresh(target, now)
            usage = ledger
            if o is not None and o.tokens is not None:
                usage = max(0.0, o.tokens + self.delta[target])
            projected = max(
                0.0, usage + avg_completion * reasoning - future_relief - avg_completion * marked
            )
            if projected <= high:
                continue
            victims.sort(key=lambda v: (-v[0], -v[1], v[2]))
            for _, tokens, program_id in victims:
                if projected <= low:
                    break
                p = self.programs[program_id]
                if p.acting:
                    relieved = self._pause(p, "capacity_repair", now)
                    relief = tokens
                else:
                    p.pause_when_idle = relieved = True
                    relief = tokens + avg_completion
                if relieved:
                    projected = max(0.0, projected - relief)

    def _order_key(self, p: Program, now: float) -> tuple[Any, ...]:
        """``local_resume_cmp`` (MRU): forced first, larger priority, then the most
        recently finished (never-finished last), then the longest queued, then the ID."""
        forced = p.force_deadline is not None and p.force_deadline <= now
        finished = -p.last_finished_at if p.last_finished_at is not None else math.inf
        queued = p.queued_at if p.queued_at is not None else -math.inf
        return (not forced, -p.priority(), p.pause_reason == "max_segment_yield",
                finished, queued, p.program_id)  # fmt: skip

    def _plan(self, p: Program, target: str, now: float) -> bool | None:
        """``rank_admission_plan``: None where the program may not be admitted now, else
        whether it was forced."""
        if p.home != target or p.active or p.acting or not p.waiting:
            return None
        forced = p.force_deadline is not None and p.force_deadline <= now
        o = self._fresh(target, now)
        if (
            ADMISSION_WAITING_REQUEST_THRESHOLD > 0
            and o is not None
            and o.waiting >= ADMISSION_WAITING_REQUEST_THRESHOLD
        ):
            return None
        active = self._active(target)
        count_fits = len(active) + 1 <= MAX_ACTIVE_PROGRAMS_PER_TARGET
        if self.token_capacity is None:
            return forced if forced or count_fits else None
        used = self.usage(target, now)
        required = p.private_tokens()
        low = self.token_capacity * LOW_WATERMARK_RATIO
        rounds = self.factors[target].target_rounds()
        reserve = self.factors[target].growth_reserve(
            [max(rounds - a.rounds_since_activation, 0.0) for a in active]
        )
        if forced or (count_fits and used + required <= low and used + required + reserve <= low):
            return forced
        # Not modelled: the batch-gain bypass of the growth reserve.
        return None

    def _schedule(self, now: float) -> None:
        """``schedule_rank_local``: per engine, admit the best admissible waiter until
        none is."""
        for target in self.targets:
            while True:
                queued = [self.programs[i] for i in self.queues[target] if i in self.programs]
                queued = [p for p in queued if not p.active and not p.acting and p.waiting]
                queued.sort(key=lambda p: self._order_key(p, now))
                for p in queued:
                    forced = self._plan(p, target, now)
                    if forced is not None:
                        self._admit(p, target, now, forced)
                        break
                else:
                    break
