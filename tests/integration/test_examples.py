"""X4: the own-loop agents in ``examples/`` (the ``openai`` package, the OpenAI Agents
SDK, LangGraph) run against a real stack: two fake engines, the scheduler and the
dataplane as processes on loopback, each example as a subprocess the way a user
runs it.

What the scheduler saw comes from its own ``admit`` spans (X1), exported over OTLP
to a receiver in this process: one per turn, naming the run, its class, its caller
and the replica it was admitted to.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _otlp_receiver import OtlpReceiver, ReceivedSpan
from fullstack import Stack, eventually, start_stack

pytestmark = pytest.mark.integration

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = ("openai_agent", "agents_sdk_agent", "langgraph_agent")
TOOL_RESULTS = 2  # the fake engines call a tool until a run holds this many results
RUN_TIMEOUT_S = 90.0
TOKEN = "example-test-token"
TOOL_LINE = re.compile(r"^tool get_weather\((.*)\) -> (.*)$")


@dataclass(frozen=True)
class Finished:
    rc: int
    stdout: str
    stderr: str

    def lines(self) -> list[str]:
        return self.stdout.splitlines()


async def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> Finished:
    """``python examples/<name>.py ARGS`` with a clean environment, bounded in time."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LUFTPAUSE_", "OTEL_", "OPENAI_", "LANGSMITH_", "LANGCHAIN_"))
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES_DIR / f"{name}.py"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean, **(env or {})},
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{name} did not finish within {RUN_TIMEOUT_S} s") from None
    assert proc.returncode is not None
    return Finished(proc.returncode, out.decode(), err.decode())


def start_example_stack(services: Any, tmp: Path, env: dict[str, str]) -> Stack:
    return start_stack(
        services,
        tmp,
        engine_args=("--time-scale", "50", "--tool-results", str(TOOL_RESULTS)),
        dataplane_env=env,
        scheduler_env=env,
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def stack(
    module_services: Any, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Stack:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    return start_example_stack(module_services, tmp_path_factory.mktemp("examples"), env)


@pytest.fixture(scope="module")
def token_stack(module_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return start_example_stack(
        module_services, tmp_path_factory.mktemp("examples-token"), {"LUFTPAUSE_TOKEN": TOKEN}
    )


def admits_of(receiver: OtlpReceiver, run_id: str) -> list[ReceivedSpan]:
    spans = list(receiver.spans)  # a copy: the receiver's thread appends to it
    return [s for s in spans if s.name == "admit" and s.attributes["luftpause.run_id"] == run_id]


def assert_answered(done: Finished, run_id: str) -> list[tuple[str, str]]:
    """The run ended well: tool calls run here, then an answer. Returns (arguments, result)
    of each tool call."""
    assert done.rc == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.lines()
    assert lines[0].startswith(f"run {run_id} "), lines[0]
    tools = [(m.group(1), m.group(2)) for m in map(TOOL_LINE.match, lines) if m]
    assert len(tools) == TOOL_RESULTS, done.stdout
    for arguments, result in tools:  # the local tool answered with the city it was given
        city = re.fullmatch(r'\{"city": "(.*)"\}', arguments)
        assert city is not None and result.startswith(f"{city.group(1)}: "), (arguments, result)
    [answer] = [line for line in lines if line.startswith("answer: ")]
    assert answer.removeprefix("answer: ").strip(), "the final answer is empty"
    assert lines[-1] == f"run {run_id}: answered after {TOOL_RESULTS} tool calls"
    return tools


@pytest.mark.parametrize(
    ("example", "flags", "service_class", "caller"),
    [
        ("openai_agent", ("--class", "interactive", "--caller", "alice"), "interactive", "alice"),
        ("agents_sdk_agent", ("--class", "batch", "--caller", "bob"), "batch", "bob"),
        ("langgraph_agent", (), "interactive", "langgraph-agent"),  # the defaults
    ],
)
async def test_example_runs_one_run_on_one_replica(
    stack: Stack,
    receiver: OtlpReceiver,
    example: str,
    flags: tuple[str, ...],
    service_class: str,
    caller: str,
) -> None:
    """X4, D2, D3, S3: the example answers after running its tool, and the scheduler saw
    every turn under the given run ID, class and caller, all admitted to one replica."""
    run_id = f"example-{example}"
    done = await run_example(
        example, "What is the weather in Oslo?", "--base-url", stack.base_url,
        "--run-id", run_id, *flags,
    )  # fmt: skip
    assert_answered(done, run_id)
    assert f"(class {service_class}, caller {caller})" in done.lines()[0]

    turns = TOOL_RESULTS + 1

    async def all_admitted() -> bool:
        return len(admits_of(receiver, run_id)) >= turns

    await eventually(all_admitted, timeout=30, what=f"{turns} admit spans of run {run_id}")
    admits = admits_of(receiver, run_id)
    assert len(admits) == turns
    assert {a.attributes["luftpause.service_class"] for a in admits} == {service_class}
    assert {a.attributes["luftpause.caller"] for a in admits} == {caller}
    replicas = {a.attributes["luftpause.replica"] for a in admits}
    assert len(replicas) == 1, f"run {run_id} moved between replicas: {replicas}"
    if example == "openai_agent":  # it prints where each turn ran, as the proxy said
        turn_line = re.compile(r"^turn \d+ on (\S+),")
        shown = [m.group(1) for m in map(turn_line.match, done.lines()) if m]
        assert len(shown) == turns and set(shown) == replicas


async def test_a_new_run_id_per_run(stack: Stack, receiver: OtlpReceiver) -> None:
    """X4, D2: without --run-id each run gets a fresh ID, sent on all of its turns."""
    ids = []
    for _ in range(2):
        done = await run_example("openai_agent", "--base-url", stack.base_url)
        assert done.rc == 0, done.stderr
        found = re.match(r"^run (\S+) ", done.lines()[0])
        assert found is not None
        ids.append(found.group(1))
        assert_answered(done, ids[-1])
    assert ids[0] != ids[1]
    for run_id in ids:

        async def all_admitted(run_id: str = run_id) -> bool:
            return len(admits_of(receiver, run_id)) >= TOOL_RESULTS + 1

        await eventually(all_admitted, timeout=30, what=f"the admit spans of run {run_id}")


@pytest.mark.parametrize("example", EXAMPLES)
async def test_example_sends_the_token(token_stack: Stack, example: str) -> None:
    """X4, D9: with LUFTPAUSE_TOKEN set, the example sends it as its bearer token and the
    proxy lets its run through."""
    run_id = f"token-{example}"
    done = await run_example(
        example, "--base-url", token_stack.base_url, "--run-id", run_id,
        env={"LUFTPAUSE_TOKEN": TOKEN},
    )  # fmt: skip
    assert_answered(done, run_id)


async def test_example_without_the_token_says_401(token_stack: Stack) -> None:
    """X4, D9, D6: without the token the proxy answers 401; the example says so in one line
    and exits non-zero."""
    done = await run_example("openai_agent", "--base-url", token_stack.base_url)
    assert done.rc == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("error: the proxy answered 401: "), line
    assert "LUFTPAUSE_TOKEN" in line


@pytest.mark.parametrize("example", EXAMPLES)
async def test_example_reports_a_proxy_error(stack: Stack, example: str) -> None:
    """X4, D6, S6: an error answer (unknown model, 404) is one line with the proxy's own
    message, and a non-zero exit."""
    done = await run_example(example, "--base-url", stack.base_url, "--model", "no-such-model")
    assert done.rc == 1, done.stdout
    [line] = done.stderr.splitlines()
    assert line == (
        "error: the proxy answered 404: no Generative replica serves model 'no-such-model'"
    )


@pytest.mark.parametrize("example", EXAMPLES)
async def test_example_reports_an_unreachable_proxy(example: str) -> None:
    """X4: nothing listening at --base-url: one line naming the URL, a non-zero exit."""
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        done = await run_example(example, "--base-url", url)
    assert done.rc == 1, done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: no answer from the luftpause proxy at {url}: "), line
