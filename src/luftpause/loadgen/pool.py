"""A fixed set of MCP client sessions to one server, handed out round robin."""

from __future__ import annotations

import contextlib
from typing import Self

from mcp import Client


class ClientPool:
    def __init__(self, url: str, size: int, timeout_s: float) -> None:
        self.url = url
        self.size = max(1, size)
        self.timeout_s = timeout_s
        self.clients: list[Client] = []
        self._next = 0
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        try:
            for _ in range(self.size):
                client = Client(self.url, mode="legacy", read_timeout_seconds=self.timeout_s)
                self.clients.append(await self._stack.enter_async_context(client))
            await self._opened()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _opened(self) -> None:
        """Hook: runs once every session is open (still inside the clean-up guard)."""

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def pick(self) -> Client:
        client = self.clients[self._next % len(self.clients)]
        self._next += 1
        return client
