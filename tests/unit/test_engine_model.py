"""Unit tests of the fake engine's pure parts (H1): the engine model in virtual time,
token counting and the reply script. No sockets, no clocks."""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from luftpause.fakes.engine import script, tokens
from luftpause.fakes.engine.blocks import block_chain
from luftpause.fakes.engine.model import (
    CLIP_MAX_NEW_TOKENS,
    DECODE_LOG_INTERVAL,
    INIT_NEW_TOKEN_RATIO,
    EngineModel,
    EngineParams,
    EngineRequest,
    SubmitError,
    sglang_max_running,
)
from luftpause.fakes.engine.results import FinishReason, Phase, StepKind, StepResult
from luftpause.fakes.engine.script import (
    ANSWER_MAX_TOKENS,
    RUNAWAY_TOKENS,
    ReplyKind,
    ScriptOptions,
    answer_length,
    answer_median,
    classify,
    directed_tools,
    extract_labels,
    fill_schema,
    label_distribution,
    normal_cdf,
    normal_quantile,
    plan_reply,
)
from luftpause.fakes.engine.tokens import count_tokens, filler_tokens, render_messages

SMALL = EngineParams(kv_tokens=2000, context_length=1024, chunk_tokens=4096, block_chars=32)


def text(tag: str, chars: int) -> str:
    """Distinct prompt text of exactly ``chars`` characters (each tag gives new blocks)."""
    unit = f"<{tag}>"
    return (unit * (chars // len(unit) + 1))[:chars]


def run(
    engine: EngineModel, now: float = 0.0, limit: int = 100_000
) -> tuple[float, list[StepResult]]:
    """Step until idle; returns the end time and every step."""
    steps: list[StepResult] = []
    for _ in range(limit):
        if not engine.has_work():
            return now, steps
        step = engine.step(now)
        steps.append(step)
        now = step.end
    raise AssertionError("engine did not drain")


def finished(steps: list[StepResult]) -> dict[str, FinishReason]:
    return {f.request_id: f.reason for s in steps for f in s.finished}


# ----------------------------------------------------------------- tokens


def test_token_count_is_ceil_chars_over_four() -> None:
    """H1: deterministic token count ceil(chars / 4)."""
    assert count_tokens("") == 0
    assert count_tokens("abc") == 1
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2
    pieces = filler_tokens(37, "seed")
    assert len(pieces) == 37
    assert count_tokens("".join(pieces)) == 37
    assert pieces == filler_tokens(37, "seed")


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 300), seed=st.text(max_size=20))
def test_filler_text_is_the_filler_tokens_text(n: int, seed: str) -> None:
    """H1: ``filler_text`` (tool arguments' words) is the text of ``filler_tokens``."""
    assert tokens.filler_text(n * 4, seed) == "".join(filler_tokens(n, seed))


def test_filler_words_are_not_programs() -> None:
    """B9: a harness runs a fake tool call's filler arguments as a shell command (Codex's
    ``exec_command``); no filler word may be a program on this machine, so every such
    command ends at once instead of running until stopped (``watch`` did, and hung a run).
    """
    words = set(" ".join(tokens._WORDS).split())
    assert len(words) > 20
    programs = sorted(w for w in words if shutil.which(w))
    assert programs == []


def test_rendered_conversation_extends_previous_prompt() -> None:
    """H1: each turn's prompt extends the previous one, so the prefix cache can hit."""
    first = [{"role": "user", "content": "hello"}]
    second = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    a = render_messages(first)
    b = render_messages(second)
    assert b.startswith(a.removesuffix("<|start_header_id|>assistant<|end_header_id|>\n\n"))


def test_an_image_counts_its_image_tokens_whatever_its_size() -> None:
    """H1: an image_url part stands in the prompt as IMAGE_TOKENS tokens naming its URL:
    a large data URL costs what a small one does, two images differ, the same image
    renders the same (so a conversation's prefix still extends)."""

    def prompt(*urls: str) -> str:
        parts = [{"type": "text", "text": "look"}]
        parts += [{"type": "image_url", "image_url": {"url": u, "detail": "low"}} for u in urls]
        return render_messages([{"role": "user", "content": parts}])

    text_only = count_tokens(prompt())
    small = prompt("data:image/png;base64,AAAA")
    large = prompt("data:image/png;base64," + "A" * 400_000)
    assert count_tokens(small) - text_only == tokens.IMAGE_TOKENS
    assert count_tokens(large) == count_tokens(small)
    assert small != large
    assert small == prompt("data:image/png;base64,AAAA")
    assert count_tokens(prompt("https://a.test/1.png", "https://a.test/2.png")) - text_only == (
        2 * tokens.IMAGE_TOKENS
    )


# ------------------------------------------------------------ prefix cache


def test_cache_hits_and_misses_are_counted_per_token() -> None:
    """H1: cached prompt tokens skip prefill; hits and queries are accounted in tokens."""
    engine = EngineModel(SMALL)
    prompt = text("a", 640)  # 20 blocks of 8 tokens = 160 tokens
    engine.submit(EngineRequest("r1", prompt, reply_tokens=5, max_new_tokens=16), 0.0)
    t, steps = run(engine)
    first = steps[0]
    assert first.kind is StepKind.PREFILL
    assert first.prefill_tokens == 160
    m = engine.metrics()
    assert (m.cache_queries_tokens, m.cache_hit_tokens) == (160, 0)
    assert m.cached_tokens == 160 and m.evictable_tokens == 160 and m.used_tokens == 0

    engine.submit(EngineRequest("r2", prompt + text("b", 64), reply_tokens=5, max_new_tokens=16), t)
    _, steps2 = run(engine, t)
    done = [f for s in steps2 for f in s.finished]
    assert done[0].cached_tokens == 160
    assert steps2[0].prefill_tokens == 16  # only the 64 new characters
    m = engine.metrics()
    assert (m.cache_queries_tokens, m.cache_hit_tokens) == (336, 160)
    assert m.cache_hit_rate == pytest.approx(160 / 336)


def test_full_prompt_match_still_computes_one_token() -> None:
    """H1: a prompt that is entirely cached still prefills at least one token."""
    engine = EngineModel(SMALL)
    prompt = text("a", 320)
    engine.submit(EngineRequest("r1", prompt, reply_tokens=2, max_new_tokens=8), 0.0)
    t, _ = run(engine)
    engine.submit(EngineRequest("r2", prompt, reply_tokens=2, max_new_tokens=8), t)
    _, steps = run(engine, t)
    assert steps[0].prefill_tokens >= 1
    assert [f.cached_tokens for s in steps for f in s.finished] == [72]


def test_lru_eviction_order_and_running_blocks_are_kept() -> None:
    """H1: unreferenced blocks are evicted least recently used first; blocks of a
    running request are never evicted."""
    params = replace(SMALL, kv_tokens=700, context_length=512)
    engine = EngineModel(params)
    t = 0.0
    for tag in ("a", "b", "c"):  # 160 tokens each, finished one after the other
        engine.submit(EngineRequest(tag, text(tag, 640), reply_tokens=1, max_new_tokens=4), t)
        t, _ = run(engine, t)
    chains = {tag: block_chain(text(tag, 640), 32) for tag in "abc"}
    assert all(engine.cache.match(chains[tag]) == 20 for tag in "abc")
    # Touch "a" again: it becomes the most recently used.
    engine.submit(EngineRequest("a2", text("a", 640) + "zz", reply_tokens=1, max_new_tokens=4), t)
    t, _ = run(engine, t)
    # A new 300-token request needs 80 more tokens than are free: "b" (least recently
    # used) loses 10 blocks from its end; "c" and "a" are untouched.
    engine.submit(EngineRequest("d", text("d", 1200), reply_tokens=50, max_new_tokens=60), t)
    step = engine.step(t)
    assert step.admitted == ("d",)
    assert [engine.cache.match(chains[tag]) for tag in "abc"] == [20, 10, 20]
    # While "d" runs, a 200-token request evicts the rest of "b", then "c", never d's blocks.
    engine.submit(EngineRequest("e", text("e", 800), reply_tokens=5, max_new_tokens=10), step.end)
    step = engine.step(step.end)
    assert step.admitted == ("e",)
    assert engine.cache.match(block_chain(text("d", 1200), 32)) == 37
    assert [engine.cache.match(chains[tag]) for tag in "abc"] == [20, 0, 5]
    # Nothing evictable is left for a third large request: it waits.
    engine.submit(EngineRequest("f", text("f", 1200), reply_tokens=5, max_new_tokens=60), step.end)
    step = engine.step(step.end)
    states = {s.request_id: s.phase for s in engine.requests(step.end)}
    assert states == {"d": Phase.DECODE, "e": Phase.DECODE, "f": Phase.WAITING}
    run(engine, step.end)


def test_block_chain_keys_stand_for_whole_prefixes() -> None:
    """H1: a prompt that extends another shares its keys block for block; a change in
    one block changes that key and every later one; a partial last block has no key."""
    base = text("a", 320)  # 10 blocks of 32 characters
    chain = block_chain(base, 32)
    assert len(chain) == 10 and len(set(chain)) == 10
    assert block_chain(base + "x" * 40, 32)[:10] == chain
    assert len(block_chain(base + "x" * 40, 32)) == 11
    changed = block_chain(base[:100] + "#" + base[101:], 32)
    assert changed[:3] == chain[:3]
    assert all(a != b for a, b in zip(changed[3:], chain[3:], strict=True))
    assert block_chain(base[:31], 32) == ()


def test_lru_evicts_leaf_blocks_before_their_prefix() -> None:
    """H1: a released chain is evicted from its end, keeping the shared prefix longest."""
    engine = EngineModel(SMALL)
    prompt = text("a", 96)  # 3 blocks
    engine.submit(EngineRequest("r", prompt, reply_tokens=1, max_new_tokens=4), 0.0)
    run(engine)
    chain = block_chain(prompt, 32)
    assert engine.cache.lru_order() == list(reversed(chain))


# ------------------------------------------------------------ reservation


def admitted_in_first_step(max_new: int | None) -> int:
    params = replace(SMALL, kv_tokens=6000, context_length=1024, chunk_tokens=100_000)
    engine = EngineModel(params)
    for i in range(20):
        engine.submit(
            EngineRequest(f"r{i}", text(f"p{i}", 800), reply_tokens=100, max_new_tokens=max_new),
            0.0,
        )
    return len(engine.step(0.0).admitted)


def test_uncapped_replies_shrink_the_running_batch() -> None:
    """H1: admission reserves each reply's max_new_tokens (SGLang PrefillAdder), so
    without a reply cap (engine default = context - prompt) far fewer requests run."""
    capped = admitted_in_first_step(64)
    uncapped = admitted_in_first_step(None)
    assert capped == 20
    assert uncapped < capped / 2
    # The exact rule: each admission needs prompt + min(max_new, CLIP) + 1 tokens of room.
    need = 200 + min(1024 - 200, CLIP_MAX_NEW_TOKENS) + 1
    assert uncapped == 6000 // need


def test_running_requests_reserve_new_token_ratio_of_their_rest() -> None:
    """H1: requests already running reserve min(max_new - generated, CLIP) * new_token_ratio."""
    params = replace(SMALL, kv_tokens=3000, context_length=2048, chunk_tokens=100_000)
    engine = EngineModel(params)
    engine.submit(EngineRequest("big", text("a", 400), reply_tokens=1500, max_new_tokens=1500), 0.0)
    engine.step(0.0)  # admitted; ratio 0.7 -> reserves ~0.7 * 1499 = 1049 tokens
    assert engine.metrics().new_token_ratio == INIT_NEW_TOKEN_RATIO
    # Room for new work: 3000 - 101 (prompt) - 1049 (reserve) = 1850; "blocked" needs
    # 100 + 1800 + 1 and blocks the small request behind it (head of line).
    engine.submit(
        EngineRequest("blocked", text("b", 400), reply_tokens=10, max_new_tokens=1800), 1.0
    )
    engine.submit(EngineRequest("late", text("c", 40), reply_tokens=10, max_new_tokens=10), 1.0)
    step = engine.step(1.0)
    assert step.kind is StepKind.DECODE
    assert engine.metrics().waiting == 2
    engine.cancel("blocked", step.end)
    engine.submit(
        EngineRequest("fits", text("d", 400), reply_tokens=10, max_new_tokens=1700), step.end
    )
    step = engine.step(step.end)
    assert step.admitted == ("late", "fits")
    run(engine, step.end)


def test_new_token_ratio_decays_and_resets_when_idle() -> None:
    """H1: the ratio decays per decode step toward 0.14 * init and resets at idle."""
    engine = EngineModel(SMALL)
    engine.submit(EngineRequest("r", text("a", 100), reply_tokens=50, max_new_tokens=60), 0.0)
    t = 0.0
    for _ in range(10):
        t = engine.step(t).end
    decay = (0.7 - 0.7 * 0.14) / 600
    assert engine.metrics().new_token_ratio == pytest.approx(0.7 - 9 * decay)
    t, _ = run(engine, t)
    assert engine.step(t).kind is StepKind.IDLE
    assert engine.metrics().new_token_ratio == INIT_NEW_TOKEN_RATIO


# ----------------------------------------------------------- queue, cap


def test_queue_beyond_running_cap_is_fifo() -> None:
    """H1: at most max_running requests run; the rest wait and enter in arrival order."""
    engine = EngineModel(replace(SMALL, max_running=2))
    for i in range(5):
        engine.submit(
            EngineRequest(f"r{i}", text(f"p{i}", 80), reply_tokens=3, max_new_tokens=8), i * 0.001
        )
    step = engine.step(0.01)
    assert step.admitted == ("r0", "r1")
    m = engine.metrics()
    assert (m.running, m.waiting) == (2, 3)
    _, steps = run(engine, step.end)
    order = [rid for s in steps for rid in s.admitted]
    assert order == ["r2", "r3", "r4"]


def test_default_running_cap_follows_sglang_formula() -> None:
    """H1: without --max-running the cap is SGLang's memory-derived default."""
    assert sglang_max_running(55_000, 8192) == 3437
    assert EngineParams().running_cap == 3437
    assert sglang_max_running(2000, 1024) == 1000


def test_priority_scheduling_higher_first_ties_fifo() -> None:
    """H1: with priority scheduling, higher priority values are admitted first; ties FIFO."""
    engine = EngineModel(replace(SMALL, max_running=1, priority_scheduling=True))
    engine.submit(EngineRequest("first", text("f", 80), reply_tokens=2, max_new_tokens=4), 0.0)
    engine.step(0.0)
    for rid, prio in (("low", 0), ("high-a", 5), ("mid", 2), ("high-b", 5)):
        engine.submit(
            EngineRequest(rid, text(rid, 80), reply_tokens=2, max_new_tokens=4, priority=prio), 0.1
        )
    _, steps = run(engine, 0.2)
    assert [rid for s in steps for rid in s.admitted] == ["high-a", "high-b", "mid", "low"]


def test_priority_ignored_without_priority_scheduling_and_low_first_option() -> None:
    """H1: priority only matters with priority scheduling; low_priority_first inverts it."""
    for params, expected in (
        (replace(SMALL, max_running=1), ["a", "b", "c"]),
        (
            replace(SMALL, max_running=1, priority_scheduling=True, low_priority_first=True),
            ["c", "b", "a"],
        ),
    ):
        engine = EngineModel(params)
        engine.submit(EngineRequest("x", text("x", 80), reply_tokens=2, max_new_tokens=4), 0.0)
        engine.step(0.0)
        for rid, prio in (("a", 3), ("b", 2), ("c", 1)):
            engine.submit(
                EngineRequest(rid, text(rid, 80), reply_tokens=2, max_new_tokens=4, priority=prio),
                0.1,
            )
        _, steps = run(engine, 0.2)
        assert [rid for s in steps for rid in s.admitted] == expected


# -------------------------------------------------------------- retraction


def test_retraction_when_decode_memory_runs_out() -> None:
    """H1: when decode needs more slots than free + evictable, SGLang's retract_decode
    sends the requests with the fewest generated tokens back to the queue; all still finish."""
    params = EngineParams(kv_tokens=1200, context_length=1100, chunk_tokens=100_000, block_chars=32)
    engine = EngineModel(params)
    # After a long decode phase the ratio is low, so many long replies get admitted.
    engine._decay = 1.0  # jump straight to the minimum ratio
    engine.submit(EngineRequest("warm", text("w", 40), reply_tokens=3, max_new_tokens=4), 0.0)
    t = engine.step(0.0).end
    t = engine.step(t).end
    for i in range(6):
        engine.submit(
            EngineRequest(f"r{i}", text(f"p{i}", 400), reply_tokens=600, max_new_tokens=800), t
        )
    t, steps = run(engine, t)
    retracted = [rid for s in steps for rid in s.retracted]
    assert retracted, "expected at least one retraction"
    assert engine.metrics().retractions == len(retracted)
    done = finished(steps)
    assert set(done) >= {f"r{i}" for i in range(6)}
    assert all(reason is FinishReason.STOP for rid, reason in done.items() if rid.startswith("r"))
    # A retracted request re-enters via a prefill that recomputes its generated tokens.
    assert any(rid in s.admitted for s in steps for rid in retracted if s.kind is StepKind.PREFILL)
    assert engine.metrics().used_tokens == 0


# ---------------------------------------------------------------- cancel


def test_cancel_frees_memory_and_stops_generation() -> None:
    """H1: cancelling (client disconnect) drops the request and frees its KV."""
    engine = EngineModel(SMALL)
    engine.submit(EngineRequest("r", text("a", 400), reply_tokens=100, max_new_tokens=200), 0.0)
    engine.submit(EngineRequest("w", text("b", 400), reply_tokens=100, max_new_tokens=200), 0.0)
    t = engine.step(0.0).end
    t = engine.step(t).end
    assert engine.metrics().used_tokens > 0
    assert engine.cancel("r", t)
    assert engine.cancel("w", t)
    assert not engine.cancel("r", t)
    m = engine.metrics()
    assert (m.running, m.waiting, m.used_tokens) == (0, 0, 0)
    assert m.evictable_tokens == m.cached_tokens  # prompt blocks stay cached, unreferenced
    assert not engine.has_work()

    queued = EngineModel(replace(SMALL, max_running=1))
    queued.submit(EngineRequest("a", text("a", 80), reply_tokens=2, max_new_tokens=4), 0.0)
    queued.submit(EngineRequest("b", text("b", 80), reply_tokens=2, max_new_tokens=4), 0.0)
    queued.step(0.0)
    assert queued.cancel("b", 0.1)
    _, steps = run(queued, 0.1)
    assert "b" not in finished(steps)


# --------------------------------------------------------- finish, timing


def test_finish_reasons_and_timing() -> None:
    """H1: a reply ends at its natural length (stop) or at max_tokens (length); each
    finished request reports queued, prefill and decode time."""
    engine = EngineModel(replace(SMALL, max_running=1))
    engine.submit(EngineRequest("short", text("a", 80), reply_tokens=3, max_new_tokens=10), 0.0)
    engine.submit(EngineRequest("cut", text("b", 80), reply_tokens=50, max_new_tokens=5), 0.0)
    _, steps = run(engine)
    done = {f.request_id: f for s in steps for f in s.finished}
    assert done["short"].reason is FinishReason.STOP and done["short"].completion_tokens == 3
    assert done["cut"].reason is FinishReason.LENGTH and done["cut"].completion_tokens == 5
    assert done["short"].timing.queued_s == 0.0
    assert done["cut"].timing.queued_s > 0.0
    assert done["cut"].timing.prefill_s > 0.0 and done["cut"].timing.decode_s > 0.0


def test_time_scale_divides_durations() -> None:
    """H1: time_scale runs the same model faster: every duration is divided by it."""
    durations = []
    for scale in (1.0, 10.0):
        engine = EngineModel(replace(SMALL, time_scale=scale))
        engine.submit(EngineRequest("r", text("a", 400), reply_tokens=20, max_new_tokens=30), 0.0)
        _, steps = run(engine)
        durations.append([s.duration for s in steps])
    assert durations[0] == pytest.approx([d * 10 for d in durations[1]])


def test_decode_cost_grows_with_batch_and_context() -> None:
    """H1: decode step time grows with batch size and with context length."""

    def first_decode(n: int, chars: int) -> float:
        engine = EngineModel(replace(SMALL, kv_tokens=50_000, context_length=8192))
        for i in range(n):
            engine.submit(
                EngineRequest(f"r{i}", text(f"p{i}", chars), reply_tokens=5, max_new_tokens=8), 0.0
            )
        t = 0.0
        while True:
            step = engine.step(t)
            if step.kind is StepKind.DECODE:
                return step.duration
            t = step.end

    assert first_decode(8, 400) > first_decode(1, 400)
    assert first_decode(4, 8000) > first_decode(4, 400)


def test_submit_rejects_requests_that_cannot_run() -> None:
    """H1: prompts beyond the context, replies beyond it and duplicate ids are refused."""
    engine = EngineModel(SMALL)
    with pytest.raises(SubmitError, match="context length"):
        engine.submit(EngineRequest("a", "x" * 5000, reply_tokens=1), 0.0)
    with pytest.raises(SubmitError, match="maximum context length"):
        engine.submit(EngineRequest("b", "x" * 400, reply_tokens=1, max_new_tokens=1000), 0.0)
    engine.submit(EngineRequest("c", "x" * 40, reply_tokens=1, max_new_tokens=4), 0.0)
    with pytest.raises(SubmitError, match="duplicate"):
        engine.submit(EngineRequest("c", "x" * 40, reply_tokens=1, max_new_tokens=4), 0.0)
    with pytest.raises(ValueError):
        EngineParams(block_chars=30)


# ------------------------------------------------------------ determinism


def scenario(params: EngineParams) -> list[StepResult]:
    engine = EngineModel(params)
    t = 0.0
    steps: list[StepResult] = []
    for i in range(12):
        engine.submit(
            EngineRequest(
                f"r{i}",
                text(f"p{i % 3}", 300 + 37 * i),
                reply_tokens=20 + 13 * i,
                max_new_tokens=120,
            ),
            t,
        )
        for _ in range(3):
            step = engine.step(t)
            steps.append(step)
            t = step.end if step.duration else t + 0.01
    if engine.has_work():
        engine.cancel("r11", t)
    t, rest = run(engine, t)
    return steps + rest


def test_same_inputs_give_same_events() -> None:
    """H1: the model is deterministic: the same inputs give the same events and times."""
    params = replace(SMALL, kv_tokens=1500, max_running=5)
    assert scenario(params) == scenario(params)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["submit", "step", "cancel"]),
            st.integers(0, 7),
            st.integers(1, 1200),
            st.integers(1, 200),
            st.one_of(st.none(), st.integers(1, 300)),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_pool_never_overcommitted_and_everything_drains(
    ops: list[tuple[str, int, int, int, int | None]],
) -> None:
    """H1: under any sequence of submits, steps and cancels the KV pool is never
    over-committed, the running cap holds, and every request eventually finishes."""
    params = EngineParams(
        kv_tokens=1500, context_length=700, chunk_tokens=256, block_chars=32, max_running=4
    )
    engine = EngineModel(params)
    t = 0.0
    submitted: set[str] = set()
    cancelled: set[str] = set()
    done: set[str] = set()
    for n, (op, tag, chars, reply, max_new) in enumerate(ops):
        if op == "submit":
            rid = f"r{n}"
            try:
                engine.submit(
                    EngineRequest(
                        rid, text(f"t{tag}", chars), reply_tokens=reply, max_new_tokens=max_new
                    ),
                    t,
                )
            except SubmitError:
                continue
            submitted.add(rid)
        elif op == "cancel" and submitted - done - cancelled:
            rid = sorted(submitted - done - cancelled)[tag % len(submitted - done - cancelled)]
            assert engine.cancel(rid, t)
            cancelled.add(rid)
        else:
            step = engine.step(t)
            done.update(f.request_id for f in step.finished)
            t = step.end
        m = engine.metrics()
        assert 0 <= m.used_tokens <= params.kv_tokens
        assert m.used_tokens + m.evictable_tokens <= params.kv_tokens
        assert m.running <= 4
    t, steps = run(engine, t)
    done.update(f.request_id for s in steps for f in s.finished)
    assert done == submitted - cancelled
    assert engine.metrics().used_tokens == 0


# ------------------------------------------------------------------ script

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 5},
                    "exact": {"type": "boolean"},
                    "mode": {"type": "string", "enum": ["fast", "deep"]},
                    "optional": {"type": "string"},
                },
                "required": ["query", "limit", "exact", "mode"],
            },
        },
    },
    {"type": "function", "function": {"name": "deep_search", "parameters": {"type": "object"}}},
]


def test_script_calls_tools_until_enough_results_then_answers() -> None:
    """H1: with tools offered the reply calls a tool until N tool results, then answers;
    a tool_choice that demands a call (named, or "required") always gets one."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "find it"}]
    opts = ScriptOptions(tool_results=2)
    ids = set()
    for i in range(2):
        prompt = render_messages(messages, TOOLS)
        plan = plan_reply(messages, TOOLS, opts, prompt_text=prompt)
        assert plan.kind is ReplyKind.TOOL_CALL and plan.tool_call is not None
        assert plan.tool_call.name == ("lookup", "deep_search")[i]
        assert plan == plan_reply(messages, TOOLS, opts, prompt_text=prompt)
        ids.add(plan.tool_call.id)
        assert len(plan.pieces(10_000)) == plan.reply_tokens
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": plan.tool_call.id}]},
            {"role": "tool", "tool_call_id": plan.tool_call.id, "content": "result"},
        ]
    assert len(ids) == 2
    prompt = render_messages(messages, TOOLS)
    final = plan_reply(messages, TOOLS, opts, prompt_text=prompt)
    assert final.kind is ReplyKind.TEXT
    assert final.reply_tokens == answer_length(count_tokens("find it"), final.seed)
    assert (
        plan_reply(messages, TOOLS, opts, prompt_text=prompt, tool_results=3).kind
        is ReplyKind.TOOL_CALL
    )
    assert (
        plan_reply(messages[:1], TOOLS, opts, prompt_text="p", tool_choice="none").kind
        is ReplyKind.TEXT
    )
    # A tool_choice that demands a call gets one past the script's count, as constrained
    # decoding gives it: a client forcing its calls needs no header a router may drop.
    named = {"type": "function", "function": {"name": "deep_search"}}
    forced = plan_reply(messages, TOOLS, opts, prompt_text=prompt, tool_choice=named)
    assert forced.kind is ReplyKind.TOOL_CALL and forced.tool_call is not None
    assert forced.tool_call.name == "deep_search"
    required = plan_reply(messages, TOOLS, opts, prompt_text=prompt, tool_choice="required")
    assert required.kind is ReplyKind.TOOL_CALL
    assert plan_reply(messages, TOOLS, opts, prompt_text=prompt, tool_choice="auto").kind is (
        ReplyKind.TEXT
    )


def test_tool_arguments_fit_schema_and_wrong_types_option() -> None:
    """H1: arguments fill required properties by type; wrong_types sends strings for numbers."""
    schema = TOOLS[0]["function"]["parameters"]  # type: ignore[index]
    args = fill_schema(schema, "s")
    assert set(args) == {"query", "limit", "exact", "mode"}
    assert isinstance(args["query"], str) and args["query"]
    assert isinstance(args["limit"], int) and 1 <= args["limit"] <= 5
    assert isinstance(args["exact"], bool)
    assert args["mode"] in ("fast", "deep")
    wrong = fill_schema(schema, "s", wrong_types=True)
    assert wrong["limit"] == str(args["limit"])
    assert wrong["exact"] in ("true", "false")


def test_text_tool_calls_are_llama_style_json() -> None:
    """H1: the text tool-call option writes {"name", "parameters"} as plain content."""
    messages = [{"role": "user", "content": "go"}]
    plan = plan_reply(messages, TOOLS, ScriptOptions(text_tool_calls=True), prompt_text="p")
    assert plan.kind is ReplyKind.TEXT_TOOL_CALL
    body = "".join(plan.pieces(10_000)).removeprefix("<|python_tag|>")
    assert json.loads(body)["name"] == "lookup"
    assert "query" in json.loads(body)["parameters"]


def test_runaway_answers_never_stop_on_their_own() -> None:
    """H1: with runaway_per_mille = 1000 every answer after a tool result runs until
    max_tokens; a plain chat answer never runs away; ignore_eos makes any answer run."""
    always = ScriptOptions(runaway_per_mille=1000)
    agent: list[dict[str, object]] = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "result"},
    ]
    plan = plan_reply(agent, None, always, prompt_text=render_messages(agent))
    assert plan.kind is ReplyKind.TEXT and plan.reply_tokens == RUNAWAY_TOKENS
    assert len(plan.pieces(300)) == 300
    chat = [{"role": "user", "content": "x"}]
    plain = plan_reply(chat, None, always, prompt_text="x")
    assert plain.reply_tokens == answer_length(1, plain.seed) < RUNAWAY_TOKENS
    forced = plan_reply(chat, None, ScriptOptions(), prompt_text="x", ignore_eos=True)
    assert forced.reply_tokens == RUNAWAY_TOKENS


def test_normal_quantile_inverts_the_cdf() -> None:
    """H1: the hash-driven quantile function is the inverse of the normal CDF."""
    for p in (1e-12, 1e-6, 0.01, 0.02425, 0.2, 0.5, 0.8, 0.97575, 0.99, 1 - 1e-9):
        assert normal_cdf(normal_quantile(p)) == pytest.approx(p, rel=1e-7)
    assert normal_quantile(0.5) == 0.0
    with pytest.raises(ValueError):
        normal_quantile(1.0)


def test_answer_lengths_follow_the_documented_log_normal() -> None:
    """H1: answer lengths (docs/guides/calibration.md, "Reply lengths") are deterministic per
    seed, within 1..ANSWER_MAX_TOKENS, have the documented median, grow with the user
    message up to LMSYS-Chat-1M's mean prompt, and a greeting gets a short answer."""
    seeds = [f"0:{i:016x}" for i in range(4000)]
    for prompt_tokens in (2, 69, 161):
        lengths = sorted(answer_length(prompt_tokens, s) for s in seeds)
        assert lengths == sorted(answer_length(prompt_tokens, s) for s in seeds)
        assert lengths[0] >= 1 and lengths[-1] <= ANSWER_MAX_TOKENS
        assert lengths[2000] == pytest.approx(answer_median(prompt_tokens), rel=0.1)
        # log-normal with sigma 1: p90 / median = e^1.2816 = 3.6
        assert lengths[3600] / lengths[2000] == pytest.approx(3.6, rel=0.15)
    assert answer_median(69) == pytest.approx(214.5 * (69 / 69.5) ** 0.8 / 1.6487, rel=1e-3)
    assert answer_median(2) < answer_median(20) < answer_median(69) < answer_median(70)
    assert answer_median(70) == answer_median(5000)  # longer prompts: not extrapolated
    assert answer_median(70) == pytest.approx(214.5 / 1.6487, rel=1e-3)  # LMSYS's mean
    assert answer_median(2) < 10  # "hello" gets a greeting back, not an essay
    hello = [{"role": "user", "content": "hello"}]
    plan = plan_reply(hello, None, ScriptOptions(), prompt_text=render_messages(hello))
    again = plan_reply(hello, None, ScriptOptions(), prompt_text=render_messages(hello))
    assert plan.reply_tokens == again.reply_tokens <= 100


@settings(max_examples=300, deadline=None)
@example("CHO\u0130CES: red, blue")  # İ: the pattern folds it to i, casefold does not
@example("cho\u0131ces: red, blue")  # ı, likewise
@example("cla\u017f\u017fes = a | b")  # ſ: casefold folds it to s, as the pattern does
@given(
    st.lists(
        st.sampled_from(
            [
                "LABELS",
                "Category",
                "opTions",
                "CHOICES",
                "class",
                "claſſes",
                "CHOİCES",
                "choıces",
                "are",
                "is",
                ":",
                "=",
                " ",
                "\n",
                "- ",
                "1) ",
                "red",
                "ß",
                "or",
                ",",
                "|",
                "Kelvin\u212a",
            ]
        ),
        max_size=30,
    ).map("".join)
)
def test_label_shortcut_finds_what_the_pattern_finds(text: str) -> None:
    """H1 (for R13): skipping the label-line pattern on texts without its words never
    changes the labels found, whatever the case and Unicode folding of those words."""
    assert extract_labels(text) == script._scan_labels(text, label_lines=True)


def test_label_logprobs_include_several_labels() -> None:
    """H1 (for R13): when the prompt lists labels, the first token's top logprobs hold
    several labels' first tokens, deterministically, and the reply starts with the top one."""
    prompt = "Classify this message.\nlabels: lookup, urgent, chitchat\nMessage: the server is down"
    assert extract_labels(prompt) == ["lookup", "urgent", "chitchat"]
    top = label_distribution(prompt, "seed")
    assert top == label_distribution(prompt, "seed")
    tokens = [t for t, _ in top[:5]]
    assert {"look", "urge", "chit"} <= set(tokens)
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(top))
    assert all(lp < 0 for _, lp in top)
    plan = plan_reply(
        [{"role": "user", "content": prompt}], None, ScriptOptions(), prompt_text=prompt
    )
    assert plan.pieces(1) == [top[0][0]]
    assert extract_labels("choose one:\n- red\n- green\n- blue") == ["red", "green", "blue"]


def test_classify_is_deterministic_distribution() -> None:
    """H1: /classify labels and probabilities are deterministic and sum to one."""
    label, probs = classify("hello", ["a", "b", "c"])
    assert (label, probs) == classify("hello", ["a", "b", "c"])
    assert sum(probs) == pytest.approx(1.0)
    assert label == ["a", "b", "c"][probs.index(max(probs))]


def test_metric_gauges_show_the_queue_as_of_the_last_scheduling_decision() -> None:
    """H1, S2, S9: like SGLang's gauges, the reported queue is what was left waiting
    after a scheduling decision (a prefill formed, every DECODE_LOG_INTERVAL decode
    steps, or idle), not a request that merely arrived mid-step."""
    engine = EngineModel(EngineParams(max_running=1))
    engine.submit(EngineRequest("r1", text("a", 400), reply_tokens=200, max_new_tokens=256), 0.0)
    step = engine.step(0.0)
    assert step.kind is StepKind.PREFILL
    assert (engine.metrics().running_gauge, engine.metrics().queue_gauge) == (1, 0)
    engine.submit(EngineRequest("r2", text("b", 400), reply_tokens=5, max_new_tokens=16), step.end)
    assert engine.metrics().waiting == 1 and engine.metrics().queue_gauge == 0
    t = step.end
    for _ in range(DECODE_LOG_INTERVAL):
        t = engine.step(t).end
    assert engine.metrics().queue_gauge == 1  # it really is queued: now the gauge says so
    while engine.has_work():
        t = engine.step(t).end
    engine.step(t)  # idle
    assert (engine.metrics().running_gauge, engine.metrics().queue_gauge) == (0, 0)


def test_number_arguments_are_whole() -> None:
    """H1: a required "number" is filled with a whole number within its bounds: clients
    declare ids as "number" and parse them as integers (Codex's write_stdin
    session_id), so a fractional value would fail their tool call."""
    schema = {
        "type": "object",
        "properties": {"session_id": {"type": "number"}, "ratio": {"type": "number",
                       "minimum": 0.5, "maximum": 3.5}},
        "required": ["session_id", "ratio"],
    }  # fmt: skip
    for seed in ("a", "b", "c", "d", "e"):
        args = fill_schema(schema, seed)
        assert isinstance(args["session_id"], int) and 1 <= args["session_id"] <= 100
        assert isinstance(args["ratio"], int) and 1 <= args["ratio"] <= 3


HARNESS_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "Bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "mcp__luftpause__spawn", "parameters": {
        "type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}}},
    {"type": "function", "function": {"name": "mcp__luftpause__await", "parameters": {
        "type": "object",
        "properties": {"handles": {"type": "array", "items": {"type": "string"}},
                       "mode": {"type": "string", "enum": ["all", "any"]}},
        "required": ["handles"]}}},
]  # fmt: skip


def test_a_tool_directive_calls_exactly_those_tools_in_order_then_answers() -> None:
    """X-bench (#38): ``[tools:spawn,spawn,await]`` in the last user message makes the
    reply call those tools, one per turn, matched by suffix among a harness's prefixed
    names; ``await``'s ``handles`` gathers the ``handle`` each ``spawn`` returned (as a
    JSON string or as text parts); afterwards it answers in text, whatever
    ``tool_results`` says; earlier turns of the conversation do not count."""
    opts = ScriptOptions(tool_results=0)  # without the directive: no tool call at all
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "an earlier question"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "old"}]},
        {"role": "tool", "tool_call_id": "old", "content": '{"handle": "run-old"}'},
        {"role": "assistant", "content": "an earlier answer"},
        {"role": "user", "content": "fan out [tools: spawn, spawn ,await] and report"},
    ]
    called = []
    for i, handle in enumerate(("run-a", "run-b", None)):
        plan = plan_reply(messages, HARNESS_TOOLS, opts, prompt_text=render_messages(messages))
        assert plan.kind is ReplyKind.TOOL_CALL and plan.tool_call is not None
        called.append(plan.tool_call.name)
        args = json.loads(plan.tool_call.arguments)
        result: Any = json.dumps({"handle": handle, "state": "running"})
        if i == 1:  # the second result as content parts, as harnesses send it
            result = [{"type": "text", "text": result}]
        if handle is None:
            assert args["handles"] == ["run-old", "run-a", "run-b"]
            result = json.dumps({"runs": [{"handle": "run-a", "result": "A"}]})
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": result},
        ]
    assert called == ["mcp__luftpause__spawn", "mcp__luftpause__spawn", "mcp__luftpause__await"]
    final = plan_reply(messages, HARNESS_TOOLS, opts, prompt_text=render_messages(messages))
    assert final.kind is ReplyKind.TEXT


def test_a_tool_directive_skips_names_not_offered_and_yields_to_none() -> None:
    """X-bench (#38): a directed name no offered tool matches is skipped; exact names win
    over suffixes; ``tool_choice = "none"`` and a conversation without the marker are
    unchanged; the marker only counts in the last user message."""
    opts = ScriptOptions(tool_results=1)
    directed = [{"role": "user", "content": "[tool:nope] [x] then [tools:Bash]"}]
    # the first marker found is [tool:nope]: nothing offered matches it, so: text
    plan = plan_reply(directed, HARNESS_TOOLS, opts, prompt_text="p")
    assert plan.kind is ReplyKind.TEXT
    bash = [{"role": "user", "content": "run [tool:Bash]"}]
    plan = plan_reply(bash, HARNESS_TOOLS, opts, prompt_text="p")
    assert plan.tool_call is not None and plan.tool_call.name == "Bash"
    none = plan_reply(bash, HARNESS_TOOLS, opts, prompt_text="p", tool_choice="none")
    assert none.kind is ReplyKind.TEXT
    old = [
        {"role": "user", "content": "[tool:Bash]"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now something else"},
    ]
    plain = plan_reply(old, HARNESS_TOOLS, opts, prompt_text="q")
    assert plain.tool_call is not None and plain.tool_call.name == "Bash"  # round robin's first
    assert directed_tools(old) is None
    assert directed_tools([{"role": "user", "content": "[tools:a,b]"}]) == ([["a"], ["b"]], 0)
    assert directed_tools([{"role": "user", "content": "[tools: a + b, c]"}]) == (
        [["a", "b"], ["c"]],
        0,
    )


def _reply(plan: Any) -> list[dict[str, Any]]:
    """The assistant message a harness keeps for a tool-call reply."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in plan.tool_calls
    ]
    return [{"role": "assistant", "content": None, "tool_calls": calls}]


def test_a_tool_directive_group_calls_in_parallel_then_reports_the_results() -> None:
    """X-bench (#38): ``[tools:spawn+spawn,await]`` makes one reply with two ``spawn``
    calls (distinct ids and arguments), then ``await`` with both handles, then a text
    answer that reports what the last tool returned; with ``parallel_tool_calls`` off
    the same script takes one call per reply."""
    opts = ScriptOptions(tool_results=0)
    start: list[dict[str, Any]] = [{"role": "user", "content": "go [tools:spawn+spawn,await]"}]
    for parallel in (True, False):
        messages = list(start)
        names: list[list[str]] = []
        handles = iter(("run-a", "run-b"))
        while True:
            prompt = render_messages(messages)
            plan = plan_reply(
                messages, HARNESS_TOOLS, opts, prompt_text=prompt, parallel_tool_calls=parallel
            )
            if plan.kind is ReplyKind.TEXT:
                break
            names.append([c.name.rsplit("__", 1)[-1] for c in plan.tool_calls])
            messages += _reply(plan)
            for call in plan.tool_calls:
                if call.name.endswith("await"):
                    assert json.loads(call.arguments)["handles"] == ["run-a", "run-b"]
                    out = json.dumps({"results": [{"handle": "run-a", "result": "RHINE"}]})
                else:  # (Codex wraps each result in a note of its own)
                    out = (
                        f"Wall time: 0.1 seconds\nOutput:\n{json.dumps({'handle': next(handles)})}"
                    )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
            assert len(names) < 5
        if parallel:
            assert names == [["spawn", "spawn"], ["await"]]
            first = plan_reply(start, HARNESS_TOOLS, opts, prompt_text=render_messages(start))
            (a, b) = first.tool_calls
            assert a.id != b.id and a.arguments != b.arguments
            assert first.reply_tokens == len(first.pieces(10_000))
        else:
            assert names == [["spawn"], ["spawn"], ["await"]]
        assert plan.text is not None and "RHINE" in plan.text
        assert "".join(plan.pieces(plan.reply_tokens)) == plan.text


DEFERRED = "Use ToolSearch to load these:\nmcp__luftpause__await\nmcp__luftpause__spawn\nWebFetch"
SEARCH_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "ToolSearch", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    HARNESS_TOOLS[0],
]  # fmt: skip


def test_a_tool_directive_loads_deferred_tools_with_the_harness_tool_search_once() -> None:
    """X-bench (#38): where the directed tools are not offered but a tool search is
    (Claude Code's ``ToolSearch``, MCP tools listed by name in a system message), the
    first reply loads them by their full names, once; then the script runs as usual;
    a name the search did not bring is skipped."""
    opts = ScriptOptions(tool_results=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": DEFERRED},
        {"role": "user", "content": "fan out [tools:spawn+spawn,await]"},
    ]
    plan = plan_reply(messages, SEARCH_TOOLS, opts, prompt_text=render_messages(messages))
    (search,) = plan.tool_calls
    assert search.name == "ToolSearch"
    assert json.loads(search.arguments) == {
        "query": "select:mcp__luftpause__spawn,mcp__luftpause__await"
    }
    messages += [*_reply(plan), {"role": "tool", "tool_call_id": search.id, "content": "ok"}]
    loaded = plan_reply(messages, [*SEARCH_TOOLS, *HARNESS_TOOLS[1:]], opts, prompt_text="p")
    assert [c.name for c in loaded.tool_calls] == ["mcp__luftpause__spawn"] * 2
    # the search brought nothing: no second search, the names are skipped, it answers
    nothing = plan_reply(messages, SEARCH_TOOLS, opts, prompt_text="q")
    assert nothing.kind is ReplyKind.TEXT
    # calls written as text never search (they would not be counted as one); an MCP
    # server's tool that happens to be called tool_search is not the harness's search
    start = messages[:2]
    as_text = plan_reply(
        start, SEARCH_TOOLS, ScriptOptions(tool_results=0, text_tool_calls=True), prompt_text="t"
    )
    assert as_text.kind is ReplyKind.TEXT
    theirs = [
        {
            "type": "function",
            "function": {**SEARCH_TOOLS[0]["function"], "name": "mcp__gh__tool_search"},
        }
    ]
    assert plan_reply(start, theirs, opts, prompt_text="u").kind is ReplyKind.TEXT
