"""A pure, deterministic model of one continuous-batching engine replica (SGLang-like).

Theory of operation
===================

The model is a sans-IO state machine. Callers feed it requests and ask it to run
one scheduler iteration at a time; it never reads a clock, sleeps or does I/O.
Time is an argument, so the same object runs behind the HTTP server in real
time and inside a simulator in virtual time::

    engine = EngineModel(EngineParams())
    engine.submit(EngineRequest("r1", prompt_text, reply_tokens=200, max_new_tokens=256), now=0.0)
    t = 0.0
    while engine.has_work():
        step = engine.step(t)          # what the iteration did and how long it took
        t = step.end                   # = step.start + step.duration
        ...                            # deliver step.tokens, step.finished at time t
    engine.cancel("r2", now=t)         # client went away: drop it, free its KV
    engine.metrics(), engine.requests(now)   # snapshots for /metrics and /debug/state

``step(now)`` applies the iteration's effects at once; they become visible at
``now + duration``. A real-time driver therefore calls ``step``, sleeps
``duration`` and then delivers the produced tokens; a virtual-time driver just
advances its clock.

State
-----
* **KV pool** of ``kv_tokens`` token slots. A slot is *free*, holds a block of
  the prefix cache, or is *private* to an admitted request (the tail of its
  prompt that does not fill a whole cache block, plus every token it decodes).
* **Prefix cache** at block granularity: the rendered prompt text is cut into
  blocks of ``block_chars`` characters (``block_chars / 4`` tokens, see
  ``tokens.py``); block *i* is keyed by a hash chain over blocks ``0..i``, so a
  key identifies a whole prefix. Blocks have a reference count (admitted
  requests using them). Unreferenced blocks stay cached and are evicted least
  recently used, leaf first, when an allocation needs room. Referenced blocks
  are never evicted. Prompt blocks are inserted when a request is admitted;
  reply tokens are not cached (the next turn re-renders the reply as text and
  prefills it). At least one prompt token is always computed.
* **Waiting queue**: FIFO by arrival, or with ``priority_scheduling`` by
  ``priority`` (higher first unless ``low_priority_first``), ties by arrival.
* **Running set** (admitted requests), at most ``max_running``. A request is
  first *prefilling* (its uncached tokens are computed in chunks of at most
  ``chunk_tokens`` per iteration), then *decoding* one token per iteration.

Retention (a hint that a finished request's prefix will be wanted again)
------------------------------------------------------------------------
A request may carry ``retain_key`` and ``retain_s``. When it finishes, the blocks of
its prompt (the part the model caches; see above) are *kept* under the key until
``finish + retain_s``, replacing what the key kept before; ``release(key)`` ends it
early (its run ended). A block whose hold runs out rejoins the LRU as if just freed;
one released goes to its old end. Kept blocks stay in the pool and count against it like any
cached block. The hold is soft, as in the engines that have one: an unreferenced kept
block is still evictable (admission budgets it as free-able), but only once no
unkept unreferenced block is left, so running and admitted requests never wait for a
hint while kept prefixes crowd out everyone else's cached ones first. That is
SGLang's ``--enable-session-radix-cache`` order (unreferenced entries are evicted
before session-referenced ones; ``/close_session`` drops the references) and the soft
TTL class of vLLM RFC #52113; SGLang's hard pins were withdrawn because they wedge
the pool (PRs #21884, #27025; docs/benchmarks/policies.md, "What engines accept").
Expiry is checked at the start of each ``step``.

One iteration (``step``)
------------------------
SGLang runs a prefill ("extend") batch whenever it can form one and a decode
batch otherwise; it does not mix them (``--enable-mixed-chunk`` is off by
default). So ``step``:

1. **Prefill** if a chunked prefill is unfinished or a waiting request can be
   admitted. Admission follows SGLang's ``PrefillAdder`` (``schedule_policy.py``):
   the budget is ``free + evictable`` (minus the evictable blocks the candidate
   would reuse) minus, for every running request,
   ``min(max_new - generated, CLIP) * new_token_ratio`` (the estimated rest of its
   reply), minus what earlier admissions in this iteration took. A candidate
   needs ``uncached + min(max_new, CLIP) + 1`` tokens of that budget (its whole
   capped reply, not scaled by the ratio). The first candidate that does not
   fit stops admission (head-of-line, as in SGLang). ``CLIP`` is SGLang's
   ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096). A request without
   ``max_new_tokens`` gets ``context_length - prompt`` (what SGLang does), so an
   uncapped reply reserves up to ``CLIP`` tokens: the running batch shrinks.
   Requests whose prefill completes emit their first token.
2. Otherwise **decode**: every decoding request produces one token, which needs
   one free slot each. If ``free + evictable`` is short, SGLang's
   ``retract_decode`` runs: requests are retracted in order of fewest generated
   tokens, then longest prompt, until ``free + evictable >= remaining *
   RETRACT_DECODE_STEPS`` (20), leaving at least one. Retracted requests release
   their KV (prompt blocks stay cached) and go back to the waiting queue in their
   original arrival position; when re-admitted they recompute their prompt and
   the tokens they had generated. After a retraction
   ``new_token_ratio = min(1, (generated + 20 * n) / (sum max_new + 1))`` over the
   survivors; after a decode iteration without retraction the ratio decays by
   ``(init - min) / 600`` down to ``min = 0.14 * init`` (``init = 0.7``).
3. Otherwise the engine is **idle**: the ratio resets to ``init``; the step
   has duration 0 and kind ``IDLE``.

Step durations (model seconds, divided by ``time_scale``):

* prefill: ``(prefill_fixed_s + prefill_token_s * tokens) * gpu_sharers``
* decode: ``(decode_fixed_s + decode_seq_s * batch + decode_ctx_token_s *
  context_tokens) * gpu_sharers``, where ``context_tokens`` is the sum of prompt
  and generated tokens of the decoding requests (attention reads their KV).

**GPU sharing.** The default target is two replicas on one GPU. Each replica's
kernels are modelled as getting ``1 / gpu_sharers`` of the GPU: every duration
is multiplied by ``gpu_sharers`` (static time slicing). That is exact when both
replicas are busy (the saturated regime the benchmarks measure) and pessimistic
when the sibling is idle; a simulator that knows the sibling's state can pass
``step(now, sharers=1)`` for that iteration.

Simplifications kept (beyond those above): page size 1; no priority
preemption of running requests; no radix-tree ``lpm`` reordering of the queue
(SGLang's default policy is ``fcfs``); decode attention cost is linear in
context; retracted requests rejoin the queue at their arrival position.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from luftpause.fakes.engine.blocks import BlockCache, BlockPrompt, block_chain
from luftpause.fakes.engine.results import (
    EngineMetrics,
    FinishedRequest,
    FinishReason,
    Phase,
    RequestState,
    RequestTiming,
    StepKind,
    StepResult,
)
from luftpause.fakes.engine.tokens import CHARS_PER_TOKEN, count_tokens

# SGLang constants (python/sglang/srt/environ.py, schedule_policy.py).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
DECODE_LOG_INTERVAL = 40  # SGLang --decode-log-interval: decode steps between gauge updates


class SubmitError(ValueError):
    """The request can never run on this engine (too long, duplicate id, bad limits)."""


# The records below (and those of ``blocks``, ``script`` and ``tokens``) are dataclasses
# with a hand-written ``__init__`` (``init=False``), frozen ones storing each field with
# ``object.__setattr__``, as the scheduling core's records do (``scheduler/core/types.py``
# says why): the engine model is compiled with the core by mypyc (setup.py, docs/development
# "The compiled core"), where that ``__init__`` becomes direct stores and the generated one
# would stay interpreted. tests/unit/test_engine_records.py checks that every record's
# ``__init__`` takes its fields in order with their defaults, in both builds.


def sglang_max_running(kv_tokens: int, context_length: int) -> int:
    """SGLang's default request cap: ``clamp(kv / context * 512, 2048, 4096)``, at most kv/2."""
    estimated = max(min(int(kv_tokens / context_length * 512), 4096), 2048)
    return max(1, min(estimated, kv_tokens // 2))


@dataclass(frozen=True, slots=True, init=False)
class EngineParams:
    """Parameters of one replica. Defaults: Llama-3.2-1B FP8 on half of an 8 GB RTX 4060
    Laptop (two replicas share the GPU); each value's source is in docs/guides/calibration.md."""

    kv_tokens: int = 55_000  # KV pool per replica (tokens)
    context_length: int = 8192  # model context the server was started with
    max_running: int | None = None  # None: SGLang's formula (memory is the real bound)
    chunk_tokens: int = 2048  # chunked prefill size SGLang picks for GPUs < 20 GB
    block_chars: int = 32  # prefix-cache block: 32 characters = 8 tokens
    prefill_fixed_s: float = 0.010  # one forward pass reading the weights
    prefill_token_s: float = 0.000085  # per uncached prompt token
    decode_fixed_s: float = 0.009  # weights read once per decode iteration
    decode_seq_s: float = 0.00015  # per sequence in the batch (compute, sampling)
    decode_ctx_token_s: float = 0.00000021  # per context token whose KV is read
    gpu_sharers: int = 2  # replicas time-slicing one GPU
    priority_scheduling: bool = False
    low_priority_first: bool = False
    time_scale: float = 1.0  # all durations are divided by this

    def __init__(
        self,
        kv_tokens: int = 55_000,
        context_length: int = 8192,
        max_running: int | None = None,
        chunk_tokens: int = 2048,
        block_chars: int = 32,
        prefill_fixed_s: float = 0.010,
        prefill_token_s: float = 0.000085,
        decode_fixed_s: float = 0.009,
        decode_seq_s: float = 0.00015,
        decode_ctx_token_s: float = 0.00000021,
        gpu_sharers: int = 2,
        priority_scheduling: bool = False,
        low_priority_first: bool = False,
        time_scale: float = 1.0,
    ) -> None:
        object.__setattr__(self, "kv_tokens", kv_tokens)
        object.__setattr__(self, "context_length", context_length)
        object.__setattr__(self, "max_running", max_running)
        object.__setattr__(self, "chunk_tokens", chunk_tokens)
        object.__setattr__(self, "block_chars", block_chars)
        object.__setattr__(self, "prefill_fixed_s", prefill_fixed_s)
        object.__setattr__(self, "prefill_token_s", prefill_token_s)
        object.__setattr__(self, "decode_fixed_s", decode_fixed_s)
        object.__setattr__(self, "decode_seq_s", decode_seq_s)
        object.__setattr__(self, "decode_ctx_token_s", decode_ctx_token_s)
        object.__setattr__(self, "gpu_sharers", gpu_sharers)
        object.__setattr__(self, "priority_scheduling", priority_scheduling)
        object.__setattr__(self, "low_priority_first", low_priority_first)
        object.__setattr__(self, "time_scale", time_scale)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.kv_tokens < 64:
            raise ValueError("kv_tokens must be at least 64")
        if self.context_length < 16:
            raise ValueError("context_length must be at least 16")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be at least 1")
        if self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be at least 1")
        if self.block_chars < CHARS_PER_TOKEN or self.block_chars % CHARS_PER_TOKEN:
            raise ValueError(f"block_chars must be a positive multiple of {CHARS_PER_TOKEN}")
        if self.gpu_sharers < 1:
            raise ValueError("gpu_sharers must be at least 1")
        if not self.time_scale > 0:
            raise ValueError("time_scale must be positive")
        for name in (
            "prefill_fixed_s",
            "prefill_token_s",
            "decode_fixed_s",
            "decode_seq_s",
            "decode_ctx_token_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @property
    def running_cap(self) -> int:
        if self.max_running is not None:
            return self.max_running
        return sglang_max_running(self.kv_tokens, self.context_length)

    @property
    def block_tokens(self) -> int:
        return self.block_chars // CHARS_PER_TOKEN

    def scaled(self, time_scale: float) -> EngineParams:
        return replace(self, time_scale=time_scale)


@dataclass(frozen=True, slots=True, init=False)
class EngineRequest:
    """One generation request as the engine sees it."""

    request_id: str
    prompt_text: str  # the rendered prompt; its blocks key the prefix cache (unless ``prompt``)
    reply_tokens: int  # natural reply length (the script's); the engine stops earlier at the cap
    max_new_tokens: int | None = None  # None: context_length - prompt tokens (SGLang's default)
    priority: int = 0
    # Retention hint (see "Retention" in the module docstring): when the request
    # finishes, its prompt's blocks are kept for ``retain_s`` under ``retain_key``.
    retain_key: str = ""
    retain_s: float = 0.0
    # The prompt as its length and block chain (``PromptChain.prompt``) instead of text:
    # given, ``prompt_text`` is not read (the simulator's prompts, never written out).
    prompt: BlockPrompt | None = None

    def __init__(
        self,
        request_id: str,
        prompt_text: str,
        reply_tokens: int,
        max_new_tokens: int | None = None,
        priority: int = 0,
        retain_key: str = "",
        retain_s: float = 0.0,
        prompt: BlockPrompt | None = None,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "prompt_text", prompt_text)
        object.__setattr__(self, "reply_tokens", reply_tokens)
        object.__setattr__(self, "max_new_tokens", max_new_tokens)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "retain_key", retain_key)
        object.__setattr__(self, "retain_s", retain_s)
        object.__setattr__(self, "prompt", prompt)


@dataclass(slots=True, init=False, eq=False)
class _Req:
    req: EngineRequest
    seq: int
    prompt_tokens: int
    max_new: int
    target: int  # tokens it will produce before finishing
    blocks: tuple[int, ...]  # hash chain of its full prompt blocks
    enqueued_at: float
    phase: Phase = Phase.WAITING
    out: int = 0
    cached_tokens: int = 0
    locked: tuple[int, ...] = ()
    private: int = 0
    prefill_left: int = 0
    admitted_at: float = 0.0
    decode_from: float = 0.0
    queued_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def __init__(
        self,
        req: EngineRequest,
        seq: int,
        prompt_tokens: int,
        max_new: int,
        target: int,
        blocks: tuple[int, ...],
        enqueued_at: float,
        phase: Phase = Phase.WAITING,
        out: int = 0,
        cached_tokens: int = 0,
        locked: tuple[int, ...] = (),
        private: int = 0,
        prefill_left: int = 0,
        admitted_at: float = 0.0,
        decode_from: float = 0.0,
        queued_s: float = 0.0,
        prefill_s: float = 0.0,
        decode_s: float = 0.0,
    ) -> None:
        self.req = req
        self.seq = seq
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new
        self.target = target
        self.blocks = blocks
        self.enqueued_at = enqueued_at
        self.phase = phase
        self.out = out
        self.cached_tokens = cached_tokens
        self.locked = locked
        self.private = private
        self.prefill_left = prefill_left
        self.admitted_at = admitted_at
        self.decode_from = decode_from
        self.queued_s = queued_s
        self.prefill_s = prefill_s
        self.decode_s = decode_s

    def timing(self, now: float) -> RequestTiming:
        queued, prefill, decode = self.queued_s, self.prefill_s, self.decode_s
        if self.phase is Phase.WAITING:
            queued += max(0.0, now - self.enqueued_at)
        elif self.phase is Phase.PREFILL:
            prefill += max(0.0, now - self.admitted_at)
        else:
            decode += max(0.0, now - self.decode_from)
        return RequestTiming(queued, prefill, decode)


def _reason(r: _Req) -> FinishReason:
    """Why ``r``, having produced its ``target`` tokens, finishes."""
    return FinishReason.STOP if r.req.reply_tokens <= r.max_new else FinishReason.LENGTH


def resolve_max_new(p: EngineParams, prompt: int, max_new_tokens: int | None) -> int:
    """The tokens a request of ``prompt`` tokens may generate (``max_new_tokens``, or the
    rest of the context when None). Raises ``SubmitError`` if it can never run on ``p``."""
    if prompt >= p.context_length:
        raise SubmitError(
            f"The input ({prompt} tokens) is longer than the model's context length "
            f"({p.context_length} tokens)."
        )
    if max_new_tokens is None:
        max_new = p.context_length - prompt
    else:
        max_new = max_new_tokens
        if max_new < 1:
            raise SubmitError("max_tokens must be at least 1")
        if prompt + max_new > p.context_length:
            raise SubmitError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{p.context_length} tokens. You requested a total of {prompt + max_new} "
                f"tokens: {prompt} tokens from the input messages and {max_new} tokens "
                f"for the completion."
            )
    if prompt + min(max_new, CLIP_MAX_NEW_TOKENS) + 1 > p.kv_tokens:
        raise SubmitError(
            f"request needs {prompt + min(max_new, CLIP_MAX_NEW_TOKENS) + 1} KV tokens; "
            f"the pool holds {p.kv_tokens}"
        )
    return max_new


def check_request(p: EngineParams, request: EngineRequest) -> tuple[int, int]:
    """The request's prompt tokens and the most it may generate, or the ``SubmitError``
    for a request no engine of ``p`` can run (every reason ``EngineModel.submit`` has but
    a duplicate id; it asks here), without a model: a driver that steps its models
    elsewhere decides a refusal where it sends."""
    if not (math.isfinite(request.retain_s) and request.retain_s >= 0):
        raise SubmitError("a retention time must be a finite number of seconds >= 0")
    if request.retain_s > 0 and not request.retain_key:
        raise SubmitError("a retention time needs a retention key")
    given = request.prompt
    if given is not None and given.block_chars != p.block_chars:
        raise SubmitError(
            f"the prompt's blocks are {given.block_chars} characters; "
            f"this engine's are {p.block_chars}"
        )
    prompt = max(1, count_tokens(request.prompt_text) if given is None else given.tokens)
    return prompt, resolve_max_new(p, prompt, request.max_new_tokens)


class EngineModel:
    """One replica. See the module docstring for the rules."""

    def __init__(self, params: EngineParams | None = None) -> None:
        self.params = params or EngineParams()
        p = self.params
        self.cache = BlockCache(p.block_tokens)
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []  # admission order
        self._by_id: dict[str, _Req] = {}
        self._seq = 0
        self._private = 0
        self._init_ratio = INIT_NEW_TOKEN_RATIO
        self._min_ratio = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
        self._decay = (self._init_ratio - self._min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self._init_ratio
        self._queries = 0
        self._hits = 0
        self._steps = 0
        self._decode_steps = 0
        self._gauge = (0, 0)  # (running, queued) as SGLang's gauges last showed them
        self._retractions = 0
        # Retention hints: key -> (the blocks it keeps, until when), and when each runs
        # out (a heap; an entry whose key was re-kept or released meanwhile is stale).
        self._retained: dict[str, tuple[tuple[int, ...], float]] = {}
        self._expiries: list[tuple[float, str]] = []

    # ----------------------------------------------------------------- inputs

    def submit(self, request: EngineRequest, now: float) -> None:
        """Queue a request. Raises ``SubmitError`` if it can never run here."""
        p = self.params
        if request.request_id in self._by_id:
            raise SubmitError(f"duplicate request id {request.request_id!r}")
        prompt, max_new = check_request(p, request)
        given = request.prompt
        r = _Req(
            req=request,
            seq=self._seq,
            prompt_tokens=prompt,
            max_new=max_new,
            target=max(1, min(request.reply_tokens, max_new)),
            blocks=block_chain(request.prompt_text, p.block_chars)
            if given is None
            else given.blocks,
            enqueued_at=now,
        )
        self._seq += 1
        self._by_id[request.request_id] = r
        self._waiting.append(r)

    def cancel(self, request_id: str, now: float) -> bool:
        """Drop a request (client disconnect); frees its KV. False if unknown or done."""
        r = self._by_id.pop(request_id, None)
        if r is None:
            return False
        if r.phase is Phase.WAITING:
            self._waiting.remove(r)
        else:
            self._running.remove(r)
            self._release(r)
        return True

    def release(self, key: str) -> bool:
        """End the retention kept under ``key`` early (its run ended): its blocks become
        the first to be evicted. False if no retention is kept under it."""
        held = self._retained.pop(key, None)
        if held is None:
            return False
        self.cache.release(held[0], first=True)
        return True

    # ---------------------------------------------------------------- queries

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def metrics(self) -> EngineMetrics:
        p = self.params
        free = self._free()
        evictable = self.cache.evictable_tokens
        used = p.kv_tokens - free - evictable
        return EngineMetrics(
            running=len(self._running),
            waiting=len(self._waiting),
            used_tokens=used,
            max_tokens=p.kv_tokens,
            token_usage=used / p.kv_tokens,
            cached_tokens=self.cache.tokens,
            evictable_tokens=evictable,
            cache_queries_tokens=self._queries,
            cache_hit_tokens=self._hits,
            cache_hit_rate=self._hits / self._queries if self._queries else 0.0,
            new_token_ratio=self.new_token_ratio,
            steps=self._steps,
            retractions=self._retractions,
            running_gauge=self._gauge[0],
            queue_gauge=self._gauge[1],
            retained_tokens=self.cache.kept_tokens,
            retentions=len(self._retained),
            retention_evicted_tokens=self.cache.kept_evicted * self.cache.block_tokens,
        )

    def requests(self, now: float) -> list[RequestState]:
        """Every queued or admitted request, running first (admission order), then waiting."""
        out: list[RequestState] = []
        for r in [*self._running, *self._ordered_waiting()]:
            out.append(
                RequestState(
                    request_id=r.req.request_id,
                    phase=r.phase,
                    priority=r.req.priority,
                    prompt_tokens=r.prompt_tokens,
                    cached_tokens=r.cached_tokens,
                    completion_tokens=r.out,
                    max_new_tokens=r.max_new,
                    timing=r.timing(now),
                )
            )
        return out

    def prompt_tokens(self, request_id: str) -> int | None:
        r = self._by_id.get(request_id)
        return None if r is None else r.prompt_tokens

    # ------------------------------------------------------------------- step

    def step(self, now: float, sharers: int | None = None) -> StepResult:
        """Run one scheduler iteration starting at ``now``."""
        p = self.params
        factor = (p.gpu_sharers if sharers is None else max(1, sharers)) / p.time_scale
        if self._expiries and self._expiries[0][0] <= now:
            self._expire(now)
        prefill = self._try_prefill(now, factor)
        if prefill is not None:
            self._steps += 1
            self._gauges()  # SGLang log_prefill_stats: after the batch is formed
            return prefill
        if any(r.phase is Phase.DECODE for r in self._running):
            self._steps += 1
            self._decode_steps += 1
            if self._decode_steps % DECODE_LOG_INTERVAL == 0:
                self._gauges()  # SGLang log_decode_stats
            return self._decode(now, factor)
        self.new_token_ratio = self._init_ratio
        self._gauges()  # idle: SGLang refreshes its gauges when it has nothing to run
        return StepResult(StepKind.IDLE, now, 0.0)

    def _gauges(self) -> None:
        self._gauge = (len(self._running), len(self._waiting))

    # --------------------------------------------------------------- internal

    def _free(self) -> int:
        return self.params.kv_tokens - self.cache.tokens - self._private

    def _retain(self, key: str, chain: tuple[int, ...], until: float) -> None:
        """Keep ``chain``'s cached blocks under ``key`` until ``until``, in place of what
        ``key`` kept before (a run's next turn extends its last one's prompt)."""
        held = self.cache.retain(chain)
        old = self._retained.get(key)
        self._retained[key] = (held, until)
        if old is not None:
            self.cache.release(old[0])
        heapq.heappush(self._expiries, (until, key))

    def _expire(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            until, key = heapq.heappop(self._expiries)
            held = self._retained.get(key)
            if held is not None and held[1] == until:
                del self._retained[key]
                self.cache.release(held[0])

    def _ordered_waiting(self) -> list[_Req]:
        p = self.params
        if not p.priority_scheduling:
            return sorted(self._waiting, key=lambda r: r.seq)
        sign = 1 if p.low_priority_first else -1
        return sorted(self._waiting, key=lambda r: (sign * r.req.priority, r.seq))

    def _allocate(self, n: int) -> None:
        short = n - self._free()
        if short > 0:
            bt = self.cache.block_tokens
            self.cache.evict(-(-short // bt))
        if self._free() < n:  # pragma: no cover - admission and retraction prevent this
            raise AssertionError("KV pool over-committed")

    def _release(self, r: _Req) -> None:
        self.cache.unlock(r.locked)
        self._private -= r.private
        r.locked = ()
        r.private = 0

    def _try_prefill(self, now: float, factor: float) -> StepResult | None:
        p = self.params
        bt = self.cache.block_tokens
        budget = p.chunk_tokens
        computed: list[tuple[_Req, int]] = []
        # A chunked prefill continues before anything new is admitted.
        for r in self._running:
            if budget <= 0:
                break
            if r.phase is Phase.PREFILL and r.prefill_left > 0:
                take = min(r.prefill_left, budget)
                computed.append((r, take))
                budget -= take
        admitted: list[_Req] = []
        if (
            budget > 0
            and self._waiting
            and not any(r.phase is Phase.PREFILL and r.prefill_left > 0 for r in self._running)
        ):
            reserved = sum(
                min(r.max_new - r.out, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio
                for r in self._running
            )
            charged = 0.0
            for r in self._ordered_waiting():
                if len(self._running) >= p.running_cap or budget <= 0:
                    break
                max_match = (r.prompt_tokens - 1) // bt
                m = self.cache.match(r.blocks[: min(max_match, len(r.blocks))])
                matched = r.blocks[:m]
                cached = m * bt
                extend = r.prompt_tokens - cached + r.out
                room = (
                    self._free()
                    + self.cache.evictable_tokens
                    - self.cache.evictable_among(matched)
                    - reserved
                    - charged
                )
                reply_room = min(r.max_new - r.out, CLIP_MAX_NEW_TOKENS) + 1
                if extend + reply_room > room:
                    break
                # The prompt's slots are taken from ``free`` by the allocation below;
                # the reply's are only promised, so they are charged here.
                charged += reply_room
                self._admit(r, matched, now)
                admitted.append(r)
                take = min(extend, budget)
                computed.append((r, take))
                budget -= take
                if take < extend:  # chunked: one chunked request at a time
                    break
        if not computed:
            return None
        tokens: list[str] = []
        finished: list[FinishedRequest] = []
        total = 0
        for r, take in computed:
            r.prefill_left -= take
            total += take
        duration = (p.prefill_fixed_s + p.prefill_token_s * total) * factor
        end = now + duration
        for r, _ in computed:
            if r.prefill_left == 0:
                r.prefill_s += end - r.admitted_at
                r.phase = Phase.DECODE
                r.decode_from = end
                self._produce(r, end, tokens, finished)
        return StepResult(
            StepKind.PREFILL,
            now,
            duration,
            admitted=tuple(r.req.request_id for r in admitted),
            tokens=tuple(tokens),
            finished=tuple(finished),
            prefill_tokens=total,
        )

    def _admit(self, r: _Req, matched: tuple[int, ...], now: float) -> None:
        bt = self.cache.block_tokens
        self._waiting.remove(r)
        self.cache.lock(matched)
        self._queries += r.prompt_tokens
        self._hits += len(matched) * bt
        r.cached_tokens = len(matched) * bt
        fresh = r.blocks[len(matched) :]
        private = r.prompt_tokens - len(r.blocks) * bt + r.out
        # Blocks admitted in this same iteration by a request with the same prefix
        # are shared rather than duplicated.
        self._allocate(self.cache.uncached(fresh) * bt + private)
        self.cache.lock(fresh, insert=True)
        r.locked = r.blocks
        r.private = private
        self._private += private
        r.prefill_left = r.prompt_tokens - r.cached_tokens + r.out
        r.phase = Phase.PREFILL
        r.queued_s += max(0.0, now - r.enqueued_at)
        r.admitted_at = now
        self._running.append(r)

    def _produce(
        self, r: _Req, end: float, tokens: list[str], finished: list[FinishedRequest]
    ) -> None:
        r.out += 1
        tokens.append(r.req.request_id)
        if r.out >= r.target:
            finished.append(self._finish(r, end, _reason(r)))

    def _finish(self, r: _Req, end: float, reason: FinishReason) -> FinishedRequest:
        r.decode_s += max(0.0, end - r.decode_from)
        self._running.remove(r)
        if r.req.retain_s > 0:
            self._retain(r.req.retain_key, r.blocks, end + r.req.retain_s)
        self._release(r)
        del self._by_id[r.req.request_id]
        return FinishedRequest(
            request_id=r.req.request_id,
            reason=reason,
            prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens,
            completion_tokens=r.out,
            timing=RequestTiming(r.queued_s, r.prefill_s, r.decode_s),
        )

    def _decode(self, now: float, factor: float) -> StepResult:
        p = self.params
        decoding = [r for r in self._running if r.phase is Phase.DECODE]
        retracted: list[str] = []
        if self._free() + self.cache.evictable_tokens < len(decoding):
            order = sorted(decoding, key=lambda r: (r.out, -r.prompt_tokens), reverse=True)
            while len(order) > 1 and (
                self._free() + self.cache.evictable_tokens < len(order) * RETRACT_DECODE_STEPS
            ):
                victim = order.pop()
                self._retract(victim, now)
                retracted.append(victim.req.request_id)
            decoding = [r for r in self._running if r.phase is Phase.DECODE]
            generated = sum(r.out for r in decoding)
            budget = sum(r.max_new for r in decoding)
            self.new_token_ratio = min(
                1.0, (generated + RETRACT_DECODE_STEPS * len(decoding)) / (budget + 1)
            )
            self._retractions += len(retracted)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self._decay, self._min_ratio)
        finished: list[FinishedRequest] = []
        if self._free() + self.cache.evictable_tokens < len(decoding):
            # A lone request whose uncapped reply outgrew the pool: SGLang aborts it
            # as out of memory; here it ends with finish reason "length".
            for r in decoding:
                finished.append(self._finish(r, now, FinishReason.LENGTH))
            decoding = []
        context = sum(r.prompt_tokens + r.out for r in decoding)
        duration = (
            p.decode_fixed_s + p.decode_seq_s * len(decoding) + p.decode_ctx_token_s * context
        ) * factor
        end = now + duration
        self._allocate(len(decoding))
        self._private += len(decoding)
        # Each decoding request produces one token (``_produce``, inlined: every token of
        # every reply passes here).
        tokens = [r.req.request_id for r in decoding]
        for r in decoding:
            r.private += 1
            r.out += 1
            if r.out >= r.target:
                finished.append(self._finish(r, end, _reason(r)))
        return StepResult(
            StepKind.DECODE,
            now,
            duration,
            tokens=tuple(tokens),
            finished=tuple(finished),
            retracted=tuple(retracted),
        )

    def _retract(self, r: _Req, now: float) -> None:
        self._running.remove(r)
        self._release(r)
        r.decode_s += max(0.0, now - r.decode_from)
        r.phase = Phase.WAITING
        r.enqueued_at = now
        r.prefill_left = 0
        self._waiting.append(r)
