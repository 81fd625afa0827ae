"""A clock a test sets by hand: call it for the time, assign ``now`` to move it."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
