"""The text a plan's prompts are made of (B10), the same in ``luftpause loadgen`` and
``luftpause sim``.

A run that follows a :class:`~luftpause.measure.workload.RunPlan` starts with the
system prompt of its plan's ``prefix`` (:func:`shared_text`, the same for every run of
a profile or trace, so engines' prefix caches share it) and is padded to each planned
prompt length with deterministic filler (:func:`pad`). The load generator
(``loadgen.shaped``) pads an engine's conversation with it, the simulator
(``sim.shaped``) the engine model's prompts.
"""

from __future__ import annotations

import functools

from luftpause.measure import content

_PAD = content.filler(4096, "shaped-pad") + " "


def pad(chars: int) -> str:
    """Deterministic filler of exactly ``chars`` characters (cheap for long texts)."""
    if chars <= 0:
        return ""
    return (_PAD * (chars // len(_PAD) + 1))[:chars]


@functools.lru_cache(maxsize=32)
def shared_text(prefix: str, tokens: int) -> str:
    """The system prompt every run named ``prefix`` starts with: ``4 * tokens`` characters.

    The text for fewer tokens is a prefix of the text for more, so runs that declare
    different lengths under one name share the shorter one.
    """
    return content.filler(4 * tokens, f"shared:{prefix}")
