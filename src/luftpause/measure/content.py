"""Prompts and tool schemas for generated runs.

Every run's context is a *shared system preamble* (the same agent instructions
for every run of one load: engines may cache it across runs, as they do for
real agent frameworks) plus a *per-run task* padded with deterministic notes
until the two together reach ``context_chars``. Different runs therefore share
only the preamble, and a run's later turns share its whole earlier prompt.
"""

from __future__ import annotations

import functools
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
    # draws them (rejection sampling over ``getrandbits(k)``: one 32-bit output of the
    # generator each, its top k bits) but many at a time, as every run's task is
    # thousands of characters of this: ``getrandbits(32 * m)`` is the next m outputs,
    # the first in the lowest bits, so every fourth byte of it little-endian is an
    # output's top byte, whose top k bits are the draw. Words drawn beyond the last
    # needed are cut off with the rest.
    bits = random.Random(seed).getrandbits
    text = ""
    while len(text) < chars:
        m = (chars - len(text)) // _MEAN_WORD_CHARS + 16
        draws = bits(32 * m).to_bytes(4 * m, "little")[3::4].translate(_DRAW, _REDRAW)
        drawn = " ".join(map(_WORDS.__getitem__, draws))
        text = f"{text} {drawn}" if text else drawn
    return text[:chars]


# ``filler``'s tables: an output's top byte to the index ``choice`` draws from it, and
# the top bytes it draws again on (an index past the words).
_TOP_BITS = len(_WORDS).bit_length()
assert _TOP_BITS <= 8
_DRAW = bytes((b >> (8 - _TOP_BITS)) % 256 for b in range(256))
_REDRAW = bytes(b for b in range(256) if b >> (8 - _TOP_BITS) >= len(_WORDS))
_MEAN_WORD_CHARS = 6  # a little under the words' mean length with their space (7.3)


@functools.lru_cache(maxsize=64)
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
    head, notes = task_parts(context_chars, run_key, plan_key)
    return head + filler(notes, run_key)


def task_parts(context_chars: int, run_key: str, plan_key: str | None = None) -> tuple[str, int]:
    """``task``'s head (which names the run) and the number of characters of notes
    (``filler(notes, run_key)``) after it, without writing the notes."""
    marker = "" if plan_key is None else f" {plan_marker(plan_key)}"
    head = f"Task {run_key}{marker}: find facts about the river system described in these notes. "
    rest = context_chars - min(PREAMBLE_MAX_CHARS, context_chars // 4) - len(head)
    return head, max(0, rest)


def messages(context_chars: int, run_key: str, plan_key: str | None = None) -> list[dict[str, Any]]:
    return conversation(context_chars, task(context_chars, run_key, plan_key))


def conversation(context_chars: int, task_text: str) -> list[dict[str, Any]]:
    """A run's first messages: the preamble, then ``task_text`` (``task``'s, or a text of
    its length standing in for it)."""
    return [
        {"role": "system", "content": preamble(context_chars)},
        {"role": "user", "content": task_text},
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
