"""Progress while load runs: a live line on a terminal, nothing in logs and pipes.

``LiveLine`` redraws one status line in place (``rich``) while the load runs, and
only when its stream is a terminal: a log file or a pipe gets no carriage returns
and no repeated lines, just the table at the end. ``ArmClock`` is for benchmarks
that run many arms one after another: "arm k/N", the time so far and an estimate
of the time left, from the mean time per finished arm.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text


class LiveLine:
    """One line of progress, redrawn in place on a terminal; silent elsewhere."""

    def __init__(
        self,
        stream: TextIO,
        render: Callable[[], str],
        period_s: float = 1.0,
        auto_refresh: bool = True,
    ) -> None:
        self.render = render
        self.enabled = stream.isatty()
        self._live: Live | None = None
        if self.enabled:
            console = Console(file=stream, force_terminal=True, highlight=False)
            self._live = Live(
                Text(render()),
                console=console,
                refresh_per_second=1.0 / period_s,
                auto_refresh=auto_refresh,
                get_renderable=lambda: Text(self.render()),
                transient=False,
            )

    def __enter__(self) -> LiveLine:
        if self._live is not None:
            self._live.start()
        return self

    def refresh(self) -> None:
        """Redraw now (the line also redraws itself every ``period_s``)."""
        if self._live is not None:
            self._live.update(Text(self.render()), refresh=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(Text(self.render()), refresh=True)
            self._live.stop()


class ArmClock:
    """``arm k/N``, elapsed and ETA for a run of ``total`` arms (benchmarks)."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.clock = clock
        self.t0 = clock()

    def start(self) -> str:
        """Label for the arm about to run: ``arm 3/12, 4 min in, ~11 min left``."""
        elapsed = self.clock() - self.t0
        label = f"arm {self.done + 1}/{self.total}, {_duration(elapsed)} in"
        if self.done:
            left = elapsed / self.done * (self.total - self.done)
            label += f", ~{_duration(left)} left"
        return label

    def finished(self) -> None:
        self.done += 1


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
