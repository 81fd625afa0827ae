"""Raw HTTP/1.1 over a socket for tests: requests written byte for byte (HTTP clients
tidy header values themselves, so they cannot send what a fuzzer wants to), answers
read with llhttp, the parser uvicorn serves with. Every read is bounded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools

WAIT_S = 10.0


class Answer:
    """One HTTP/1.1 response read off a socket with llhttp (what uvicorn parses with)."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.complete = True

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    answer = Answer()
    async with asyncio.timeout(WAIT_S):
        while not answer.complete:
            chunk = await reader.read(65536)
            assert chunk, "the connection closed before a whole answer"
            answer.parser.feed_data(chunk)
    return answer


async def exchange(port: int, request: bytes) -> tuple[Answer, bool]:
    """Send ``request`` on a new connection: the answer, and whether the server closed
    the connection after it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        answer = await read_answer(reader)
        async with asyncio.timeout(WAIT_S):
            closed = await reader.read(1) == b""
        return answer, closed
    finally:
        writer.close()
