"""Who is waiting on which run: ``await``/``run`` calls and Tasks register an event
per run handle and are woken when the run, or any run below it, changes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from luftpause.runtime.core import Run


class Watchers:
    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    def watch(self, run_ids: Iterable[str], event: asyncio.Event) -> None:
        for run_id in run_ids:
            self._events.setdefault(run_id, set()).add(event)

    def unwatch(self, run_ids: Iterable[str], event: asyncio.Event) -> None:
        for run_id in run_ids:
            events = self._events.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[run_id]

    def notify(self, chain: Iterable[Run]) -> None:
        """Wake everyone watching a run of ``chain`` (a run and its ancestors)."""
        for run in chain:
            for event in self._events.get(run.id, ()):
                event.set()
