"""``ClientWatch``: noticing the client leave while its turn is held or runs.

Part of the ASGI layer (``asgi.py``), kept apart so that the stream relay, which
stops the watch once its answer is complete, takes it from below.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive


class ClientWatch:
    """Notices the client leaving while its turn is held or runs: one task reads
    ``receive`` (after the request body, the next message is the disconnect) and,
    when the client goes, cancels the task serving the request. Whatever that task
    awaited then sees ``CancelledError`` with ``left`` set, and says what it meant."""

    __slots__ = ("_receive", "_stopped", "_target", "_watcher", "left")

    def __init__(self, receive: Receive) -> None:
        self.left = False
        self._receive = receive
        self._stopped = False
        self._target: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch from now on (the request body has been read)."""
        if self._watcher is None:
            self._target = asyncio.current_task()
            self._watcher = asyncio.create_task(self._watch())

    def stop(self) -> None:
        self._stopped = True
        if self._watcher is not None:
            self._watcher.cancel()

    def left_now(self) -> bool:
        """Called on ``CancelledError``: True (and the cancellation is consumed) when it
        was this watch's doing, because the client left; False for any other cancel."""
        if not self.left:
            return False
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()
        return True

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        if not self._stopped and self._target is not None:
            self.left = True
            self._target.cancel()
