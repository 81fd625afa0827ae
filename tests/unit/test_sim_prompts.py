"""The simulator's prompts as block chains (B1, B10): the same engine, replies and records
as prompts rendered and hashed as text (H1's rules, one engine model for both)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.fakes.engine.blocks import PromptChain, block_chain
from luftpause.fakes.engine.model import EngineModel, EngineParams, EngineRequest, SubmitError
from luftpause.fakes.engine.tokens import RunningHash, count_tokens, stable_hash
from luftpause.measure import content
from luftpause.measure.mix import Group, ToolCalls
from luftpause.measure.workload import PROFILES
from luftpause.sim.agents import Records
from luftpause.sim.run import SimConfig, Trace, simulate

TEXT = st.text(alphabet=st.sampled_from("ab é\udc80<|>"), max_size=300)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(TEXT, max_size=8), block_chars=st.sampled_from([4, 8, 32]))
def test_a_chain_appended_piece_by_piece_keys_the_blocks_of_the_whole_text(
    parts: list[str], block_chars: int
) -> None:
    """H1: appending a prompt's pieces gives ``block_chain``'s keys and ``count_tokens``'s
    count of the whole text, whatever the cuts."""
    chain = PromptChain(block_chars)
    for part in parts:
        chain.append(part)
    whole = "".join(parts)
    assert chain.prompt().blocks == block_chain(whole, block_chars)
    assert chain.tokens == count_tokens(whole)


@settings(max_examples=100, deadline=None)
@given(
    head=TEXT,
    opaque=st.integers(0, 200),
    after=st.lists(TEXT, max_size=4),
    cut=st.integers(0, 4),
)
def test_an_opaque_part_keys_one_conversation_alike_and_apart_from_others(
    head: str, opaque: int, after: list[str], cut: int
) -> None:
    """H1: after an opaque part only the length counts: a conversation's later prompt
    extends its earlier one block for block, another conversation shares no block from
    the opaque part on, and the text before it is keyed as text."""

    def chain(identity: str, pieces: list[str]) -> PromptChain:
        c = PromptChain(8).append(head).append_opaque(opaque, identity)
        for piece in pieces:
            c.append(piece)
        return c

    early, late = chain("run-1", after[:cut]), chain("run-1", after)
    other = chain("run-2", after)
    n = len(early.prompt().blocks)
    assert late.prompt().blocks[:n] == early.prompt().blocks
    assert late.chars == len(head) + opaque + sum(map(len, after))
    keyed_as_text = len(head) // 8
    assert late.prompt().blocks[:keyed_as_text] == block_chain(head, 8)[:keyed_as_text]
    assert not set(late.prompt().blocks[keyed_as_text:]) & set(other.prompt().blocks)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(TEXT, max_size=5), after=st.lists(TEXT, max_size=3))
def test_a_running_hash_is_the_stable_hash_of_the_text_fed(
    parts: list[str], after: list[str]
) -> None:
    """H1: a prompt hashed as it grows gets the reply script's hash of its whole text."""
    running = RunningHash(("conversation", "call"))
    for part in parts:
        running.feed(part)
    whole = "".join(parts)
    assert running.hash("conversation") == stable_hash("conversation", whole)
    assert running.copy().hash("call", *after) == stable_hash("call", whole, *after)


def _filler_word_by_word(chars: int, seed: str) -> str:
    """``content.filler`` as it was written: ``getrandbits`` called once per word."""
    if chars <= 0:
        return ""
    bits = random.Random(seed).getrandbits
    n = len(content._WORDS)
    parts: list[str] = []
    size = 0
    while size < chars + 1:
        r = bits(n.bit_length())
        while r >= n:
            r = bits(n.bit_length())
        parts.append(content._WORDS[r])
        size += len(parts[-1]) + 1
    return " ".join(parts)[:chars]


@settings(max_examples=200, deadline=None)
@given(chars=st.integers(-2, 20_000), seed=st.text(max_size=20))
def test_filler_draws_the_words_it_drew_one_at_a_time(chars: int, seed: str) -> None:
    """B1: the task notes drawn many words at a time are the same words, so every run's
    text (and every flood's) is unchanged."""
    assert content.filler(chars, seed) == _filler_word_by_word(chars, seed)


def test_a_chain_of_other_blocks_than_the_engines_is_refused() -> None:
    """H1: a prompt's blocks must be the engine's size, or the cache would mix keys."""
    engine = EngineModel(EngineParams(block_chars=32))
    prompt = PromptChain(16).append("x" * 100).prompt()
    with pytest.raises(SubmitError, match="16 characters"):
        engine.submit(EngineRequest("r", "", reply_tokens=4, prompt=prompt), now=0.0)


GROUPS = (Group("chat", 2, "interactive", "chat"), Group("crowd", 24, "batch", "crowd"))
CASES = [
    pytest.param("luftpause", None, GROUPS, id="luftpause"),
    pytest.param("luftpause", "p1", GROUPS, id="luftpause-plan"),
    pytest.param("luftpause-retain", None, GROUPS, id="retain"),
    pytest.param("router", "p2", GROUPS, id="router-plan"),
    pytest.param("smg-cap8", None, GROUPS, id="smg"),
    pytest.param("engine-prio", None, GROUPS, id="engine-prio"),
    # a run key a label line and a tool directive are read from; tiny and long contexts
    pytest.param(
        "luftpause",
        None,
        (
            Group("labels: a, b", 3, "interactive", "x"),
            Group("[tool:lookup]", 3, "batch", "y", context_chars=40, tool_calls=ToolCalls(0, 2)),
            Group("long", 6, "batch", "z", context_chars=20_000, max_tokens=64),
        ),
        id="odd-groups",
    ),
]


CODING = (
    Group("people", 2, "interactive", "people", profile="coding-agent"),
    Group("crowd", 6, "batch", "crowd", profile="coding-agent"),
)
# Long contexts in a pool they crowd: runs compact, fan out to sub-agents and are retracted.
CODING_ENGINE = EngineParams(
    priority_scheduling=True, context_length=131_072, kv_tokens=400_000, chunk_tokens=8192
)
CASES += [
    pytest.param("luftpause", None, CODING, id="coding"),
    pytest.param("smg", "p3", CODING, id="coding-smg-plan"),
    pytest.param("router", None, CODING, id="coding-router"),
]


@pytest.mark.parametrize(("arm", "plan_seed", "groups"), CASES)
@pytest.mark.parametrize("seed", [0, 7])
def test_block_chain_prompts_play_the_same_events_as_text_prompts(
    arm: str, plan_seed: str | None, groups: tuple[Group, ...], seed: int
) -> None:
    """B1, H1: the simulator's agents with prompts as block chains and with prompts
    rendered and hashed as text make the same turns: the same admissions and decisions
    (the luftpause arm's every event), the same prompt, cached and reply tokens, the
    same timings, the same report."""
    coding = groups is CODING
    agent = PROFILES["coding-agent"]
    config = SimConfig(
        # (a lower context cap: runs compact too)
        profiles={agent.name: replace(agent, context_cap=50_000)},
        groups=groups,
        replicas=2,
        duration_s=600.0 if coding else 60.0,
        warmup_s=10.0,
        seed=seed,
        plan_seed=plan_seed,
        engine=CODING_ENGINE
        if coding
        else EngineParams(priority_scheduling=True, kv_tokens=12_000),
    )
    runs = []
    for text_prompts in (True, False):
        trace, records = Trace(), Records()
        report = simulate(replace(config, text_prompts=text_prompts), arm, None, trace, records)
        del report["wall_s"], report["speedup"]
        runs.append((report, trace, records))
    (report_t, trace_t, records_t), (report_c, trace_c, records_c) = runs
    assert records_t.turns > 50  # (a load that queues, caches and retracts)
    assert records_c.ended == records_t.ended
    assert records_c.runs == records_t.runs
    assert records_c.errors == records_t.errors
    assert trace_c.events == trace_t.events and trace_c.admits == trace_t.admits
    assert report_c == report_t
