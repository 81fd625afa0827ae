"""Prompts and tool schemas for generated runs.

Every run's context is a *shared system preamble* (the same agent instructions
for every run of one load: engines may cache it across runs, as they do for
real agent frameworks) plus a *per-run task* padded with deterministic notes
until the two together reach ``context_chars``. Different runs therefore share
only the preamble, and a run's later turns share its whole earlier prompt.
"""

from __future__ import annotations

import random
from typing import Any

from luftpause.fakes.engine.script import plan_marker

PREAMBLE_MAX_CHARS = 1200

_WORDS = [
    "river",
    "basin",
    "delta",
    "estuary",
    "tributary",
    "discharge",
    "gauge",
    "flood",
    "plain",
    "levee",
    "sediment",
    "catchment",
    "watershed",
    "aquifer",
    "rainfall",
    "runoff",
    "erosion",
    "meander",
    "channel",
    "bank",
    "current",
    "survey",
    "report",
    "station",
    "record",
    "archive",
    "dataset",
    "source",
    "citation",
    "measure",
    "annual",
    "mean",
    "peak",
    "low",
    "season",
    "spring",
    "summer",
    "autumn",
    "winter",
    "northern",
    "southern",
    "eastern",
    "western",
    "upper",
    "lower",
    "middle",
    "coastal",
    "inland",
    "mountain",
    "valley",
    "lake",
    "reservoir",
    "dam",
    "canal",
    "lock",
]

_PREAMBLE_HEAD = (
    "You are a careful research agent. Use the lookup tool to gather facts before you "
    "answer; cite what the tool returned and keep the final answer short. Guidelines: "
)


def filler(chars: int, seed: str) -> str:
    """Deterministic word salad of exactly ``chars`` characters."""
    if chars <= 0:
        return ""
    # The words ``random.Random(seed).choice(_WORDS)`` draws one by one, drawn as it
    # draws them (rejection sampling over getrandbits) without its two calls per word:
    # every run's task is thousands of characters of this.
    bits = random.Random(seed).getrandbits
    words = _WORDS
    n = len(words)
    k = n.bit_length()
    parts: list[str] = []
    size = 0
    while size < chars + 1:  # joined length = size - 1
        r = bits(k)
        while r >= n:
            r = bits(k)
        word = words[r]
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


def preamble(context_chars: int) -> str:
    """The shared system message (at most a quarter of the context, ≤ 1200 characters)."""
    size = min(PREAMBLE_MAX_CHARS, context_chars // 4)
    if size <= len(_PREAMBLE_HEAD):
        return _PREAMBLE_HEAD[: max(size, 0)] or "You are a research agent."
    return _PREAMBLE_HEAD + filler(size - len(_PREAMBLE_HEAD), "preamble")


def task(context_chars: int, run_key: str, plan_key: str | None = None) -> str:
    """The per-run user message: a task naming the run (and, given one, its plan key as
    ``[plan:KEY]``, which the fake engine draws the run's replies from), padded with
    notes to the same length either way."""
    marker = "" if plan_key is None else f" {plan_marker(plan_key)}"
    head = f"Task {run_key}{marker}: find facts about the river system described in these notes. "
    rest = context_chars - min(PREAMBLE_MAX_CHARS, context_chars // 4) - len(head)
    return head + filler(rest, run_key)


def messages(context_chars: int, run_key: str, plan_key: str | None = None) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": preamble(context_chars)},
        {"role": "user", "content": task(context_chars, run_key, plan_key)},
    ]


def openai_tools(mcp_tools: list[Any], names: list[str] | None) -> list[dict[str, Any]]:
    """MCP tool listings as OpenAI ``tools`` (only ``names``, in that order, when given)."""
    by_name = {t.name: t for t in mcp_tools}
    if names is not None:
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(
                f"tool(s) {', '.join(missing)} not offered by the tool server "
                f"(it has: {', '.join(sorted(by_name))})"
            )
        chosen = [by_name[n] for n in names]
    else:
        chosen = list(mcp_tools)
    out = []
    for t in chosen:
        schema = dict(getattr(t, "input_schema", None) or {"type": "object", "properties": {}})
        out.append(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or t.name,
                    "parameters": schema,
                },
            }
        )
    return out
