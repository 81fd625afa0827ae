"""The engine model's long history (H1, B1): one seeded sequence of submits, steps,
cancels and retention releases, with prompts that extend each other as conversations do
(as text and as block chains), a pool small enough to evict and retract, and priority
scheduling on and off; every step's result, and the metrics and request states along
the way, go into one digest.

``DIGESTS`` was recorded before the engine model's cache and steps were made cheaper per
turn (issue #42), so the faster model is shown to give exactly the results the
straightforward one gave, in whichever build is installed (the pure source, or the
model compiled by mypyc: ``make test-compiled``). A change of rule changes it; then
check the change is intended and record the printed digest.

Block keys are Python string hashes, salted per process: they never enter the digest,
and no result may depend on them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest

from luftpause.fakes.engine.blocks import PromptChain
from luftpause.fakes.engine.model import EngineModel, EngineParams, EngineRequest, SubmitError
from luftpause.fakes.engine.results import EngineMetrics

PARAMS = EngineParams(
    kv_tokens=3000,
    context_length=1024,
    chunk_tokens=256,
    block_chars=16,
    max_running=12,
)
STEPS = 2500
# (priority_scheduling, low_priority_first, digest)
DIGESTS = (
    (False, False, "8bd279a61a1430b4142ddbf219fd52cbe53318ee31be326b5b616e87cf6c8b35"),
    (True, False, "d2e5f4899eb70701026c0b9ca44551141675286491e63c6f1b89b9f79c068713"),
    (True, True, "4f591ed4196c698e51d1b7d7b201200a047e1000ddad0b04fed5cc7d5d83f7bf"),
)


def history(params: EngineParams, seed: int) -> tuple[str, EngineMetrics]:
    rng = random.Random(seed)
    engine = EngineModel(params)
    h = hashlib.sha256()
    now = 0.0
    # Conversations: each one's next prompt extends its last (text, or a block chain,
    # some with an opaque part), so turns share their conversation's cached prefix.
    texts: dict[int, str] = {}
    chains: dict[int, PromptChain] = {}
    live: list[str] = []
    n = 0
    for i in range(STEPS):
        op = rng.random()
        if op < 0.3:
            conv = rng.randrange(24)
            grow = "".join(rng.choice("abcd ") for _ in range(rng.randrange(1, 200)))
            prompt = None
            text = ""
            if conv % 3:
                text = texts.get(conv, f"<head {conv % 4}>") + grow
                texts[conv] = text if rng.random() < 0.9 else f"<head {conv % 4}>"
            else:
                chain = chains.get(conv) or PromptChain(params.block_chars).append(
                    f"<head {conv % 4}>"
                )
                chain = chain.copy()
                if conv % 2 and rng.random() < 0.3:
                    chain.append_opaque(rng.randrange(1, 300), f"conv{conv}")
                chain.append(grow)
                chains[conv] = chain
                prompt = chain.prompt()
            keep = rng.random() < 0.3
            request = EngineRequest(
                f"r{n}",
                text,
                reply_tokens=rng.randrange(1, 400),
                max_new_tokens=rng.choice((None, 50, 300)),
                priority=rng.randrange(3),
                retain_key=f"k{conv}" if keep else "",
                retain_s=rng.choice((0.5, 5.0)) if keep else 0.0,
                prompt=prompt,
            )
            n += 1
            try:
                engine.submit(request, now)
            except SubmitError as e:
                h.update(f"refused {e}".encode())
                chains.pop(conv, None)
                texts.pop(conv, None)
                continue
            live.append(request.request_id)
        elif op < 0.34 and live:
            rid = live.pop(rng.randrange(len(live)))
            h.update(f"cancel {rid} {engine.cancel(rid, now)}".encode())
        elif op < 0.36:
            key = f"k{rng.randrange(24)}"
            h.update(f"release {key} {engine.release(key)}".encode())
        else:
            step = engine.step(now, sharers=rng.choice((None, 1, 2)))
            h.update(repr(step).encode())
            done = {f.request_id for f in step.finished}
            live = [r for r in live if r not in done]
            now = step.end + rng.choice((0.0, 0.0, 0.01, 0.3))
        if i % 50 == 0:
            h.update(repr(engine.metrics()).encode())
            h.update(repr(engine.requests(now)).encode())
    while engine.has_work():
        step = engine.step(now)
        h.update(repr(step).encode())
        now = step.end
    final = engine.metrics()
    h.update(repr(final).encode())
    return h.hexdigest(), final


@pytest.mark.parametrize(("priority", "low_first", "expected"), DIGESTS)
def test_a_long_history_gives_the_recorded_results(
    priority: bool, low_first: bool, expected: str
) -> None:
    """H1, B1: the engine model's results for this history are the recorded ones, step
    for step (admissions, tokens, finishes with their timings, retractions, durations),
    with the metrics and request states along the way."""
    params = replace(PARAMS, priority_scheduling=priority, low_priority_first=low_first)
    got, final = history(params, seed=42)
    # (the history reaches what it is for: evictions of kept blocks, retractions, hits)
    assert final.retractions > 0 and final.retention_evicted_tokens > 0
    assert 0 < final.cache_hit_tokens < final.cache_queries_tokens
    print(got)
    assert got == expected
