"""A virtual clock and the events waiting on it."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count


class World:
    """Runs callbacks in time order (ties in the order they were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0  # callbacks run so far
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = count()

    def at(self, t: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at virtual time ``t`` (now, if ``t`` is in the past)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), callback))

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        self.at(self.now + delay, callback)

    def run(self, until: float, progress: Callable[[float], None] | None = None) -> None:
        """Run every callback due up to ``until``; the clock ends at ``until``."""
        next_report = 0.0
        while self._heap and self._heap[0][0] <= until:
            t, _, callback = heapq.heappop(self._heap)
            self.now = t
            callback()
            self.events += 1
            if progress is not None and t >= next_report:
                progress(t)
                next_report = t + 1.0
        self.now = until
