"""B13, R4, X2: callers bound to keys on the runtime's ``/mcp``, the real ``luftpause
runtime`` process.

The runtime is started with ``--config`` naming three callers: ``alice`` (key in an
environment variable, both classes), ``bob`` (keys in a key file, batch only,
downgraded) and ``carol`` (key in an environment variable, batch only, refused). Its
dataplane is a scripted one on 127.0.0.1:0 (a thread) that records each turn's
credential and identity headers; a turn whose task says "hold" is held open until the
test lets it go, so a run stays under way. Requests are raw JSON-RPC (2026-07-28) with
the caller's key as ``Authorization: Bearer`` or ``x-api-key``. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from _mcp_raw import WAIT_S, RawMcp
from _serve import ThreadServer
from conftest import Services
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from luftpause.callers import new_key
from luftpause.procs import ServiceProcess

TOKEN = "services-own-token-" + "t" * 24
ALICE = new_key()
CAROL = new_key()
BOB_1 = new_key()
BOB_2 = new_key()
WRONG = new_key()
KEYS = (ALICE, CAROL, BOB_1, BOB_2, WRONG, TOKEN)


@dataclass
class FakeDataplane:
    """``POST /v1/chat/completions`` answers ``done`` (a held task waits for ``release``);
    ``DELETE /v1/runs/{id}`` is a 204. Each turn's headers are kept in ``turns``."""

    turns: list[dict[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        headers = request.headers
        self.turns.append(
            {
                name: headers.get(name, "")
                for name in (
                    "authorization",
                    "x-luftpause-caller",
                    "x-luftpause-class",
                    "x-luftpause-run-id",
                )
            }
        )
        task = str(body["messages"][-1]["content"])
        deadline = time.monotonic() + WAIT_S
        while "hold" in task and not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "done"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )

    async def end_run(self, _: Request) -> Response:
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/runs/{run}", self.end_run, methods=["DELETE"]),
            ]
        )

    def turns_of(self, run: str) -> list[dict[str, str]]:
        return [t for t in self.turns if t["x-luftpause-run-id"] == run]


@dataclass
class Stack:
    tmp: Path
    dataplane: FakeDataplane
    config: Path
    key_file: Path
    env: dict[str, str]
    services: Services
    runtime: ServiceProcess | None = None

    @property
    def url(self) -> str:
        assert self.runtime is not None
        return f"http://127.0.0.1:{self.runtime.ports['http']}"

    def start(self) -> ServiceProcess:
        self.runtime = self.services.start(
            "runtime", "--config", str(self.config), "--port", "0", "--log-level", "DEBUG",
            env=self.env,
        )  # fmt: skip
        return self.runtime

    def stop(self) -> None:
        assert self.runtime is not None
        self.runtime.proc.send_signal(signal.SIGTERM)
        assert self.runtime.proc.wait(WAIT_S) == 0

    def journal(self) -> list[dict[str, Any]]:
        lines = (self.tmp / "state" / "runs.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def spawn_record(self, handle: str) -> dict[str, Any]:
        [record] = [r for r in self.journal() if r["t"] == "spawn" and r["run"] == handle]
        return record

    def logs(self) -> str:
        return "".join(svc.stderr() for svc in self.services.started)


CONFIG = """
[runtime]
host = "127.0.0.1"
state_dir = "{state}"
dataplane_url = "{dataplane}"
default_model = "m"
stream_turns = false

[[callers]]
name = "alice"
key_env = "ALICE_KEY"
classes = ["interactive", "batch"]

[[callers]]
name = "bob"
key_file = "{key_file}"
classes = ["batch"]

[[callers]]
name = "carol"
key_env = "CAROL_KEY"
classes = ["batch"]
on_denied_class = "refuse"
"""


@contextmanager
def stack(tmp: Path, services: Services) -> Iterator[Stack]:
    dataplane = FakeDataplane()
    with ThreadServer(dataplane.app()) as server:
        key_file = tmp / "bob.keys"
        key_file.write_text(f"# bob's key\n{BOB_1}\n")
        config = tmp / "stack.toml"
        config.write_text(
            CONFIG.format(state=tmp / "state", dataplane=server.url, key_file=key_file)
        )
        env = {"LUFTPAUSE_TOKEN": TOKEN, "ALICE_KEY": ALICE, "CAROL_KEY": CAROL}
        try:
            yield Stack(tmp, dataplane, config, key_file, env, services)
        finally:
            dataplane.release.set()
            services.stop_all()


class Client(RawMcp):
    """A 2026-07-28 client (no Tasks) holding one credential."""

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = await self.modern("tools/call", {"name": tool, "arguments": arguments}, caps={})
        assert reply.status == 200, reply.body
        return reply.result

    async def ok(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.call(tool, arguments)
        assert not result.get("isError"), result
        payload = result["structuredContent"]
        assert isinstance(payload, dict)
        return payload

    async def refused(self, tool: str, arguments: dict[str, Any]) -> str:
        result = await self.call(tool, arguments)
        assert result.get("isError") is True, result
        return "\n".join(c.get("text", "") for c in result["content"])


@asynccontextmanager
async def clients(url: str, **credentials: dict[str, str]) -> AsyncIterator[dict[str, Client]]:
    opened = {
        name: httpx.AsyncClient(base_url=url, headers=headers, timeout=WAIT_S)
        for name, headers in credentials.items()
    }
    try:
        yield {name: Client(http, client_name=f"{name}-client") for name, http in opened.items()}
    finally:
        for http in opened.values():
            await http.aclose()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_key_names_the_caller_and_the_class_it_may_use(
    tmp_path: Path, services: Services
) -> None:
    """B13, R4: a run spawned with a caller's key (bearer or x-api-key) is journaled as
    that caller's, and its turns reach the dataplane with the token and that caller. A
    batch-only key asking for interactive is served batch and told ``classDenied``
    (downgrade), or refused with nothing journaled (refuse); not asking, it gets batch.
    The token's spawns keep the MCP client's name (R4); a sub-agent the token spawns
    under a caller's run is that caller's; a caller cannot spawn under another's run;
    and one idempotency key is a different key for each caller and for the token."""
    with stack(tmp_path, services) as s:
        s.start()
        async with clients(
            s.url,
            alice=bearer(ALICE),
            bob={"x-api-key": BOB_1},
            carol=bearer(CAROL),
            token=bearer(TOKEN),
        ) as c:
            a = await c["alice"].ok("run", {"task": "hello", "serviceClass": "interactive"})
            assert a["state"] == "Completed" and a["serviceClass"] == "interactive"
            assert "classDenied" not in a
            record = s.spawn_record(a["handle"])
            assert (record["caller"], record["owner"]) == ("alice", "alice")
            [turn] = s.dataplane.turns_of(a["handle"])
            assert turn["authorization"] == f"Bearer {TOKEN}"
            assert (turn["x-luftpause-caller"], turn["x-luftpause-class"]) == (
                "alice",
                "interactive",
            )

            b = await c["bob"].ok("spawn", {"task": "bulk", "serviceClass": "interactive"})
            assert (b["serviceClass"], b["classDenied"]) == ("batch", "interactive")
            record = s.spawn_record(b["handle"])
            assert (record["caller"], record["spec"]["serviceClass"]) == ("bob", "batch")
            assert record["classDenied"] == "interactive"
            done = await c["bob"].ok("await", {"handles": [b["handle"]], "timeout": WAIT_S})
            assert done["results"][0]["classDenied"] == "interactive"
            [turn] = s.dataplane.turns_of(b["handle"])
            assert (turn["x-luftpause-caller"], turn["x-luftpause-class"]) == ("bob", "batch")
            quiet = await c["bob"].ok("spawn", {"task": "default class"})
            assert quiet["serviceClass"] == "batch" and "classDenied" not in quiet

            spawns_before = len([r for r in s.journal() if r["t"] == "spawn"])
            text = await c["carol"].refused("spawn", {"task": "x", "serviceClass": "interactive"})
            assert "'carol' may not use the interactive class" in text, text
            assert len([r for r in s.journal() if r["t"] == "spawn"]) == spawns_before
            carol = await c["carol"].ok("spawn", {"task": "x", "serviceClass": "batch"})
            assert s.spawn_record(carol["handle"])["caller"] == "carol"

            mine = await c["token"].ok("spawn", {"task": "token's"})
            record = s.spawn_record(mine["handle"])
            assert (record["caller"], record["owner"]) == ("client:token-client", None)
            child = await c["token"].ok("spawn", {"task": "sub", "parent": a["handle"]})
            record = s.spawn_record(child["handle"])
            assert (record["caller"], record["owner"]) == ("alice", "alice")
            await c["alice"].ok("status", {"handle": child["handle"]})
            text = await c["alice"].refused("spawn", {"task": "x", "parent": b["handle"]})
            assert f"unknown parent handle '{b['handle']}'" in text, text

            same = {"task": "keyed", "serviceClass": "batch", "idempotencyKey": "job-1"}
            handles = {
                who: (await c[who].ok("spawn", same))["handle"] for who in ("alice", "bob", "token")
            }
            assert len(set(handles.values())) == 3
            again = await c["bob"].ok("spawn", same)
            assert again["handle"] == handles["bob"] and again["reused"] is True


async def test_a_caller_sees_only_its_own_runs_and_the_token_sees_all(
    tmp_path: Path, services: Services
) -> None:
    """B13: another caller's run is, to ``await``, ``cancel``, ``approve`` and ``status``,
    a handle that does not exist; ``status`` lists a caller's own runs only; the token
    sees and cancels them all. After a restart (the journal replayed) the runs are still
    their callers'."""
    with stack(tmp_path, services) as s:
        s.start()
        async with clients(s.url, alice=bearer(ALICE), bob=bearer(BOB_1), token=bearer(TOKEN)) as c:
            held = await c["alice"].ok("spawn", {"task": "hold on"})
            handle = held["handle"]
            other = await c["bob"].ok("spawn", {"task": "bob's"})
            unknown = f"unknown handle(s): '{handle}'"
            for tool, arguments in (
                ("await", {"handles": [handle], "timeout": 0.1}),
                ("cancel", {"handle": handle}),
                ("approve", {"handle": handle, "allow": True}),
                ("status", {"handle": handle}),
            ):
                text = await c["bob"].refused(tool, arguments)
                assert unknown in text, (tool, text)
            listed = await c["bob"].ok("status", {})
            assert [r["handle"] for r in listed["runs"]] == [other["handle"]]
            assert {r["handle"] for r in (await c["token"].ok("status", {}))["runs"]} == {
                handle,
                other["handle"],
            }
            assert (await c["alice"].ok("status", {"handle": handle}))["state"] == "Running"
            cancelled = await c["token"].ok("cancel", {"handle": handle})
            assert cancelled["cancelled"] == [handle]
            seen = await c["alice"].ok("await", {"handles": [handle], "timeout": WAIT_S})
            assert seen["results"][0]["state"] == "Cancelled"
        s.stop()
        s.start()
        async with clients(s.url, alice=bearer(ALICE), bob=bearer(BOB_1)) as c:
            text = await c["bob"].refused("status", {"handle": handle})
            assert unknown in text, text
            assert (await c["alice"].ok("status", {"handle": handle}))["state"] == "Cancelled"
            assert [r["handle"] for r in (await c["bob"].ok("status", {}))["runs"]] == [
                other["handle"]
            ]


async def test_a_wrong_key_is_a_401_that_shows_no_key(tmp_path: Path, services: Services) -> None:
    """B13, X2: a key no caller has (bearer or x-api-key), or none, is the services' 401
    on ``/mcp``; ``/status`` takes the token only, not a caller's key. Neither the
    answers nor the runtime's logs (at DEBUG) hold any key or the token."""
    with stack(tmp_path, services) as s:
        s.start()
        async with httpx.AsyncClient(base_url=s.url, timeout=WAIT_S) as http:
            for headers in (bearer(WRONG), {"x-api-key": WRONG}, {}, bearer(ALICE[:-1])):
                response = await http.post("/mcp", json={}, headers=headers)
                assert response.status_code == 401, response.text
                assert response.headers["www-authenticate"] == "Bearer"
                message = response.json()["error"]["message"]
                assert message.startswith("missing or unknown key"), message
                assert not any(k[3:19] in response.text for k in KEYS)
            assert (await http.get("/status", headers=bearer(ALICE))).status_code == 401
            assert (await http.get("/status", headers=bearer(TOKEN))).status_code == 200
        async with clients(s.url, alice=bearer(ALICE)) as c:
            await c["alice"].ok("run", {"task": "hello"})
        s.stop()
        logs = s.logs()
        assert "callers: alice, bob, carol" in logs, logs
        assert not any(k[3:19] in logs for k in KEYS), logs


async def test_a_key_rotated_in_its_file_works_without_a_restart(
    tmp_path: Path, services: Services
) -> None:
    """B13: a new key added to a caller's key file is taken, and the old one removed from
    it refused, by the running runtime (the file is checked every 2 s: polled, bounded)."""
    with stack(tmp_path, services) as s:
        s.start()
        pid = s.runtime.pid if s.runtime else None

        async def accepted(key: str) -> bool:
            async with clients(s.url, bob=bearer(key)) as c:
                reply = await c["bob"].modern("tools/list", {}, caps={})
                assert reply.status in (200, 401), reply
                return reply.status == 200

        async def until_accepted(key: str, want: bool) -> None:
            async with asyncio.timeout(WAIT_S):
                while await accepted(key) is not want:
                    await asyncio.sleep(0.1)

        assert await accepted(BOB_1) and not await accepted(BOB_2)
        s.key_file.write_text(f"{BOB_1}\n{BOB_2}\n")
        await until_accepted(BOB_2, True)
        assert await accepted(BOB_1)
        s.key_file.write_text(f"{BOB_2}\n")
        await until_accepted(BOB_1, False)
        async with clients(s.url, bob=bearer(BOB_2)) as c:
            run = await c["bob"].ok("run", {"task": "rotated"})
        assert s.spawn_record(run["handle"])["caller"] == "bob"
        assert s.runtime is not None and s.runtime.pid == pid and s.runtime.proc.poll() is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"CAROL_KEY": ""}, "caller 'carol': environment variable CAROL_KEY is not set"),
        (
            {"CAROL_KEY": ALICE},
            "callers 'alice' ($ALICE_KEY) and 'carol' ($CAROL_KEY) are given the same key",
        ),
        ({"LUFTPAUSE_TOKEN": ""}, "[[callers]] needs LUFTPAUSE_TOKEN set"),
    ],
)
def test_a_key_that_cannot_be_used_stops_the_start(
    tmp_path: Path, services: Services, change: dict[str, str], says: str
) -> None:
    """B13: a caller's key that cannot be used (unset, shared with another caller) or
    callers without the token stop the start: status 2, a message naming the problem,
    no traceback and no key."""
    with stack(tmp_path, services) as s:
        s.env.update(change)
        with pytest.raises(AssertionError):
            s.start()
        runtime = s.services.started[-1]
        assert runtime.proc.wait(WAIT_S) == 2
        err = runtime.stderr()
        assert says in err and "Traceback" not in err, err
        assert not any(k[3:19] in err for k in KEYS), err
