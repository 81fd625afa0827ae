"""A virtual clock and the events waiting on it.

Work done elsewhere (``partition``: engine models stepped in batches, perhaps in other
processes) joins the clock through two hooks. ``reserve()`` takes the tie-breaking
number an event scheduled now would get, and ``at(t, callback, seq)`` schedules it
later with that number, so it runs exactly where it would have run had it been
scheduled at once. ``hold(t, flush)`` promises that nothing is missing from the queue
before ``t``: the first time the loop reaches an event at ``t`` or later it calls every
held ``flush`` first (which schedules what it learns) and goes on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from itertools import count


class World:
    """Runs callbacks in time order (ties in the order they were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0  # callbacks run so far
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = count()
        self.horizon = math.inf  # the earliest ``hold``: events from here wait for a flush
        self._holds: list[Callable[[], None]] = []

    def at(self, t: float, callback: Callable[[], None], seq: int | None = None) -> None:
        """Run ``callback`` at virtual time ``t`` (now, if ``t`` is in the past); ``seq``:
        the place among equal times ``reserve`` gave (default: after everything so far)."""
        place = next(self._seq) if seq is None else seq
        heapq.heappush(self._heap, (max(t, self.now), place, callback))

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        self.at(self.now + delay, callback)

    def reserve(self) -> int:
        """The place among equal times of an event scheduled now, for ``at(..., seq)``."""
        return next(self._seq)

    def hold(self, t: float, flush: Callable[[], None]) -> None:
        """Call ``flush`` before running any event at ``t`` or later."""
        if t < self.horizon:
            self.horizon = t
        if flush not in self._holds:
            self._holds.append(flush)

    def run(self, until: float, progress: Callable[[float], None] | None = None) -> None:
        """Run every callback due up to ``until``; the clock ends at ``until``."""
        next_report = 0.0
        heap = self._heap
        while (heap and heap[0][0] <= until) or self.horizon <= until:
            if not heap or heap[0][0] >= self.horizon:
                self._flush()  # what is owed from here on joins the queue first
                continue
            t, _, callback = heapq.heappop(heap)
            self.now = t
            callback()
            self.events += 1
            if progress is not None and t >= next_report:
                progress(t)
                next_report = t + 1.0
        self.now = until

    def _flush(self) -> None:
        holds, self._holds = self._holds, []
        self.horizon = math.inf
        for flush in holds:
            flush()
