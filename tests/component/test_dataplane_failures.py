"""Nothing lost to a bad request or a dying peer (D4–D6, D9, S2, S9, S10, S11).

Each test is named after the behaviour it pins down. After every bad request or
failure, ``nothing_in_flight`` checks the three places an admitted turn lives:
the scheduler's state, the dataplane's run table (what a resync re-sends) and
its gauges.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _dataplane_stack import (
    COMPLETION,
    MODEL,
    Engine,
    Seen,
    Stack,
    chat,
    make_dataplane,
    nothing_in_flight,
    settle,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)

from luftpause.config import Endpoint, EndpointKind, MetricsFlavour
from luftpause.dataplane import relay
from luftpause.dataplane.app import create_app
from luftpause.dataplane.engine_http import (
    BadResponse,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
)
from luftpause.dataplane.routes import chat as chat_routes
from luftpause.dataplane.routes.engine import engine_error
from luftpause.scheduler.core import EndpointKind as CoreKind
from luftpause.scheduler.core import Params, ReplicaProbed, ReplicaSpec, initial_state
from luftpause.scheduler.service.grpc_server import SchedulerServicer, start_grpc
from luftpause.scheduler.service.host import Host

CHAT = "/v1/chat/completions"


def outcomes(stack: Stack) -> dict[str, float]:
    found: dict[str, float] = {}
    for metric in stack.dp.metrics.registry.collect():
        if metric.name == "luftpause_dataplane_turns":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    key = sample.labels["outcome"]
                    found[key] = found.get(key, 0) + sample.value
    return found


@pytest.mark.parametrize("options", [[1], "abc", 5, True, {"include_usage": "yes"}])
async def test_malformed_stream_options_is_a_400_naming_it_and_takes_no_slot(
    stack: Stack, options: object
) -> None:
    """D6, S10: a streamed turn whose ``stream_options`` is not an object (or whose
    include_usage is not a boolean) is refused before admission with a 400 naming the
    field; no slot is taken, nothing reaches the engine, no resync re-adopts it."""
    resp = await stack.client.post(
        CHAT, json=chat(stream=True, stream_options=options), headers={"x-luftpause-run-id": "r"}
    )
    assert resp.status_code == 400
    assert "'stream_options" in resp.json()["error"]["message"]
    assert resp.headers["x-luftpause-run-id"] == "r"
    assert not stack.engine.seen
    await nothing_in_flight(stack)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (chat(messages=["hi"]), "'messages[0]'"),
        (chat(stream="yes"), "'stream'"),
        (chat(priority="high"), "'priority'"),
        (chat(priority=True), "'priority'"),
        (chat(model=5), "'model'"),
        (chat(model=""), "'model'"),
    ],
)
async def test_every_field_the_proxy_reads_is_validated_before_admission(
    stack: Stack, body: dict[str, object], field: str
) -> None:
    """D6: fields the proxy reads or rewrites are checked first: a 400 naming the field."""
    resp = await stack.client.post(CHAT, json=body)
    assert resp.status_code == 400 and field in resp.json()["error"]["message"]
    assert not stack.engine.seen
    await nothing_in_flight(stack)


async def test_a_body_that_is_not_utf8_is_a_400(stack: Stack) -> None:
    """D6: JSON travels as UTF-8; anything else is named, not a 500."""
    resp = await stack.client.post(CHAT, content=json.dumps(chat()).encode("utf-16"))
    assert resp.status_code == 400 and "UTF-8" in resp.json()["error"]["message"]


@pytest.mark.parametrize("route", [CHAT, "/v1/decide"])
async def test_deeply_nested_json_is_a_400_on_both_turn_routes(stack: Stack, route: str) -> None:
    """D6: a body nested past what the parser takes is a JSON 400, never a 500."""
    deep = b'{"model": "m", "messages": [], "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = await stack.client.post(route, content=deep)
    assert resp.status_code == 400
    assert "nests too deeply" in resp.json()["error"]["message"]
    await nothing_in_flight(stack)


async def test_a_body_too_deep_to_rewrite_is_a_400_before_admission(stack: Stack) -> None:
    """D6: a body the parser takes but that is too deep to serialise again (the proxy
    must add include_usage to the client's stream_options) is refused before admission."""
    nested = "[" * 990 + "]" * 990
    raw = (
        '{"model": "m", "messages": [{"role": "user", "content": ' + nested + "}],"
        ' "stream": true, "stream_options": {}}'
    ).encode()
    resp = await stack.client.post(CHAT, content=raw)
    assert resp.status_code == 400 and "nests too deeply" in resp.json()["error"]["message"]
    await nothing_in_flight(stack)


async def test_an_unexpected_exception_after_admission_is_a_json_500_and_ends_the_turn(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D6, D5: a bug of ours after admission still ends the turn exactly once (reported
    failed, slot freed) and the client gets a JSON 500 with the run ID."""

    def broken_post(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(stack.dp.http, "post", broken_post)
    resp = await stack.client.post(CHAT, json=chat(), headers={"x-luftpause-run-id": "r"})
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "internal error in the dataplane (logged)"
    assert resp.json()["error"]["type"] == "server_error"
    assert resp.headers["x-luftpause-run-id"] == "r"
    await nothing_in_flight(stack)
    assert outcomes(stack) == {"internal_error": 1}


async def test_an_exception_inside_the_stream_relay_still_ends_the_turn(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D5, D6: the stream relay owns its turn: if relaying raises, the turn still ends."""

    def broken_feed(self: relay.SseTap, data: bytes) -> bytes:
        raise RuntimeError("a bug")

    stack.engine.reply = lambda r: httpx.Response(
        200, content=b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
    )
    monkeypatch.setattr(relay.SseTap, "feed", broken_feed)
    with pytest.raises(RuntimeError):  # the in-process transport re-raises the app's error
        await stack.client.post(CHAT, json=chat(stream=True))
    await nothing_in_flight(stack)
    assert outcomes(stack) == {"internal_error": 1}


async def test_a_failure_before_the_relay_takes_over_closes_the_engine_request(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D5, D6: a bug between the engine's answer and the relay still ends the turn, and
    the engine request is closed (not left open, the engine's reply stalled)."""

    def broken_tap(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    stack.engine.reply = lambda r: httpx.Response(
        200, content=b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
    )
    monkeypatch.setattr(chat_routes, "SseTap", broken_tap)
    resp = await stack.client.post(CHAT, json=chat(stream=True))
    assert resp.status_code == 500
    await nothing_in_flight(stack)
    assert outcomes(stack) == {"internal_error": 1}
    assert not stack.dp.http._all  # no connection to the engine left open


async def test_a_refused_connection_takes_the_replica_out_until_a_probe(stack: Stack) -> None:
    """D6, S9: a turn whose engine refuses the connection takes the replica out of
    placement at once: the next turn waits instead of failing on the dead engine, and a
    healthy probe brings the replica back."""
    await stack.engine.stop()
    first = await stack.client.post(CHAT, json=chat())
    assert first.status_code == 502
    await settle(stack.host, lambda: not stack.host.state.replicas["engine-a"].healthy)
    second = asyncio.ensure_future(stack.client.post(CHAT, json=chat()))
    await settle(stack.host, lambda: bool(stack.host.state.held))
    assert not second.done()
    await stack.engine.start()  # back, on a new port
    stack.dp.endpoints["engine-a"] = stack.dp.endpoints["engine-a"].model_copy(
        update={"url": stack.engine.url}
    )
    await stack.host.apply(lambda at: ReplicaProbed(at=at, replica="engine-a", healthy=True))
    resp = await asyncio.wait_for(second, 5)
    assert resp.status_code == 200
    await nothing_in_flight(stack)
    assert outcomes(stack) == {"engine_unreachable": 1, "finished": 1}


async def test_held_ms_counts_the_whole_wait_through_a_scheduler_outage(stack: Stack) -> None:
    """D4, S11: ``x-luftpause-held-ms`` is all the time the dataplane held the turn,
    including a scheduler outage (the scheduler's own count starts again on retry)."""
    await stack.stop_scheduler()
    await settle(stack.host, lambda: not stack.dp.link.ready.is_set())
    waiting = asyncio.ensure_future(stack.client.post(CHAT, json=chat()))
    await asyncio.sleep(1.0)
    await stack.start_scheduler()
    resp = await asyncio.wait_for(waiting, 10)
    assert resp.status_code == 200
    assert int(resp.headers["x-luftpause-held-ms"]) >= 1000


@pytest.mark.parametrize("stack", ["s3cret"], indirect=True)
async def test_the_bearer_scheme_is_case_insensitive(stack: Stack) -> None:
    """D9: HTTP auth schemes are case-insensitive; a wrong scheme or token is a 401 with
    ``WWW-Authenticate``."""
    for scheme in ("Bearer", "bearer", "BEARER"):
        ok = await stack.client.post(
            CHAT, json=chat(), headers={"authorization": f"{scheme} s3cret"}
        )
        assert ok.status_code == 200, scheme
    for value in ("Basic s3cret", "Bearer s3cre", "Bearers3cret", ""):
        denied = await stack.client.post(CHAT, json=chat(), headers={"authorization": value})
        assert denied.status_code == 401, value
        assert denied.headers["www-authenticate"].startswith("Bearer")
    await nothing_in_flight(stack)


async def test_values_echoed_in_error_messages_are_truncated(stack: Stack) -> None:
    """D6: a client's value quoted in an error is cut short, its length said."""
    huge = "m" * 1_000_000
    resp = await stack.client.post(CHAT, json=chat(model=huge))
    assert resp.status_code == 404
    message = resp.json()["error"]["message"]
    assert len(message) < 200 and "1000000 characters" in message
    bad_class = await stack.client.post(
        CHAT, json=chat(), headers={"x-luftpause-class": "x" * 10_000}
    )
    assert bad_class.status_code == 400 and len(bad_class.json()["error"]["message"]) < 200


async def test_a_good_turn_after_bad_ones_finds_every_slot(stack: Stack) -> None:
    """D6, S5: bad requests cost nothing: afterwards the caller counts nothing in flight
    and a good turn goes straight through."""
    for options in ([1], "abc", 5, True):
        await stack.client.post(
            CHAT,
            json=chat(stream=True, stream_options=options),
            headers={"x-luftpause-caller": "a"},
        )
    assert not stack.host.state.caller_in_flight
    stack.engine.reply = lambda r: httpx.Response(200, json=COMPLETION)
    ok = await stack.client.post(CHAT, json=chat(), headers={"x-luftpause-caller": "a"})
    assert ok.status_code == 200
    await nothing_in_flight(stack)


async def test_a_reply_whose_numbers_a_report_cannot_carry_still_ends_the_turn(
    stack: Stack,
) -> None:
    """D5: usage and finish reason are read defensively (a boolean or a 2**64 token
    count, a finish reason with a lone surrogate): the turn is still reported finished
    and gives its slot back, and the client gets the engine's bytes."""
    events = (
        b'data: {"choices":[{"index":0,"delta":{"content":"x"},'
        b'"finish_reason":"\\ud800"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":true,'
        b'"completion_tokens":18446744073709551616}}\n\n'
        b"data: [DONE]\n\n"
    )
    stack.engine.reply = lambda r: httpx.Response(
        200, content=events, headers={"content-type": "text/event-stream"}
    )
    resp = await stack.client.post(CHAT, json=chat(stream=True))
    assert resp.status_code == 200 and resp.content.endswith(b"data: [DONE]\n\n")
    stack.engine.reply = lambda r: httpx.Response(200, json={**COMPLETION, "choices": 5})
    plain = await stack.client.post(CHAT, json=chat())
    assert plain.status_code == 200 and plain.json()["choices"] == 5
    await nothing_in_flight(stack)
    assert outcomes(stack) == {"finished": 2}


async def test_a_turn_that_ends_while_the_resync_is_on_its_way_is_still_reported(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S11, D5: a turn listed in the dataplane's resync snapshot that ends before the
    resync is answered is reported once the link is up (not dropped, and not taken by
    the broken stream's leftover request iterator), so the restarted scheduler does
    not keep its slot until the turn timeout."""
    finish_stream, resync_started, resync_release = (asyncio.Event() for _ in range(3))

    async def slow_stream() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        await finish_stream.wait()
        yield b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n'

    stack.engine.reply = lambda r: httpx.Response(
        200, content=slow_stream(), headers={"content-type": "text/event-stream"}
    )
    streaming = asyncio.ensure_future(stack.client.post(CHAT, json=chat(stream=True)))
    await settle(stack.host, lambda: bool(stack.host.state.turns))
    await stack.stop_scheduler()
    await settle(stack.host, lambda: not stack.dp.link.ready.is_set())

    original = SchedulerServicer.Resync

    async def slow_resync(self: SchedulerServicer, request: Any, context: Any) -> Any:
        resync_started.set()
        await resync_release.wait()
        return await original(self, request, context)

    monkeypatch.setattr(SchedulerServicer, "Resync", slow_resync)
    await stack.start_scheduler()
    async with asyncio.timeout(10):
        await resync_started.wait()  # the snapshot, listing the turn, is on its way
    finish_stream.set()
    assert (await asyncio.wait_for(streaming, 10)).status_code == 200  # ended meanwhile
    resync_release.set()
    await settle(stack.host, lambda: stack.dp.link.ready.is_set())  # resynced: adopted
    await nothing_in_flight(stack)  # ... and then reported finished


@pytest.mark.parametrize(
    ("os_errno", "unreachable"),
    [
        (errno.ECONNREFUSED, True),
        (errno.EHOSTUNREACH, True),
        (errno.EMFILE, False),  # this machine's limit, not the engine's fault
        (errno.EADDRNOTAVAIL, False),
    ],
)
def test_only_errors_that_say_the_engine_is_unreachable_take_it_out(
    os_errno: int, unreachable: bool
) -> None:
    """D6: a refused or unroutable connection takes the replica out of placement; the
    dataplane's own resource limits (open files, local ports) do not. Either way no
    connection was made, so the engine never saw the turn (it may be placed again)."""
    exc = ConnectFailed("127.0.0.1", 1, OSError(os_errno, os.strerror(os_errno)))
    error = engine_error("engine-a", exc)
    assert error.replica_unreachable is unreachable
    assert error.not_sent
    assert error.message.startswith("engine engine-a: connection failed")


@pytest.mark.parametrize(
    ("exc", "not_sent"),
    [
        (ConnectTimeout("no connection within 2 s"), True),
        (Disconnected("the engine closed the connection"), False),
        (BadResponse("not HTTP/1.1"), False),
        (ConnectionResetError(errno.ECONNRESET, "reset"), False),
    ],
)
def test_only_a_failed_connect_says_the_engine_never_saw_the_turn(
    exc: Exception, not_sent: bool
) -> None:
    """D6: only a connection that was never made means no byte of the request reached
    the engine; a reset or a broken reply may come after the engine read it."""
    assert engine_error("engine-a", exc).not_sent is not_sent


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"model": "m", "messages": [], "temperature": NaN}', "NaN"),
        (b'{"model": "m", "messages": [], "max_tokens": Infinity}', "Infinity"),
    ],
)
async def test_non_json_constants_are_a_400(stack: Stack, body: bytes, problem: str) -> None:
    """D6: NaN and Infinity are not JSON: refused before admission, not sent on."""
    resp = await stack.client.post(CHAT, content=body)
    assert resp.status_code == 400 and problem in resp.json()["error"]["message"]
    assert not stack.engine.seen


async def test_a_null_stream_options_is_replaced_not_duplicated(stack: Stack) -> None:
    """D5: a client's ``"stream_options": null`` is replaced by the one asking for usage;
    the engine never gets the key twice (strict parsers refuse duplicate keys)."""
    stack.engine.reply = lambda r: httpx.Response(
        200, content=b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
    )
    await stack.client.post(CHAT, json=chat(stream=True, stream_options=None))
    sent = stack.engine.seen[0].content
    assert sent.count(b'"stream_options"') == 1
    assert json.loads(sent)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stack", ["s3cret"], indirect=True)
async def test_every_error_on_a_turn_route_names_a_run(stack: Stack) -> None:
    """D6: errors found before the run is known (a bad body, a bad token) still carry
    ``x-luftpause-run-id``: the run the client named, else a new one."""
    auth = {"authorization": "Bearer s3cret"}
    for route, body, headers in (
        (CHAT, b"{not json", auth),
        (CHAT, json.dumps(chat()).encode(), {}),
        ("/v1/decide", b"[]", auth),
        ("/v1/decide", b'{"input": "x"}', {}),
    ):
        resp = await stack.client.post(route, content=body, headers=headers)
        assert resp.status_code in (400, 401)
        assert resp.headers["x-luftpause-run-id"], (route, body)
        named = await stack.client.post(
            route, content=body, headers={**headers, "x-luftpause-run-id": "mine"}
        )
        assert named.headers["x-luftpause-run-id"] == "mine"


# ---------------------------------------------------------------- placing a turn again

SSE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"hello"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
    b"data: [DONE]\n\n"
)
CLASSIFIED = {"object": "list", "data": [{"index": 0, "label": "urgent", "probs": [1.0]}]}


def answers_well(seen: Seen) -> httpx.Response:
    """A good answer to whatever reaches an engine: a classification, a stream or a
    completion."""
    if seen.path == "/classify":
        return httpx.Response(200, json=CLASSIFIED)
    if json.loads(seen.content).get("stream"):
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})
    return httpx.Response(200, json=COMPLETION)


@dataclass
class Two:
    """The dataplane stack with two engine servers, ``a`` serving the replicas
    ``engine-a`` (generative) and ``clf-a`` (single pass), ``b`` serving ``engine-b``
    and ``clf-b``. ``stack.engine`` is ``a``."""

    stack: Stack
    a: Engine
    b: Engine

    async def out(self, *replicas: str) -> None:
        """Take ``replicas`` out of placement, as a failed probe does."""
        for name in replicas:
            await self.stack.host.apply(
                lambda at, n=name: ReplicaProbed(at=at, replica=n, healthy=False)
            )

    async def back(self, *replicas: str) -> None:
        for name in replicas:
            await self.stack.host.apply(
                lambda at, n=name: ReplicaProbed(at=at, replica=n, healthy=True)
            )

    def healthy(self, replica: str) -> bool:
        return self.stack.host.state.replicas[replica].healthy


@pytest.fixture(name="two")
async def two_fixture() -> AsyncIterator[Two]:
    a, b = Engine(reply=answers_well), Engine(reply=answers_well)
    await a.start()
    await b.start()
    specs = (
        ReplicaSpec("engine-a", CoreKind.GENERATIVE, frozenset({MODEL})),
        ReplicaSpec("engine-b", CoreKind.GENERATIVE, frozenset({MODEL})),
        ReplicaSpec("clf-a", CoreKind.SINGLE_PASS, frozenset({"clf"})),
        ReplicaSpec("clf-b", CoreKind.SINGLE_PASS, frozenset({"clf"})),
    )
    urls = {"engine-a": a.url, "engine-b": b.url, "clf-a": a.url, "clf-b": b.url}
    host = Host(initial_state(specs, Params(queue_probes=1), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    server = await start_grpc(host, urls, "127.0.0.1:0")
    address = f"127.0.0.1:{server.port}"
    dp = make_dataplane(address, a.url, "dp-two")
    dp.endpoints = {
        name: Endpoint(
            name=name,
            url=url,
            models=("clf",) if name.startswith("clf") else (MODEL,),
            kind=EndpointKind.SINGLE_PASS if name.startswith("clf") else EndpointKind.GENERATIVE,
            metrics=MetricsFlavour.NONE,
        )
        for name, url in urls.items()
    }
    maintain = asyncio.create_task(dp.link.maintain())
    async with asyncio.timeout(5):
        await dp.link.ready.wait()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(dp)), base_url="http://dp")
    two = Two(Stack(host, server, writer, dp, client, a, address), a, b)
    await two.back(*urls)
    yield two
    maintain.cancel()
    await client.aclose()
    await dp.http.close()
    await dp.link.close()
    await two.stack.stop_scheduler()
    await a.stop()
    await b.stop()


ROUTES = {
    "chat": (CHAT, chat()),
    "chat-stream": (CHAT, chat(stream=True)),
    "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}]}),
    "messages-stream": ("/v1/messages", {"model": MODEL, "max_tokens": 8, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi"}),
    "responses-stream": ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
    "decide": ("/v1/decide", {"input": "the pager rang"}),
}  # fmt: skip


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_turn_whose_connection_was_refused_is_placed_again(two: Two, route: str) -> None:
    """D6, S9, D7, B9: a turn whose engine refuses the connection never reached it: it
    is reported failed with ``replica_unreachable`` (the replica leaves placement) and
    admitted once more, as a new turn of the same run, class and caller; the client gets
    the other replica's answer as if nothing happened, streamed or not, on every turn
    route. Here the only other replica is out of placement at first, so the second
    admission waits for it to come back."""
    path, body = ROUTES[route]
    generative = route != "decide"
    dead, live = ("engine-a", "engine-b") if generative else ("clf-a", "clf-b")
    await two.out(live)
    await two.a.stop()
    headers = {"x-luftpause-run-id": "r1", "x-luftpause-class": "interactive",
               "x-luftpause-caller": "ann"}  # fmt: skip
    pending = asyncio.ensure_future(two.stack.client.post(path, json=body, headers=headers))
    # The first admission went to the dead replica (the only one in placement), which
    # left placement at the refused connection; the second waits, held.
    await settle(two.stack.host, lambda: not two.healthy(dead) and bool(two.stack.host.state.held))
    (held,) = two.stack.host.state.held.values()
    assert held.turn_id.endswith("-again") and held.caller == "ann"
    assert held.run_id == "r1"
    await two.back(live)
    resp = await asyncio.wait_for(pending, 5)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-luftpause-replica"] == live
    assert resp.headers["x-luftpause-run-id"] == "r1"
    assert len(two.b.seen) == 1 and not two.a.seen
    if body.get("stream"):
        assert resp.headers["content-type"].startswith("text/event-stream")
    assert not two.healthy(dead)  # out until a probe finds it healthy
    await nothing_in_flight(two.stack)
    assert outcomes(two.stack) == {"placed_again": 1, "finished": 1}


@pytest.mark.parametrize("route", ["chat", "chat-stream", "decide"])
async def test_a_turn_refused_twice_fails_as_before(two: Two, route: str) -> None:
    """D6: when the connection of the turn placed again fails too, the client gets the
    error as it would have without placing it again (a JSON 502 naming the replica),
    and both replicas leave placement."""
    path, body = ROUTES[route]
    await two.a.stop()
    await two.b.stop()
    resp = await two.stack.client.post(path, json=body, headers={"x-luftpause-run-id": "r2"})
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error["type"] == "server_error" and error["message"].startswith("engine ")
    assert "connection failed" in error["message"]
    assert resp.headers["x-luftpause-run-id"] == "r2"
    names = ("engine-a", "engine-b") if route != "decide" else ("clf-a", "clf-b")
    await settle(two.stack.host, lambda: not any(two.healthy(n) for n in names))
    await nothing_in_flight(two.stack)
    assert outcomes(two.stack) == {"placed_again": 1, "engine_unreachable": 1}


async def test_a_turn_placed_again_on_the_same_replica_fails_as_before(
    two: Two, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D6: a connect that failed for want of something here (no file descriptor left)
    does not take the replica out, so the turn placed again may land on the same one:
    then the client gets the first error, and the second turn is given back unsent."""

    async def no_descriptors(*args: object, **kwargs: object) -> object:
        raise ConnectFailed("127.0.0.1", 1, OSError(errno.EMFILE, os.strerror(errno.EMFILE)))

    await two.out("engine-b")
    monkeypatch.setattr(two.stack.dp.http, "post", no_descriptors)
    resp = await two.stack.client.post(CHAT, json=chat(), headers={"x-luftpause-run-id": "r3"})
    assert resp.status_code == 502
    assert resp.json()["error"]["message"].startswith("engine engine-a: connection failed")
    assert resp.headers["x-luftpause-replica"] == "engine-a"
    assert two.healthy("engine-a")
    await nothing_in_flight(two.stack)
    assert outcomes(two.stack) == {"placed_again": 1, "engine_broke": 1}


async def test_a_turn_of_a_run_its_client_ended_meanwhile_is_not_placed_again(
    two: Two, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D6, D8: a run ended by its client (``DELETE /v1/runs/{id}``) while its turn was
    connecting is not brought back by placing that turn again: the client gets the
    error, and the run is forgotten with its turn."""

    async def ended_then_refused(*args: object, **kwargs: object) -> object:
        two.stack.dp.runs.end_run("r5")  # the DELETE lands while the turn connects
        raise ConnectFailed(
            "127.0.0.1", 1, OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
        )

    monkeypatch.setattr(two.stack.dp.http, "post", ended_then_refused)
    resp = await two.stack.client.post(CHAT, json=chat(), headers={"x-luftpause-run-id": "r5"})
    assert resp.status_code == 502, resp.text
    assert "r5" not in two.stack.dp.runs.runs
    await nothing_in_flight(two.stack)
    assert outcomes(two.stack) == {"engine_unreachable": 1}
    assert not any(t.endswith("-again") for t in two.stack.host.state.held)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_connection_reset_after_the_request_was_written_is_not_placed_again(
    two: Two, stream: bool
) -> None:
    """D6: an engine that read the request and then reset the connection may have run
    the turn: it fails as before (a 502, the replica stays in rotation) and is not
    sent anywhere else, though another replica is there to take it."""
    got_request = asyncio.Event()
    reset = asyncio.Event()
    connections = 0

    async def read_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        got_request.set()
        await reset.wait()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(read_then_reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    endpoints = two.stack.dp.endpoints
    endpoints["engine-a"] = endpoints["engine-a"].model_copy(
        update={"url": f"http://127.0.0.1:{port}"}
    )
    try:
        await two.out("engine-b")
        pending = asyncio.ensure_future(
            two.stack.client.post(
                CHAT, json=chat(stream=stream), headers={"x-luftpause-run-id": "r4"}
            )
        )
        async with asyncio.timeout(5):
            await got_request.wait()
        await two.back("engine-b")  # a turn placed again would find room there
        reset.set()
        resp = await asyncio.wait_for(pending, 5)
    finally:
        server.close()
    assert resp.status_code == 502
    assert resp.headers["x-luftpause-replica"] == "engine-a"
    assert not two.b.seen and connections == 1
    assert two.healthy("engine-a")
    await nothing_in_flight(two.stack)
    assert outcomes(two.stack) == {"engine_broke": 1}
