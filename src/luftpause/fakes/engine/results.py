"""What the engine model reports (``model.EngineModel``): each iteration's result, each
finished request, the gauges a probe reads, a request's state and where its time went,
and the names they use (step kinds, finish reasons, a request's phase). The model's rules
are in ``model.py``; its prefix cache in ``blocks.py``. Pure, like them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StepKind(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    IDLE = "idle"


class FinishReason(StrEnum):
    STOP = "stop"  # the reply reached its natural end
    LENGTH = "length"  # max_new_tokens (or the context length) cut it


class Phase(StrEnum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True, init=False)
class RequestTiming:
    """Where a request's time went (seconds, already divided by time_scale)."""

    queued_s: float  # waiting for admission (including after retractions)
    prefill_s: float  # admitted until its prefill finished
    decode_s: float  # first token until the last

    def __init__(self, queued_s: float, prefill_s: float, decode_s: float) -> None:
        object.__setattr__(self, "queued_s", queued_s)
        object.__setattr__(self, "prefill_s", prefill_s)
        object.__setattr__(self, "decode_s", decode_s)


@dataclass(frozen=True, slots=True, init=False)
class FinishedRequest:
    request_id: str
    reason: FinishReason
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache at (last) admission
    completion_tokens: int
    timing: RequestTiming

    def __init__(
        self,
        request_id: str,
        reason: FinishReason,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        timing: RequestTiming,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "cached_tokens", cached_tokens)
        object.__setattr__(self, "completion_tokens", completion_tokens)
        object.__setattr__(self, "timing", timing)


@dataclass(frozen=True, slots=True, init=False)
class StepResult:
    """What one scheduler iteration did. Effects are visible at ``end``."""

    kind: StepKind
    start: float
    duration: float
    admitted: tuple[str, ...] = ()  # requests that entered the running set
    tokens: tuple[str, ...] = ()  # one entry per token produced (request id)
    finished: tuple[FinishedRequest, ...] = ()
    retracted: tuple[str, ...] = ()  # requests sent back to the waiting queue
    prefill_tokens: int = 0  # tokens computed by a prefill iteration

    def __init__(
        self,
        kind: StepKind,
        start: float,
        duration: float,
        admitted: tuple[str, ...] = (),
        tokens: tuple[str, ...] = (),
        finished: tuple[FinishedRequest, ...] = (),
        retracted: tuple[str, ...] = (),
        prefill_tokens: int = 0,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "duration", duration)
        object.__setattr__(self, "admitted", admitted)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "finished", finished)
        object.__setattr__(self, "retracted", retracted)
        object.__setattr__(self, "prefill_tokens", prefill_tokens)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(slots=True, init=False)
class StepTally:
    """What an engine's busy steps added up to, counted one way for the fake engine's
    ``/debug/state`` and for the simulator's replicas."""

    steps: int = 0
    busy_s: float = 0.0
    prefill_s: float = 0.0  # of busy_s, in prefill steps (the rest decodes)
    decode_steps: int = 0
    decode_seqs: int = 0  # summed batch size over decode steps

    def __init__(
        self,
        steps: int = 0,
        busy_s: float = 0.0,
        prefill_s: float = 0.0,
        decode_steps: int = 0,
        decode_seqs: int = 0,
    ) -> None:
        self.steps = steps
        self.busy_s = busy_s
        self.prefill_s = prefill_s
        self.decode_steps = decode_steps
        self.decode_seqs = decode_seqs

    def add(self, step: StepResult) -> None:
        self.steps += 1
        self.busy_s += step.duration
        if step.kind is StepKind.PREFILL:
            self.prefill_s += step.duration
        elif step.kind is StepKind.DECODE:
            self.decode_steps += 1
            self.decode_seqs += len(step.tokens)


@dataclass(frozen=True, slots=True, init=False)
class EngineMetrics:
    running: int
    waiting: int
    used_tokens: int  # KV slots not free and not evictable (SGLang num_used_tokens)
    max_tokens: int
    token_usage: float  # used_tokens / max_tokens (SGLang token_usage)
    cached_tokens: int  # tokens held by prefix-cache blocks (referenced or not)
    evictable_tokens: int
    cache_queries_tokens: int  # prompt tokens looked up in the cache (cumulative)
    cache_hit_tokens: int  # of which found (cumulative)
    cache_hit_rate: float  # hits / queries, cumulative
    new_token_ratio: float
    steps: int
    retractions: int
    # What SGLang's gauges show: the counts as of the last scheduling decision (a
    # prefill batch formed, every DECODE_LOG_INTERVAL decode steps, or idle), so a
    # request that arrived mid-step and will be admitted next step is not "queued".
    running_gauge: int = 0
    queue_gauge: int = 0
    # Retention: tokens of cached blocks a live hint keeps (referenced or not), the live
    # hints, and the kept blocks' tokens evicted before their hint ran out (cumulative).
    retained_tokens: int = 0
    retentions: int = 0
    retention_evicted_tokens: int = 0

    def __init__(
        self,
        running: int,
        waiting: int,
        used_tokens: int,
        max_tokens: int,
        token_usage: float,
        cached_tokens: int,
        evictable_tokens: int,
        cache_queries_tokens: int,
        cache_hit_tokens: int,
        cache_hit_rate: float,
        new_token_ratio: float,
        steps: int,
        retractions: int,
        running_gauge: int = 0,
        queue_gauge: int = 0,
        retained_tokens: int = 0,
        retentions: int = 0,
        retention_evicted_tokens: int = 0,
    ) -> None:
        object.__setattr__(self, "running", running)
        object.__setattr__(self, "waiting", waiting)
        object.__setattr__(self, "used_tokens", used_tokens)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "token_usage", token_usage)
        object.__setattr__(self, "cached_tokens", cached_tokens)
        object.__setattr__(self, "evictable_tokens", evictable_tokens)
        object.__setattr__(self, "cache_queries_tokens", cache_queries_tokens)
        object.__setattr__(self, "cache_hit_tokens", cache_hit_tokens)
        object.__setattr__(self, "cache_hit_rate", cache_hit_rate)
        object.__setattr__(self, "new_token_ratio", new_token_ratio)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "retractions", retractions)
        object.__setattr__(self, "running_gauge", running_gauge)
        object.__setattr__(self, "queue_gauge", queue_gauge)
        object.__setattr__(self, "retained_tokens", retained_tokens)
        object.__setattr__(self, "retentions", retentions)
        object.__setattr__(self, "retention_evicted_tokens", retention_evicted_tokens)


@dataclass(frozen=True, slots=True, init=False)
class RequestState:
    """A request's state for /debug/state."""

    request_id: str
    phase: Phase
    priority: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    max_new_tokens: int
    timing: RequestTiming

    def __init__(
        self,
        request_id: str,
        phase: Phase,
        priority: int,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        max_new_tokens: int,
        timing: RequestTiming,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "cached_tokens", cached_tokens)
        object.__setattr__(self, "completion_tokens", completion_tokens)
        object.__setattr__(self, "max_new_tokens", max_new_tokens)
        object.__setattr__(self, "timing", timing)
