"""Unit tests of the fake engine model's retention hints (B8, H1): a finished request's
prompt blocks kept under a key until their time runs out or the key is released; kept
blocks are evicted only after every unkept one, never in the way of running requests.
No sockets, no clocks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.fakes.engine.blocks import block_chain
from luftpause.fakes.engine.model import EngineModel, EngineParams, EngineRequest, SubmitError
from luftpause.fakes.engine.results import Phase, StepResult

SMALL = EngineParams(
    kv_tokens=700, context_length=512, chunk_tokens=4096, block_chars=32, max_running=8
)


def text(tag: str, chars: int) -> str:
    unit = f"<{tag}>"
    return (unit * (chars // len(unit) + 1))[:chars]


def run(engine: EngineModel, now: float) -> tuple[float, list[StepResult]]:
    steps: list[StepResult] = []
    for _ in range(100_000):
        if not engine.has_work():
            return now, steps
        step = engine.step(now)
        steps.append(step)
        now = step.end
    raise AssertionError("engine did not drain")


def three_finished(keep: str, retain_s: float = 100.0) -> tuple[EngineModel, float, dict]:
    """Requests a, b, c (160 tokens each) finish one after the other; ``keep`` of them is
    kept under key "run-" + its tag. Returns the engine, the time, and the chains."""
    engine = EngineModel(SMALL)
    t = 0.0
    for tag in "abc":
        key, secs = (f"run-{tag}", retain_s) if tag in keep else ("", 0.0)
        engine.submit(
            EngineRequest(
                tag, text(tag, 640), reply_tokens=1, max_new_tokens=4, retain_key=key, retain_s=secs
            ),
            t,
        )
        t, _ = run(engine, t)
    chains = {tag: block_chain(text(tag, 640), 32) for tag in "abc"}
    return engine, t, chains


def cached(engine: EngineModel, chains: dict) -> list[int]:
    return [engine.cache.match(chains[tag]) for tag in "abc"]


def test_kept_blocks_are_evicted_after_every_unkept_block() -> None:
    """B8: "a" is the least recently used, but kept: a request needing 80 tokens more
    than are free takes them from "b", the oldest unkept prefix."""
    engine, t, chains = three_finished(keep="a")
    m = engine.metrics()
    assert (m.retentions, m.retained_tokens) == (1, 160)
    assert m.evictable_tokens == 480  # kept blocks are still evictable: admission counts them
    engine.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t)
    step = engine.step(t)
    assert step.admitted == ("d",)
    assert cached(engine, chains) == [20, 10, 20]
    # Without the hint the same request takes them from "a" (plain LRU).
    plain, t2, _ = three_finished(keep="")
    plain.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t2)
    plain.step(t2)
    assert cached(plain, chains) == [10, 20, 20]


def test_the_hold_is_soft_running_requests_take_kept_blocks_last() -> None:
    """B8: when only kept blocks are left, a request is still admitted and evicts them
    (no hint makes a request wait), and the loss is counted."""
    engine, t, chains = three_finished(keep="abc")
    engine.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t)
    step = engine.step(t)
    assert step.admitted == ("d",)
    # The least recently used kept prefix ("a") loses its leaf blocks first.
    assert cached(engine, chains) == [10, 20, 20]
    assert engine.metrics().retention_evicted_tokens == 80
    run(engine, step.end)


def test_a_hold_ends_when_its_time_runs_out() -> None:
    """B8: once a hint's time has passed its blocks rejoin the LRU as if just freed
    (kept no longer: the next eviction past "b" and "c" reaches them)."""
    engine, t, chains = three_finished(keep="a", retain_s=5.0)
    engine.step(t + 4.0)
    assert engine.metrics().retentions == 1
    engine.step(t + 6.0)
    m = engine.metrics()
    assert (m.retentions, m.retained_tokens) == (0, 0)
    order = engine.cache.lru_order()
    assert order[-20:] == list(reversed(chains["a"]))  # the newest, leaf older than root
    assert order[:20] == list(reversed(chains["b"]))
    engine.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t + 6)
    engine.step(t + 6.0)
    assert cached(engine, chains) == [20, 10, 20]
    assert engine.metrics().retention_evicted_tokens == 0


def test_release_ends_a_hold_early_and_only_its_own() -> None:
    """B8: a release (the run ended) frees the key's blocks to be evicted first; an
    unknown key is no error, and other keys stay kept."""
    engine, t, chains = three_finished(keep="ab")
    assert engine.release("run-b")
    assert not engine.release("run-b")
    assert not engine.release("nobody")
    assert engine.metrics().retentions == 1
    engine.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t)
    engine.step(t)
    assert cached(engine, chains) == [20, 10, 20]


def test_a_key_keeps_only_its_latest_prompt() -> None:
    """B8: a run's next turn replaces what its key kept; blocks both share stay kept."""
    engine = EngineModel(SMALL)
    first = text("a", 320)
    second = first + text("b", 320)  # the next turn extends the first
    other = text("x", 320)
    t = 0.0
    for rid, prompt in (("1", first), ("2", second), ("3", other)):
        engine.submit(
            EngineRequest(
                rid, prompt, reply_tokens=1, max_new_tokens=4, retain_key="k", retain_s=50
            ),
            t,
        )
        t, _ = run(engine, t)
        if rid == "2":
            assert engine.metrics().retained_tokens == 160
    m = engine.metrics()
    assert (m.retentions, m.retained_tokens) == (1, 80)  # only "x" now


def test_a_request_cut_off_or_unhinted_keeps_nothing() -> None:
    """B8: only a request that finishes with a hint keeps its blocks."""
    engine = EngineModel(SMALL)
    engine.submit(
        EngineRequest(
            "a", text("a", 640), reply_tokens=30, max_new_tokens=40, retain_key="k", retain_s=9
        ),
        0.0,
    )
    step = engine.step(0.0)
    assert engine.requests(step.end)[0].phase is Phase.DECODE
    assert engine.cancel("a", step.end)
    assert engine.metrics().retentions == 0
    assert engine.cache.kept_tokens == 0


@pytest.mark.parametrize(
    ("key", "secs", "why"),
    [
        ("k", -1.0, "finite number"),
        ("k", math.nan, "finite number"),
        ("k", math.inf, "finite number"),
        ("", 3.0, "needs a retention key"),
    ],
)
def test_submit_refuses_bad_hints(key: str, secs: float, why: str) -> None:
    """B8: a hint the engine cannot honour is refused with a reason."""
    engine = EngineModel(SMALL)
    with pytest.raises(SubmitError, match=why):
        engine.submit(EngineRequest("a", "hi", reply_tokens=1, retain_key=key, retain_s=secs), 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "step", "step", "release", "wait"]),
            st.integers(0, 5),
            st.integers(1, 1200),
            st.integers(0, 30),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_pool_sound_and_drains_under_any_hints(ops: list[tuple[str, int, int, int]]) -> None:
    """B8, H1: whatever is kept, released or runs out, the pool is never over-committed,
    kept blocks are cached blocks, every request finishes, and once every hint has run
    out nothing is kept."""
    params = replace(SMALL, kv_tokens=1500, context_length=700, chunk_tokens=256, max_running=4)
    engine = EngineModel(params)
    t = 0.0
    submitted: set[str] = set()
    done: set[str] = set()
    for n, (op, tag, chars, secs) in enumerate(ops):
        if op == "submit":
            try:
                engine.submit(
                    EngineRequest(
                        f"r{n}",
                        text(f"t{tag}", chars),
                        reply_tokens=secs + 1,
                        max_new_tokens=40,
                        retain_key=f"k{tag % 3}" if secs else "",
                        retain_s=float(secs),
                    ),
                    t,
                )
            except SubmitError:
                continue
            submitted.add(f"r{n}")
        elif op == "release":
            engine.release(f"k{tag % 3}")
        elif op == "wait":
            t += secs
        else:
            step = engine.step(t)
            done.update(f.request_id for f in step.finished)
            t = step.end
        m = engine.metrics()
        assert 0 <= m.used_tokens <= params.kv_tokens
        assert m.used_tokens + m.evictable_tokens <= params.kv_tokens
        assert m.retained_tokens <= m.cached_tokens
    t, steps = run(engine, t)
    done.update(f.request_id for s in steps for f in s.finished)
    assert done == submitted
    engine.step(t + 31.0)
    m = engine.metrics()
    assert (m.used_tokens, m.retentions, m.retained_tokens) == (0, 0, 0)
