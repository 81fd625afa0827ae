"""The dataplane's ASGI layer: the turn routes served as plain ASGI.

The turn routes (``POST /v1/chat/completions``, ``/v1/messages``, ``/v1/responses``,
``/v1/decide``) are every turn's path, so ``DataplaneApp`` serves them with no
framework in between: it builds the request's ``Incoming``, awaits the route
(``routes/``, wired in by ``app.py``), adds the headers the route asked for, and
sends the answer; every other path, the 404/405 answers and the lifespan go to the
FastAPI app behind it (``routes/rest.py``). An exception a route did not expect is a
bug of ours: it is logged with its traceback and answered as a JSON 500 (D6).

While a turn is held or running, one task per request (``ClientWatch``,
``watch.py``) listens for the client leaving and cancels the request's task; the
code awaiting at that moment turns the cancellation into the outcome it means
(abandoned while held, client left).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from luftpause.dataplane import identity
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import EngineResponse
from luftpause.dataplane.errors import ErrorShape, error_response, openai_error
from luftpause.dataplane.relay import RelayStream
from luftpause.dataplane.watch import ClientWatch
from luftpause.http_errors import Malformed

log = logging.getLogger("luftpause.dataplane")


class RequestHeaders(Mapping[str, str]):
    """A request's headers as the turn routes read them: looked up by name in a dict made
    once, where starlette's ``Headers`` scans the whole list (lower-casing and encoding
    the name) on each of the dozen and more lookups a turn makes. The same answers: a
    name's first value (names are lower case as the server passes them; a name asked
    for in another case is lowered), and ``items()``, ``keys()`` and ``len()`` over
    every header, repeated names included."""

    __slots__ = ("_first", "raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        first: dict[str, str] = {}
        for name, value in raw:
            first.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        self._first = first

    def __getitem__(self, name: str) -> str:
        value = self._first.get(name)
        if value is None:
            return self._first[name.lower()]
        return value

    def get(self, name: str, default: Any = None) -> Any:
        value = self._first.get(name)
        if value is None and name != (lower := name.lower()):
            value = self._first.get(lower)
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._first or name.lower() in self._first)

    def __iter__(self) -> Iterator[str]:
        return (name.decode("latin-1") for name, _ in self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.raw]


class Incoming:
    """A request on a turn route, as the handlers read it."""

    __slots__ = (
        "arrived_at",
        "engine",
        "extra_headers",
        "headers",
        "method",
        "path",
        "query",
        "receive",
        "run_id",
        "scheduler_held_s",
        "shape",
        "watch",
    )

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.arrived_at = time.monotonic()
        self.extra_headers: list[tuple[bytes, bytes]] = []  # added to whatever is answered
        self.engine: EngineResponse | None = None  # the engine's reply, once its head is in
        self.scheduler_held_s = 0.0  # how long the scheduler held the turn for capacity
        self.headers = RequestHeaders(scope["headers"])
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query: bytes = scope.get("query_string", b"")
        self.run_id: str | None = None  # the run the answer names, once known
        self.shape: ErrorShape = openai_error  # errors in the route's API's shape
        self.watch = ClientWatch(receive)


Route = Callable[["Dataplane", Incoming], Awaitable[Response]]


class DataplaneApp:
    """The dataplane's ASGI app (see the module docstring)."""

    def __init__(
        self,
        dp: Dataplane,
        rest: ASGIApp,
        routes: dict[str, Route],
        shapes: dict[str, ErrorShape],
    ) -> None:
        self.dp = dp
        self.rest = rest  # every other route, the 404/405 answers, the lifespan
        self.routes = routes  # the turn routes, by path
        self.shapes = shapes  # the error shape of each route that is not OpenAI's

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self.rest(scope, receive, send)
        elif scope["method"] == "POST":
            await self._turn(route, scope, receive, send)
        else:
            run_id = early_run(RequestHeaders(scope["headers"]), "run")
            shape = self.shapes.get(scope["path"], openai_error)
            answer = not_allowed(scope["method"], scope["path"], "POST", run_id, shape)
            await answer(scope, receive, send)

    def malformed(self, request: Malformed) -> tuple[dict[str, Any], dict[str, str]]:
        """The 400 for a request uvicorn's HTTP parser refused (a control character in a
        header value, ...): the error shape of the route it was sent to (OpenAI's unless
        that route speaks another API), naming the run it named before the fault, or a new
        run (D6)."""
        path = request.path
        shape = next(
            (s for r, s in self.shapes.items() if path == r or path.startswith(r + "/")),
            openai_error,
        )
        named = (request.header(identity.RUN_HEADER.encode()) or "").strip()
        run_id = named if 0 < len(named) <= identity.MAX_RUN_ID else f"run-{uuid.uuid4().hex}"
        return shape(400, request.problem, None), {identity.RUN_HEADER: run_id}

    async def _turn(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        incoming = Incoming(scope, receive)
        try:
            try:
                response = await route(self.dp, incoming)
            except Exception:
                # Our own errors are always JSON (D6): a bug of ours is logged with its
                # traceback and answered as a 500 in the OpenAI error shape.
                log.exception("internal error on %s %s", incoming.method, incoming.path)
                run_id = incoming.run_id or early_run(incoming.headers, "run")
                response = error_response(
                    500, "internal error in the dataplane (logged)", run_id, shape=incoming.shape
                )
            if incoming.extra_headers:
                response.raw_headers = [*response.raw_headers, *incoming.extra_headers]
            if not isinstance(response, RelayStream):
                # The turn has ended: the end of the answer is not the client leaving (once
                # the answer is sent, ``receive`` says "disconnect" whatever the client does).
                incoming.watch.stop()
            await response(scope, receive, send)
            own_time(self.dp, incoming)
        except asyncio.CancelledError:
            if not incoming.watch.left_now():
                raise
            # The client left; whatever the turn held has been given back on the way here.
        finally:
            incoming.watch.stop()


def own_time(dp: Dataplane, incoming: Incoming) -> None:
    """D10: for a turn whose engine answered 200 and whose reply came in whole, the time
    it spent in the dataplane, from its route being called to the last byte of its
    answer handed to the server, less the engine's reply (request written to last byte
    parsed) and the scheduler's hold for capacity. What is left is the proxy's own cost
    outside the engine's reply: reading and parsing the request, the admission round
    trip, forwarding, the end of the relay, and the event loop's waits on those. Work
    and loop delays while the engine is still replying (the relay's per-chunk work) are
    inside the subtracted span, so this is a lower bound; a wait through a scheduler
    outage counts, as the scheduler's hold restarts with each retry."""
    engine = incoming.engine
    if engine is None or engine.status != 200 or not engine.ended_at or incoming.watch.left:
        return
    total = time.monotonic() - incoming.arrived_at
    own = total - (engine.ended_at - engine.sent_at) - incoming.scheduler_held_s
    dp.metrics.own.observe(max(own, 0.0))


def early_run(headers: Mapping[str, str], prefix: str) -> str:
    """The run an answer names before the body is read (D6: every answer names one):
    the run the client named, if usable, else a new run ID."""
    run_id = headers.get(identity.RUN_HEADER, "").strip()
    return run_id if 0 < len(run_id) <= identity.MAX_RUN_ID else f"{prefix}-{uuid.uuid4().hex}"


def not_allowed(
    method: str, path: str, allowed: str, run_id: str, shape: ErrorShape = openai_error
) -> Response:
    return error_response(
        405,
        f"{method} is not allowed on {path}; use {allowed or 'another method'}",
        run_id,
        {"allow": allowed} if allowed else None,
        code="method_not_allowed",
        shape=shape,
    )
