"""A replay trace with tools slower than a second, for B8's evaluation
(docs/benchmarks/policies.md, "KV retention on tool pause (B8)"):
``python tools/bench/retention_trace.py SEED OUT.jsonl``.

560 runs (one in 14 interactive) starting over 300 s, 4-8 turns each; the first prompt 1,400-2,200
tokens (1,000 shared), each next one the previous + the reply + 150-500 tokens of tool result;
tool replies 30-90 tokens, answers 150-300; tool times log-normal with a median of 3 s, cut to
0.5-30 s. ``luftpause sim --trace OUT.jsonl`` replays it (docs/guides/workloads.md)."""

from __future__ import annotations

import json
import random
import sys
from typing import Any

seed = int(sys.argv[1])
out = sys.argv[2]
rng = random.Random(f"slow-tools:{seed}")
runs: list[dict[str, Any]] = []
for i in range(560):
    cls = "interactive" if i % 14 == 0 else "batch"
    start = rng.uniform(0, 300)
    prompt = rng.randint(1400, 2200)
    turns: list[dict[str, Any]] = []
    n = rng.randint(4, 8)
    for t in range(n):
        last = t == n - 1
        comp = rng.randint(150, 300) if last else rng.randint(30, 90)
        turn: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": comp}
        if not last:
            turn["tool_s"] = round(
                min(30.0, max(0.5, rng.lognormvariate(1.1, 0.7))), 2
            )  # median 3 s
        turns.append(turn)
        prompt += comp + rng.randint(150, 500)
    runs.append(
        {
            "id": f"r{i}",
            "class": cls,
            "start_s": round(start, 2),
            "shared_tokens": 1000,
            "turns": turns,
        }
    )
runs.sort(key=lambda r: r["start_s"])
with open(out, "w") as f:
    for r in runs:
        f.write(json.dumps(r) + "\n")
