"""The live status page (S12) in a real browser against a real stack with runs in flight.

Two fake engines (two running requests each), the scheduler, the dataplane, the fake
tool server (``deep_search`` held for 10 minutes, so runs stay paused on it) and the
runtime, all with ``LUFTPAUSE_TOKEN`` set (X2). Run trees are spawned over MCP, and the load
generator keeps own-loop agents cycling through the dataplane so that turns are in
flight and held while the page is looked at. Headless Chromium loads ``/`` and
``/?runtime=…`` and the rendered DOM must show the replicas, held turns, runs and the
run tree with its subtree totals. Each page load leaves a screenshot in the test's
temp dir; a failing test names it. ``LUFTPAUSE_STATUS_SCREENSHOT=PATH`` copies the
run-tree screenshot there (that is how ``docs/assets/status-page.png`` is made).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import httpx2
import pytest
from _browser import Browser, Node, parse, require_chromium
from _serve import ThreadServer
from conftest import Services
from fullstack import Stack, start_stack, write_runtime_config
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from luftpause.procs import ServiceProcess
from luftpause.scheduler.service.page import page_routes

pytestmark = pytest.mark.integration

TOKEN = "page-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALL_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 30.0
DATA = Path(__file__).resolve().parents[1] / "data" / "status"


@dataclass
class Live:
    stack: Stack
    runtime: ServiceProcess
    trees: dict[str, list[str]]  # root handle -> its children's handles
    shots: Path

    @property
    def page(self) -> str:
        return str(self.stack.scheduler.urls["http"]) + "/"

    @property
    def runtime_url(self) -> str:
        return str(self.runtime.urls["http"])

    def runtime_status(self) -> dict[str, Any]:
        r = httpx.get(self.runtime_url + "/status", headers=AUTH, timeout=10)
        r.raise_for_status()
        return dict(r.json())


async def _spawn(c: Client, task: str, **args: Any) -> str:
    result = await c.call_tool("spawn", {"task": task, **args})
    assert not result.is_error, result.content
    return str(json.loads(result.content[0].text)["handle"])  # type: ignore[union-attr]


async def _spawn_trees(mcp_url: str) -> dict[str, list[str]]:
    """Three interactive roots with two children each, and two batch roots. Roots call
    ``deep_search`` (held 10 minutes): they stay in flight while the page is looked at; the
    children make two quick ``lookup`` calls and finish."""
    trees: dict[str, list[str]] = {}
    async with asyncio.timeout(CALL_TIMEOUT_S * 2):
        async with (
            httpx2.AsyncClient(headers=AUTH) as http,
            Client(
                streamable_http_client(mcp_url, http_client=http),
                mode="legacy",
                read_timeout_seconds=CALL_TIMEOUT_S,
            ) as c,
        ):
            search = {"tools": ["deep_search"], "maxToolCalls": 1}
            lookups = {"tools": ["lookup"], "maxToolCalls": 2}
            for i in range(3):
                root = await _spawn(c, f"research question {i}: compare the options", **search)
                trees[root] = [
                    await _spawn(c, f"sub-question {i}.{k}: find sources", parent=root, **lookups)
                    for k in range(2)
                ]
            for i in range(2):
                root = await _spawn(c, f"nightly batch summary {i}", serviceClass="batch", **search)
                trees[root] = []
    return trees


def _wait(check: Any, what: str, timeout: float = SETTLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    return Browser(require_chromium(), tmp_path_factory.mktemp("chromium"))


@pytest.fixture(scope="module")
def live(
    browser: Browser, module_services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("status-page")
    env = {"LUFTPAUSE_TOKEN": TOKEN}
    stack = start_stack(
        module_services,
        tmp,
        engine_args=("--time-scale", "2", "--max-running", "2"),
        dataplane_env=env,
    )
    tools = module_services.start(
        "fake-mcp", "--port", "0", "--deep-search-delay-s", "600", "--lookup-delay-s", "0.05"
    )
    config = write_runtime_config(tmp, stack.dataplane.urls["http"], tools.urls["http"])
    runtime = module_services.start("runtime", "--config", str(config), "--port", "0", env=env)
    trees = asyncio.run(_spawn_trees(runtime.urls["http"] + "/mcp"))
    load = _start_load(stack, tools, tmp)
    try:
        live = Live(stack, runtime, trees, tmp)

        def busy() -> bool:
            if load.poll() is not None:
                raise AssertionError(f"the load generator exited: {load.returncode}")
            status = asyncio.run(stack.status())
            paused = status["runs"].get("paused_on_tool", {})
            runs = {n["handle"]: n["state"] for n in _flatten(live.runtime_status()["tree"])}
            kids = [k for ks in trees.values() for k in ks]
            return (
                paused.get("interactive", 0) >= 3
                and status["in_flight_total"] > 0
                and all(runs.get(k) == "Completed" for k in kids)
            )

        _wait(busy, "roots paused on deep_search, children done, turns in flight")
        yield live
    finally:
        load.terminate()
        try:
            load.wait(timeout=10)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait(timeout=10)


def _start_load(stack: Stack, tools: ServiceProcess, tmp: Path) -> subprocess.Popen[bytes]:
    """Own-loop agents through the dataplane for longer than the module runs (stopped by
    PID at its end): 10 batch agents of caller "crowd", 4 interactive of "alice"."""
    log = (tmp / "loadgen.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "luftpause",
            "loadgen",
            "--target",
            stack.base_url,
            "--token",
            TOKEN,
            "--group",
            "10:batch:crowd",
            "--group",
            "4:interactive:alice",
            "--tools-url",
            f"{tools.urls['http']}/mcp",
            "--context-chars",
            "4000",
            "--duration-s",
            "300",
            "--quiet",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _load(
    browser: Browser,
    request: pytest.FixtureRequest,
    shots: Path,
    url: str,
    name: str,
    size: tuple[int, int] = (1400, 1000),
) -> Node:
    """The page's DOM after 2+ polls, and a screenshot of it named on failure."""
    started = time.monotonic()
    dom = browser.dump_dom(url)
    shot = browser.screenshot(url, shots / f"{name}.png", size)
    request.node.user_properties.append(("screenshot", str(shot)))
    request.node.add_report_section("call", "screenshot", f"{name}: {shot}")
    (shots / f"{name}.html").write_text(dom)
    print(f"{name}: DOM and screenshot in {time.monotonic() - started:.1f} s -> {shot}")
    return parse(dom)


def _rows(dom: Node, table: str) -> list[Node]:
    body = dom.by_id(table).find_all(lambda n: n.tag == "tbody")[0]
    return [n for n in body.children if isinstance(n, Node) and n.tag == "tr"]


def test_page_shows_replicas_held_turns_and_runs(
    live: Live, browser: Browser, request: pytest.FixtureRequest
) -> None:
    """S12: ``GET /`` renders every replica (in flight vs cap, engine queue, health),
    held turns and runs by phase and class, with no error banner."""
    dom = _load(browser, request, live.shots, live.page, "scheduler")
    assert dom.by_id("banner").hidden, dom.by_id("banner").text()
    replicas = {r.attrs["data-replica"]: r.cells() for r in _rows(dom, "replicas")}
    assert set(replicas) == {"engine-a", "engine-b"}
    for cells in replicas.values():
        assert cells[2] == "healthy"
        assert "/" in cells[3]  # in flight / cap
        assert cells[9] == "–" or cells[9][0].isdigit()  # the interactive target's batch limit
        assert cells[10].endswith("ago")  # probed
    phases = {r.attrs["data-phase"]: r.cells() for r in _rows(dom, "runs")}
    assert "paused_on_tool" in phases, phases
    # 3 interactive and 2 batch roots wait on deep_search; the load generator's runs come
    # and go on top.
    interactive, batch, total = map(int, phases["paused_on_tool"][1:])
    assert interactive >= 3 and batch >= 2 and total == interactive + batch, phases
    runs_total = int(dom.by_id("runs-total").text())
    assert runs_total >= 5
    cards = {c.attrs["data-card"]: c.text() for c in dom.with_attr("data-card")}
    assert cards["runs"] == f"{runs_total}runs"
    # B7: the stack's interactive target (the default 100 ms pace) and its batch cost
    (label,) = [c for c in cards if c.startswith("interactive target")]
    assert label == "interactive target 100ms: batch slots withheld"
    assert cards[label].removesuffix(label).isdigit()
    for row in _rows(dom, "held"):  # racy: what is held changes every few milliseconds
        if "data-caller" not in row.attrs:
            assert row.text() == "no turns held"
            continue
        assert row.attrs["data-held-class"] in {"interactive", "batch"}
        cls, caller, held, oldest = row.cells()
        assert (cls, caller) == (row.attrs["data-held-class"], row.attrs["data-caller"])
        assert int(held) >= 1 and oldest[0].isdigit()
    assert dom.by_id("runtime").hidden  # no ?runtime=


def test_page_shows_the_run_tree_with_subtree_totals(
    live: Live, browser: Browser, request: pytest.FixtureRequest
) -> None:
    """S12, R9, X2: ``/?runtime=…`` with the token (given in the fragment) renders the
    runtime's run tree: each run under its parent, its own work and its subtree totals."""
    url = f"{live.page}?runtime={quote(live.runtime_url, safe=':/')}#token={TOKEN}"
    dom = _load(browser, request, live.shots, url, "run-tree", (1400, 1120))
    keep = os.environ.get("LUFTPAUSE_STATUS_SCREENSHOT")
    if keep:
        shutil.copyfile(live.shots / "run-tree.png", keep)
    assert dom.by_id("banner").hidden, dom.by_id("banner").text()
    assert not dom.by_id("runtime").hidden
    assert dom.by_id("runtime-banner").hidden, dom.by_id("runtime-banner").text()
    rows = {r.attrs["data-run"]: r for r in _rows(dom, "run-tree") if "data-run" in r.attrs}
    expected = {h for root, kids in live.trees.items() for h in (root, *kids)}
    assert expected <= set(rows), (expected - set(rows), dom.by_id("run-tree").text())
    truth = {n["handle"]: n for n in _flatten(live.runtime_status()["tree"])}
    for root, kids in live.trees.items():
        assert rows[root].attrs["data-depth"] == "0"
        for kid in kids:
            assert rows[kid].attrs["data-parent"] == root
            assert rows[kid].attrs["data-depth"] == "1"
        # run, state, class, own x6 (turns, tool calls, failed, tokens, turn t, tool t),
        # subtree x6, task
        cells = rows[root].cells()
        assert len(cells) == 16, cells
        assert cells[:3] == [root, "Running", truth[root]["serviceClass"]]
        assert cells[15].startswith(("research question", "nightly batch"))
        own, sub = cells[3:9], cells[9:15]
        assert own[0] == "1" and own[1] == "0"  # one turn, deep_search still running
        kid_cells = [rows[k].cells() for k in kids]
        assert int(sub[0]) == 1 + sum(int(k[3]) for k in kid_cells)  # turns
        assert int(sub[1]) == 2 * len(kids) == sum(int(k[4]) for k in kid_cells)  # tool calls
        assert sub[2] == "0"
        for k in kid_cells:
            assert k[1] == "Completed" and k[3:9] == k[9:15]  # a leaf: own == subtree
    counts = dom.by_id("runtime-counts").text()
    assert counts.startswith(f"{len(expected)} runs"), counts


def test_page_without_the_token_asks_for_it(
    live: Live, browser: Browser, request: pytest.FixtureRequest
) -> None:
    """X2: the runtime refuses the tree without the token; the page says so and shows the
    token form instead of a blank table. The scheduler's numbers still show."""
    url = f"{live.page}?runtime={quote(live.runtime_url, safe=':/')}"
    dom = _load(browser, request, live.shots, url, "no-token")
    problem = dom.by_id("runtime-banner")
    assert not problem.hidden and "token" in problem.text(), problem.text()
    assert not dom.by_id("token-form").hidden
    assert len(_rows(dom, "replicas")) == 2
    assert not [r for r in _rows(dom, "run-tree") if "data-run" in r.attrs]


class _GoneAfterOneAnswer:
    """The page's routes and a ``/status`` that answers once (canned JSON), then 503 while
    the server shuts down: the scheduler goes away under an open page."""

    def __init__(self) -> None:
        self.answered = 0
        routes = [Route("/status", self.status), *page_routes()]
        self.server = ThreadServer(Starlette(routes=routes))

    async def status(self, _: Request) -> Response:
        self.answered += 1
        if self.answered > 1:
            self.server.server.should_exit = True
            return JSONResponse({"error": "going away"}, 503)
        return JSONResponse(json.loads((DATA / "scheduler.json").read_text()))


def test_page_keeps_the_last_numbers_under_a_banner_when_status_fails(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """S12: when ``/status`` stops answering, a banner says so (and that it retries) above
    the last numbers, which stay on the page: never a blank page. (Its numbers also
    show a replica's lapsed runs beside its pinned ones, and its run limit.)"""
    doms = []
    for what in ("dom", "screenshot"):
        gone = _GoneAfterOneAnswer()
        with gone.server:
            if what == "dom":
                doms.append(browser.dump_dom(gone.server.url + "/"))
            else:
                shot = browser.screenshot(gone.server.url + "/", tmp_path / "gone.png")
                request.node.add_report_section("call", "screenshot", str(shot))
        assert gone.answered >= 2
    dom = parse(doms[0])
    banner = dom.by_id("banner")
    assert not banner.hidden
    text = banner.text()
    assert text.startswith("scheduler status"), text
    assert "retrying every 2 s" in text and "numbers below are from" in text, text
    assert "stale" in dom.find_all(lambda n: n.tag == "body")[0].attrs.get("class", "")
    rows = _rows(dom, "replicas")
    replicas = [r.attrs["data-replica"] for r in rows]
    assert replicas == ["engine-a", "engine-b", "classifier"]
    # tool leases: runs paused past their lease are shown beside the pinned ones
    cells = [c for c in rows[0].children if isinstance(c, Node) and c.tag == "td"]
    assert any(c.text() == "7 (+2 lapsed)" for c in cells), [c.text() for c in cells]
    assert any("run limit 8" in c.attrs.get("title", "") for c in cells)


def _flatten(nodes: list[Any]) -> Iterator[dict[str, Any]]:
    for n in nodes:
        if isinstance(n, dict):
            yield n
            yield from _flatten(n.get("children", []))


def test_page_groups_a_harness_sessions_sub_agents_under_it(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """S12, R9 (#38): a session node of the runtime's tree is a row of its own, naming the
    harness's run, with the runs it spawned (and their children) under it."""
    tree = json.loads((DATA / "runtime.json").read_text())
    root = tree["tree"].pop(0)
    session = {"session": "claude-code-s1@m", "runs": 1, "subtree": root["subtree"]}
    tree["tree"].insert(0, {**session, "children": [root]})

    async def runtime_status(_: Request) -> Response:
        return JSONResponse(tree)

    async def status(_: Request) -> Response:
        return JSONResponse(json.loads((DATA / "scheduler.json").read_text()))

    routes = [
        Route("/status", status),
        Route("/ui/runtime-status", runtime_status),
        *page_routes(),
    ]
    with ThreadServer(Starlette(routes=routes)) as server:
        dom = parse(browser.dump_dom(f"{server.url}/?runtime=http://127.0.0.1:7000"))
    rows = _rows(dom, "run-tree")
    keys = [r.attrs.get("data-session") or r.attrs.get("data-run") for r in rows]
    assert keys[:5] == ["claude-code-s1@m", "run-root", "run-kid-1", "run-kid-2", "run-batch"]
    head = rows[0]
    assert "session claude-code-s1@m" in head.text() and "1 sub-agent run(s)" in head.text()
    assert rows[1].attrs["data-depth"] == "1" and rows[2].attrs["data-depth"] == "2"
