"""The status page's routes and ``luftpause status`` against a real scheduler status app
(S12, X2): the page and its assets, the runtime tree fetched through the scheduler (and
what that fetch refuses), and the CLI's picture, token handling and errors.

The scheduler state is built with the pure core (``decide``) and served by the real
``status_app`` on a loopback socket; a stand-in runtime serves the canned run tree
behind a bearer token.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import ThreadServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from luftpause import status_cli
from luftpause.scheduler.core import (
    EndpointKind,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    ServiceClass,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    decide,
    initial_state,
)
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.page import CSP, RuntimeFetcher
from luftpause.scheduler.service.status_http import status_app

DATA = Path(__file__).resolve().parents[1] / "data" / "status"
TOKEN = "s3cret"
SPECS = (
    ReplicaSpec("engine-a", EndpointKind.GENERATIVE, frozenset({"m"})),
    ReplicaSpec("engine-b", EndpointKind.GENERATIVE, frozenset({"m"})),
)


def busy_host() -> Host:
    """Both replicas capped at 1 (their engines queue). Two batch turns are admitted;
    when one pauses on a tool, alice's held interactive turn takes its slot; then a
    batch turn of crowd and another interactive one of alice are held."""
    state = initial_state(SPECS, Params(queue_probes=1), 0.0)
    events: list[Any] = [
        ReplicaProbed(at=0.0, replica="engine-a", healthy=True, running=1, waiting=2),
        ReplicaProbed(at=0.0, replica="engine-b", healthy=True, running=1, waiting=2),
        TurnRequested(at=1.0, turn_id="t1", run_id="r1", model="m", caller="crowd"),
        TurnRequested(at=1.0, turn_id="t2", run_id="r2", model="m", caller="crowd"),
        TurnStarted(at=1.1, turn_id="t1"),
        TurnStarted(at=1.1, turn_id="t2"),
        TurnRequested(
            at=2.0,
            turn_id="t3",
            run_id="r3",
            model="m",
            caller="alice",
            service_class=ServiceClass.INTERACTIVE,
        ),
        TurnRequested(at=2.5, turn_id="t4", run_id="r4", model="m", caller="crowd"),
        TurnFinished(at=3.0, turn_id="t1", paused_on_tool=True),
        TurnRequested(
            at=3.5,
            turn_id="t5",
            run_id="r5",
            model="m",
            caller="alice",
            service_class=ServiceClass.INTERACTIVE,
        ),
    ]
    for event in events:
        state, _ = decide(state, event)
    assert set(state.held) == {"t4", "t5"}, state.held
    return Host(state, lambda: 4.0)


class StandinRuntime:
    """``GET /status`` like the runtime's: the canned tree behind ``Bearer s3cret``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.body = json.loads((DATA / "runtime.json").read_text())
        self.server = ThreadServer(Starlette(routes=[Route("/status", self.status)]))

    async def status(self, request: Request) -> Response:
        self.seen.append(dict(request.headers))
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": {"message": "missing or wrong bearer token"}}, 401)
        return JSONResponse(self.body)


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    host = busy_host()
    app = status_app(
        host,
        host.clock,
        lambda: {"grpc_port": 5000, "uptime_s": 12.0},
        runtimes=["http://runtime.invalid:7000"],
    )
    with ThreadServer(app) as server:
        yield server.url


@pytest.fixture(scope="module")
def runtime() -> Iterator[StandinRuntime]:
    rt = StandinRuntime()
    with rt.server:
        yield rt


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the page ------------------------------------------------------------------------------


def test_page_and_assets_are_served_with_a_strict_policy(scheduler: str) -> None:
    """S12: ``GET /`` is plain HTML whose script and style come from this server (no CDN,
    no build step) under a CSP that lets it fetch only its own origin."""
    page = httpx.get(scheduler + "/", timeout=5)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "connect-src 'self'" in CSP and "script-src 'self'" in CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    html = page.text
    assert '<script src="/ui/status.js" defer></script>' in html
    assert '<link rel="stylesheet" href="/ui/status.css">' in html
    for attr in ("src=", "href="):
        for chunk in html.split(attr)[1:]:
            assert chunk.lstrip('"').startswith("/"), f"external {attr}{chunk[:40]}"
    for ident in ("replicas", "held", "runs", "run-tree", "banner", "token-form"):
        assert f'id="{ident}"' in html
    js = httpx.get(scheduler + "/ui/status.js", timeout=5)
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "POLL_MS = 2000" in js.text and 'getJson("/status")' in js.text
    assert "innerHTML" not in js.text  # every value goes in as text
    css = httpx.get(scheduler + "/ui/status.css", timeout=5)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "@import" not in css.text and "url(" not in css.text


def test_status_json_is_unchanged_next_to_the_page(scheduler: str) -> None:
    """S12: the page reads the same ``/status`` as everyone else."""
    body = httpx.get(scheduler + "/status", timeout=5).json()
    assert body["held"]["interactive"]["alice"]["held"] == 1
    assert body["held"]["batch"]["crowd"]["held"] == 1
    assert body["runs"] == {
        "generating": {"batch": 1, "interactive": 1},
        "idle": {"batch": 1, "interactive": 1},
        "paused_on_tool": {"batch": 1},
    }
    assert {r["name"]: r["capacity"] for r in body["replicas"]} == {"engine-a": 1, "engine-b": 1}


def test_one_run_s_status_by_its_id(scheduler: str) -> None:
    """S12, B4: ``/status/runs/{id}`` shows one run (a harness session is one run: this
    is where its user finds it); an unknown run is a 404 naming it."""
    body = httpx.get(scheduler + "/status/runs/r1", timeout=5).json()
    assert body["run_id"] == "r1" and body["phase"] == "paused_on_tool"
    assert body["turns"] == 1 and body["moves"] == 0 and body["caller"] == "crowd"
    assert body["replica"] in ("engine-a", "engine-b")
    missing = httpx.get(scheduler + "/status/runs/nobody", timeout=5)
    assert missing.status_code == 404 and "nobody" in missing.json()["error"]["message"]


# ---- the runtime tree through the scheduler ------------------------------------------------


def runtime_status(scheduler: str, url: str, **headers: str) -> httpx.Response:
    return httpx.get(
        scheduler + "/ui/runtime-status", params={"url": url}, headers=headers, timeout=10
    )


def test_runtime_tree_comes_through_with_the_callers_token_only(
    scheduler: str, runtime: StandinRuntime
) -> None:
    """X2: the scheduler forwards the caller's Authorization header, nothing else, and adds
    no credential: without the token the runtime refuses, and the page hears why."""
    none = runtime_status(scheduler, runtime.server.url)
    assert none.status_code == 401 and "needs a token" in none.json()["error"]
    wrong = runtime_status(scheduler, runtime.server.url, Authorization="Bearer nope")
    assert wrong.status_code == 401 and "refused the token" in wrong.json()["error"]
    ok = runtime_status(
        scheduler,
        runtime.server.url + "/",
        Authorization=f"Bearer {TOKEN}",
        Cookie="session=abc",
        **{"X-Extra": "1"},
    )
    assert ok.status_code == 200 and ok.json() == runtime.body
    assert ok.headers["cache-control"] == "no-store"
    last = runtime.seen[-1]
    assert last["authorization"] == f"Bearer {TOKEN}"
    assert "cookie" not in last and "x-extra" not in last
    assert "authorization" not in runtime.seen[0]


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        ("http://10.1.2.3:7000", 403, "not a runtime this scheduler may fetch from"),
        ("http://example.com:7000", 403, "not a runtime this scheduler may fetch from"),
        ("http://127.0.0.1:7000/admin", 400, "base URL"),
        ("http://127.0.0.1:7000/?x=1", 400, "base URL"),
        ("http://user:pw@127.0.0.1:7000", 400, "user info"),
        ("file:///etc/passwd", 400, "http(s)://host:port"),
        ("http://127.0.0.1:99999", 400, "not a URL"),
        ("", 400, "missing ?url="),
    ],
)
def test_runtime_fetch_is_not_an_open_proxy(scheduler: str, url: str, code: int, says: str) -> None:
    """Only ``http(s)://host:port`` of a loopback host or a configured runtime; the path is
    always ``/status``."""
    r = runtime_status(scheduler, url)
    assert r.status_code == code and says in r.json()["error"], r.text


def test_runtime_fetch_relays_only_a_runtimes_status(scheduler: str) -> None:
    """Another loopback service's ``/status`` (here the scheduler's own) is not relayed;
    a closed port is a one-line 502."""
    other = runtime_status(scheduler, scheduler)
    assert other.status_code == 502 and "not a luftpause runtime" in other.json()["error"]
    gone = runtime_status(scheduler, f"http://127.0.0.1:{closed_port()}")
    assert gone.status_code == 502 and "cannot reach the runtime" in gone.json()["error"]


def test_configured_runtimes_are_allowed_besides_loopback() -> None:
    fetcher = RuntimeFetcher(["http://runtime:7000/", "https://rt.example.org"])
    assert fetcher.target("http://runtime:7000") == "http://runtime:7000/status"
    assert fetcher.target("https://RT.example.org/") == "https://rt.example.org:443/status"
    assert fetcher.target("http://localhost:7000") == "http://localhost:7000/status"
    assert fetcher.target("http://[::1]:7000") == "http://[::1]:7000/status"
    assert fetcher.target("http://127.0.0.2:1") == "http://127.0.0.2:1/status"
    for refused in ("http://runtime:7001", "https://runtime:7000", "http://rt.example.org"):
        with pytest.raises(ValueError, match="may fetch from"):
            fetcher.target(refused)


# ---- luftpause status ----------------------------------------------------------------------


def cli_args(**kw: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    status_cli.add_arguments(parser)
    args = parser.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_cli_prints_the_schedulers_picture(
    scheduler: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """S12: replicas with in flight vs cap and engine queue, held turns by class and caller
    with the oldest wait, runs by phase and class."""
    monkeypatch.delenv("LUFTPAUSE_TOKEN", raising=False)
    assert status_cli.main(cli_args(scheduler=scheduler.removeprefix("http://"))) == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert lines[0] == f"luftpause status - scheduler {scheduler} - up 12.0s"
    assert lines[1] == "turns in flight 2 - held 2 - runs 5 - replicas healthy 2/2"
    a = next(ln for ln in lines if ln.startswith("engine-a"))
    assert a.split()[:7] == ["engine-a", "generative", "healthy", "1/1", "[########]", "1", "2"]
    held = lines[lines.index("HELD TURNS (2)") + 1 :][:3]
    assert [h.split() for h in held] == [
        ["CLASS", "CALLER", "HELD", "OLDEST", "WAIT"],
        ["interactive", "alice", "1", "500ms"],
        ["batch", "crowd", "1", "1.5s"],
    ]
    runs = lines[lines.index("RUNS (5)") + 1 :][:4]
    assert [r.split() for r in runs] == [
        ["PHASE", "INTERACTIVE", "BATCH", "TOTAL"],
        ["generating", "1", "1", "2"],
        ["idle", "1", "1", "2"],
        ["paused", "on", "tool", "0", "1", "1"],
    ]
    assert lines[-1] == "callers in flight: alice 1, crowd 1"


def test_cli_shows_the_run_tree_with_the_token_from_the_environment(
    scheduler: str,
    runtime: StandinRuntime,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R9, X2: ``--runtime`` adds the tree (own / subtree per run, children under their
    parent); the token defaults to LUFTPAUSE_TOKEN, read by the command only."""
    monkeypatch.setenv("LUFTPAUSE_TOKEN", TOKEN)
    args = cli_args(scheduler=scheduler, runtime=runtime.server.url + "/mcp")
    assert status_cli.main(args) == 0
    out = capsys.readouterr().out
    tree = out[out.index("RUN TREE") :].splitlines()
    assert tree[0] == f"RUN TREE - runtime {runtime.server.url} - 4 runs: Running 3, Completed 1"
    assert tree[1].split()[:3] == ["RUN", "STATE", "CLASS"]
    root = tree[2].split()
    assert root[:9] == [
        "run-root", "Running", "interactive", "2/5", "1/3", "0/1", "360/12.4k", "400ms/1.2s",
        "3.0s/1m16s",
    ]  # fmt: skip
    assert tree[3].startswith("|- run-kid-1  Completed")
    assert tree[4].startswith("`- run-kid-2  Running (approval)")
    assert "<b>not bold</b>" in tree[4]
    assert tree[5].startswith("run-batch")


@pytest.mark.parametrize(
    ("token", "says"),
    [("", "needs a token: pass --token or set LUFTPAUSE_TOKEN"), ("nope", "refused the token")],
)
def test_cli_token_problems_are_one_line_and_exit_2(
    scheduler: str,
    runtime: StandinRuntime,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token: str,
    says: str,
) -> None:
    """The scheduler's part still prints; the runtime's problem goes to stderr, status 2."""
    monkeypatch.setenv("LUFTPAUSE_TOKEN", TOKEN)  # --token wins, '' included
    args = cli_args(scheduler=scheduler, runtime=runtime.server.url, token=token)
    assert status_cli.main(args) == 2
    out = capsys.readouterr()
    assert "REPLICAS" in out.out and "RUN TREE" not in out.out
    assert out.err == f"luftpause status: the runtime at {runtime.server.url} {says}\n"


def test_cli_without_a_scheduler_is_a_clear_error_with_status_2() -> None:
    """A process, as a user runs it: one line on stderr, exit status 2, no traceback."""
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "luftpause", "status", "--scheduler", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"luftpause status: cannot reach the scheduler at {url}: Connection refused "
        "(is it running? `luftpause up` starts the stack)"
    ]
    assert time.monotonic() - started < 30


def test_cli_watch_redraws_and_keeps_going_through_errors(
    scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--watch``: a frame per period; a source that fails shows as an error line in the
    frame, and the next frame tries again."""
    sleeps: list[float] = []
    gone = f"http://127.0.0.1:{closed_port()}"
    with httpx.Client(timeout=5) as client:
        urls = iter([scheduler, gone, scheduler])

        def frame() -> str:
            url = next(urls)
            snap = status_cli.take(client, url, None, None)
            return status_cli.render(snap.status, url, errors=snap.errors)

        assert status_cli.watch(frame, 2.0, sys.stdout, sleeps.append, frames=3) == 0
    out = capsys.readouterr().out
    frames = out.split("Ctrl-C to quit\n")[:-1]
    assert len(frames) == 3 and len(sleeps) == 2
    assert all(0 <= s <= 2.0 for s in sleeps)
    assert frames[0].startswith("luftpause status - scheduler")
    assert frames[1].startswith(f"error: cannot reach the scheduler at {gone}")
    assert "REPLICAS" not in frames[1] and "REPLICAS" in frames[2]
    assert "\x1b[2J" not in out  # not a terminal: no screen clearing
