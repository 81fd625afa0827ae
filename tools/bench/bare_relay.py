"""The floor of the dataplane's stack: a raw ASGI app relaying each turn to an engine.

    python tools/bench/bare_relay.py --engine http://127.0.0.1:8001 [--engine URL ...]
        [--port 0] [--ready-file FILE]

``overhead.py`` runs it as its *floor* arm. It serves on what the dataplane serves on
(uvicorn's httptools protocol as ``luftpause.serving.uvicorn_server`` configures it, on
uvloop, via ``serving.run_async``) and posts to engines with the dataplane's own engine
client (``dataplane.engine_http``), and does nothing else: each request's body goes to
the next engine in turn, unread, to the path it came on, and the engine's status and
body come back chunk by chunk as they arrive. No admission, no scheduler, no parsing of
the request or the stream, no metrics, no errors in the API's shape (a failed engine
request drops the connection). What the dataplane's CPU per turn costs above this
process's is what the dataplane adds above the floor of its stack.

It listens on 127.0.0.1 only and writes a ready file as the services do.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from typing import Any

from luftpause.dataplane.engine_http import EngineClient
from luftpause.serving import (
    bind_socket,
    run_async,
    uvicorn_server,
    wait_started,
    write_ready_file,
)

_STREAM = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON = [(b"content-type", b"application/json")]
_ENGINE_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


class BareRelay:
    """The raw ASGI app: HTTP requests relayed to ``engines`` in turn."""

    def __init__(self, engines: list[str]) -> None:
        self._engines = itertools.cycle([e.rstrip("/") for e in engines])
        self.client = EngineClient(connect_timeout_s=2.0)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the server's start and stop: nothing to do
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[1]  # startup, shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        reply = await self.client.post(
            f"{next(self._engines)}{scope['path']}", body, _ENGINE_HEADERS
        )
        streamed = reply.headers.get("content-type", "").startswith("text/event-stream")
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": _STREAM if streamed else _JSON,
            }
        )
        try:
            async for chunk in reply.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BaseException:
            reply.close()
            raise
        reply.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        action="append",
        required=True,
        metavar="URL",
        help="an engine's base URL (repeat for more)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1; 0 picks a free port"
    )
    parser.add_argument(
        "--ready-file", metavar="FILE", help="write the ready file here once serving"
    )
    args = parser.parse_args(argv)
    app = BareRelay(args.engine)

    async def serve(stop: asyncio.Event) -> int:
        sock = bind_socket("127.0.0.1", args.port)
        server = uvicorn_server(app)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await wait_started(server, task)
        write_ready_file(
            args.ready_file, "bare-relay", {"http": sock.getsockname()[1]}, "127.0.0.1"
        )
        await stop.wait()
        server.should_exit = True
        await task
        await app.client.close()
        return 0

    return run_async(serve)


if __name__ == "__main__":
    sys.exit(main())
