"""A fixed set of MCP client sessions to one server, handed out round robin.

Each session has an HTTP client of ours, so headers (the runtime's
``Authorization: Bearer``, X2) go with every request, and a 401 is seen: the MCP
SDK reports a refused request only as "Server returned an error response", inside
an exception group. A pool that cannot open because the server answered 401
raises :class:`TokenRefused`, whose message is one line for the user.
"""

from __future__ import annotations

import contextlib
from typing import Self

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

CONNECT_TIMEOUT_S = 30.0  # the MCP SDK's own defaults
SSE_READ_TIMEOUT_S = 300.0


class TokenRefused(Exception):
    """A luftpause service answered 401: the token is missing or wrong."""

    def __init__(self, service: str, url: str, token_sent: bool) -> None:
        what = "refused the token" if token_sent else "requires a token"
        super().__init__(f"the {service} at {url} {what} (401): set --token or LUFTPAUSE_TOKEN")
        self.service = service
        self.url = url


class ClientPool:
    service = "MCP server"  # how a TokenRefused names the server

    def __init__(
        self,
        url: str,
        size: int,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.size = max(1, size)
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.clients: list[Client] = []
        self.refused = False  # the server answered 401
        self._next = 0
        self._stack = contextlib.AsyncExitStack()

    async def _on_response(self, response: httpx2.Response) -> None:
        if response.status_code == 401:
            self.refused = True

    async def __aenter__(self) -> Self:
        try:
            for _ in range(self.size):
                # One HTTP client per session, as the SDK would make (each has its own pool).
                http = httpx2.AsyncClient(
                    headers=self.headers,
                    timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=SSE_READ_TIMEOUT_S),
                    event_hooks={"response": [self._on_response]},
                )
                self._stack.push_async_callback(http.aclose)
                transport = streamable_http_client(self.url, http_client=http)
                client = Client(transport, mode="legacy", read_timeout_seconds=self.timeout_s)
                self.clients.append(await self._stack.enter_async_context(client))
            await self._opened()
        except Exception:
            await self._stack.aclose()
            if self.refused:
                sent = any(k.lower() == "authorization" for k in self.headers)
                raise TokenRefused(self.service, self.url, sent) from None
            raise
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
