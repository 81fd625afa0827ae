"""R8, R11, R15: the runtime in process - approvals and rounds across a restart.

The dataplane is an ``httpx.MockTransport`` that scripts the model; the tool hub
is replaced by one destructive tool whose calls are counted and can be held
open, so a "crash" (shutdown without ending the run) can happen mid-round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _runtime_fakes import Hub, runtime, until

from luftpause.runtime.core import RunState
from luftpause.runtime.loop import DECLINED
from luftpause.runtime.spawn_args import SpawnArgs


async def test_answered_approvals_are_not_asked_again_open_ones_are(tmp_path: Path) -> None:
    """R11, R8: an approval answered before a crash is reused; an open one is asked again;
    a complete round is not executed again; a declined call reaches the model as such."""
    hub = Hub()
    rt, records = runtime(tmp_path, hub)
    rt.recover(records)
    run = await rt.spawn(SpawnArgs(task="clean up", tools=["rm"]), caller="test")
    await until(lambda: run.pending is not None, "first approval")
    assert run.state is RunState.AWAITING_APPROVAL
    assert run.pending is not None and run.pending.to_json() == {
        "tool": "rm",
        "arguments": {"path": "/a"},
    }
    await rt.decide_approval(run, True)
    await until(lambda: run.pending is not None and run.pending.key == "1:0", "second approval")
    assert hub.calls == [{"path": "/a"}]
    hub.gate.clear()  # the next allowed call hangs: the crash comes mid-round
    await rt.decide_approval(run, True)
    await until(lambda: run.state is RunState.RUNNING, "round in flight")
    await rt.shutdown()  # "crash": the run is not ended
    assert not run.done

    hub2 = Hub()
    rt2, records2 = runtime(tmp_path, hub2)
    resumed = rt2.recover(records2)
    assert [r.id for r in resumed] == [run.id]
    again = rt2.state.runs[run.id]
    assert again.approvals == {"0:0": True, "1:0": True}
    await until(lambda: again.done, "resumed run")
    assert again.state is RunState.COMPLETED and again.result == "all done"
    assert hub2.calls == [{"path": "/b"}]  # round 0 complete: not again; round 1 redone
    assert again.pending is None and again.own.tool_calls == 2 and again.own.turns == 3
    await rt2.shutdown()

    # An open approval at the crash is asked again after the restart; decline it.
    hub3 = Hub()
    rt3, records3 = runtime(tmp_path / "second", hub3)
    rt3.recover(records3)
    run3 = await rt3.spawn(SpawnArgs(task="again", tools=["rm"]), caller="test")
    await until(lambda: run3.pending is not None, "approval")
    await rt3.shutdown()
    rt4, records4 = runtime(tmp_path / "second", Hub())
    rt4.recover(records4)
    run4 = rt4.state.runs[run3.id]
    await until(lambda: run4.pending is not None, "asked again")
    assert run4.pending is not None and run4.pending.key == "0:0"
    await rt4.decide_approval(run4, False)
    await until(lambda: run4.pending is not None and run4.pending.key == "1:0", "second call")
    await rt4.decide_approval(run4, False)
    await until(lambda: run4.done, "end")
    assert run4.own.failed_tool_calls == 2 and run4.state is RunState.COMPLETED
    assert run4.results[0][0]["content"] == DECLINED
    await rt4.shutdown()


async def test_recovering_twice_does_no_harm(tmp_path: Path) -> None:
    """R8: two recoveries in a row (no progress between) give the same runs and journal."""
    hub = Hub()
    rt, records = runtime(tmp_path, hub)
    rt.recover(records)
    run = await rt.spawn(SpawnArgs(task="x", tools=["rm"]), caller="test")
    await until(lambda: run.pending is not None, "approval")
    await rt.shutdown()
    size = (tmp_path / "runs.jsonl").stat().st_size
    states = []
    for _ in range(2):
        rt_n, recs = runtime(tmp_path, Hub())
        rt_n.recover(recs)
        again = rt_n.state.runs[run.id]
        states.append((again.state, again.turns, again.approvals, again.own.to_json()))
        await until(lambda again=again: again.pending is not None, "asked")  # type: ignore[misc]
        await rt_n.shutdown()
    assert states[0] == states[1]
    assert (tmp_path / "runs.jsonl").stat().st_size == size


async def test_an_unreadable_record_fails_its_run_and_the_rest_recover(
    tmp_path: Path, caplog: Any
) -> None:
    """R8: a journal line that is not a record (here an incomplete spawn) fails the run it
    names, with the line and the reason; every other run resumes and finishes; start-up
    logs the problem and ``GET /status`` lists it."""
    from luftpause.runtime.status import status_tree

    hub = Hub()
    rt, lines = runtime(tmp_path, hub)
    rt.recover(lines)
    good = await rt.spawn(SpawnArgs(task="x", tools=["rm"]), caller="test")
    await rt.shutdown()  # "crash" before it could run far
    with (tmp_path / "runs.jsonl").open("a") as f:
        f.write('{"t":"spawn","run":"run-broken"}\n')
    rt2, lines2 = runtime(tmp_path, Hub())
    with caplog.at_level("ERROR"):
        rt2.recover(lines2)
    assert "run run-broken marked Failed" in caplog.text
    broken = rt2.state.runs["run-broken"]
    assert broken.state is RunState.FAILED
    assert broken.error is not None and "missing field 'spec'" in broken.error
    again = rt2.state.runs[good.id]
    for _ in range(2):  # both of its tool calls need approval
        await until(lambda: again.pending is not None, "the good run resumed")
        await rt2.decide_approval(again, True)
    await until(lambda: again.done, "the good run")
    assert again.state is RunState.COMPLETED
    problems = status_tree(rt2)["journal"]["problems"]
    assert len(problems) == 1 and "line" in problems[0] and "run-broken" in problems[0]
    await rt2.shutdown()


async def test_status_lists_the_problems_of_both_journals(tmp_path: Path) -> None:
    """R8, R9, R12: ``GET /status`` lists the unreadable lines of ``tasks.jsonl`` beside
    those of ``runs.jsonl``, in the same shape: the file, then ``line N: what (effect)``."""
    import httpx
    from starlette.applications import Starlette

    from luftpause.runtime.server import build_app

    (tmp_path / "runs.jsonl").write_text('{"t":"spawn","run":"run-broken"}\n')
    (tmp_path / "tasks.jsonl").write_text('\n{"v": 1, "task": {"tool": "run"}}\n[]\n')
    rt, lines = runtime(tmp_path, Hub())

    async def on_start() -> None:
        rt.recover(lines)

    async def on_stop() -> None:
        await rt.shutdown()

    app = build_app(rt, host="127.0.0.1", token=None, on_start=on_start, on_stop=on_stop)
    inner: Any = app
    while not isinstance(inner, Starlette):  # below the auth and header middleware
        inner = inner.app
    async with inner.router.lifespan_context(inner):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            status = (await http.get("/status")).json()
    assert status["journal"]["path"] == str(tmp_path / "runs.jsonl")
    [journal_problem] = status["journal"]["problems"]
    assert journal_problem.startswith("line 1: spawn record: missing field 'spec'")
    assert status["tasks"] == {
        "path": str(tmp_path / "tasks.jsonl"),
        "problems": [
            "line 2: missing field 'status' (skipped; no task restored from it)",
            "line 3: not a version-1 task record (skipped; no task restored from it)",
        ],
    }
