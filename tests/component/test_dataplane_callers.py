"""Callers bound to keys at the dataplane (B13, D3, D9): a request's caller and the classes
it may use come from its key; the token stays the services' trusted credential. In
process, against a real in-process scheduler over gRPC and a mock engine.
"""

from __future__ import annotations

import logging
import string
from collections.abc import AsyncIterator

import httpx
import pytest
from _dataplane_stack import (
    MODEL,
    Stack,
    chat,
    settle,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luftpause.callers import gate_for
from luftpause.config import CallerConfig
from luftpause.scheduler.service.quotas import Quotas

TOKEN = "s3cret-service-token"
ALICE = "lp_alice-key-0123456789abcdef"  # interactive and batch
MALLORY = "lp_mallory-key-0123456789abcdef"  # batch only: downgraded
RITA = "lp_rita-key-0123456789abcdefgh"  # batch only: refused
KEYS = (ALICE, MALLORY, RITA, TOKEN)
ENV = {"K_ALICE": ALICE, "K_MALLORY": MALLORY, "K_RITA": RITA}
CALLERS = (
    CallerConfig(name="alice", key_env="K_ALICE", classes=("interactive", "batch")),
    CallerConfig(name="mallory", key_env="K_MALLORY"),
    CallerConfig(name="rita", key_env="K_RITA", on_denied_class="refuse"),
)


@pytest.fixture(name="keyed")
async def keyed_fixture(stack: Stack) -> AsyncIterator[Stack]:
    stack.dp.gate = gate_for(CALLERS, ENV, TOKEN)
    yield stack


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}


pytestmark = pytest.mark.parametrize("stack", [TOKEN], indirect=True)


async def test_a_key_names_its_caller_and_headers_only_name_sub_callers(keyed: Stack) -> None:
    """B13: the key's caller is the turn's; the caller header names a sub-caller under it
    (another caller's name too), and the scheduler sees exactly that."""
    for run, claimed, seen in (
        ("r1", None, "alice"),
        ("r2", "ci", "alice/ci"),
        ("r3", "alice/ci", "alice/ci"),
        ("r4", "mallory", "alice/mallory"),
    ):
        headers = bearer(ALICE, **{"x-luftpause-run-id": run})
        if claimed is not None:
            headers["x-luftpause-caller"] = claimed
        resp = await keyed.client.post("/v1/chat/completions", json=chat(), headers=headers)
        assert resp.status_code == 200
        await settle(keyed.host, lambda r=run: r in keyed.host.state.runs)
        assert keyed.host.state.runs[run].caller == seen


async def test_a_class_the_key_may_not_use_is_downgraded_and_said(keyed: Stack) -> None:
    """B13: mallory may use batch only; asking for interactive (and naming alice) runs as
    mallory's batch turn, and the answer says which class was denied."""
    resp = await keyed.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers=bearer(
            MALLORY,
            **{
                "x-luftpause-class": "interactive",
                "x-luftpause-caller": "alice",
                "x-luftpause-run-id": "imp",
            },
        ),
    )
    assert resp.status_code == 200
    assert resp.headers["x-luftpause-class-denied"] == "interactive"
    await settle(keyed.host, lambda: "imp" in keyed.host.state.runs)
    run = keyed.host.state.runs["imp"]
    assert (run.caller, run.service_class.value) == ("mallory/alice", "batch")
    ok = await keyed.client.post("/v1/chat/completions", json=chat(), headers=bearer(MALLORY))
    assert ok.status_code == 200 and "x-luftpause-class-denied" not in ok.headers
    metrics = (await keyed.client.get("/metrics")).text
    assert (
        'luftpause_dataplane_class_denied_total{action="downgraded",caller="mallory"} 1.0'
        in metrics
    )


async def test_a_refusing_key_gets_403_in_the_apis_own_shape(keyed: Stack) -> None:
    """B13, B9: rita's key refuses instead: a 403 naming the caller and its classes, in
    OpenAI's shape on Chat Completions and Anthropic's on Messages; nothing reaches the
    engine. Single-pass turns ask for interactive, so /v1/decide is refused as well."""
    resp = await keyed.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers=bearer(RITA, **{"x-luftpause-class": "interactive"}),
    )
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["code"] == "class_not_allowed"
    assert "'rita'" in error["message"] and "batch" in error["message"]
    messages = await keyed.client.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": RITA, "x-luftpause-class": "interactive"},
    )
    assert messages.status_code == 403
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "permission_error"
    decide = await keyed.client.post("/v1/decide", json={"input": "x"}, headers=bearer(RITA))
    assert decide.status_code == 403
    assert keyed.engine.seen == []


async def test_the_token_is_trusted_and_anything_else_is_refused(keyed: Stack) -> None:
    """D9, X2, B13: the token's requests name any caller and class (the runtime's sub-agents
    come this way); an unknown key is a 401 that never echoes it; a key works as
    x-api-key too; /v1/tool_calls is the services' route."""
    trusted = await keyed.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers=bearer(
            TOKEN,
            **{
                "x-luftpause-caller": "alice",
                "x-luftpause-class": "interactive",
                "x-luftpause-run-id": "svc",
            },
        ),
    )
    assert trusted.status_code == 200
    await settle(keyed.host, lambda: "svc" in keyed.host.state.runs)
    run = keyed.host.state.runs["svc"]
    assert (run.caller, run.service_class.value) == ("alice", "interactive")
    wrong = await keyed.client.post(
        "/v1/chat/completions", json=chat(), headers=bearer("lp_not-a-key-at-all-0000")
    )
    assert wrong.status_code == 401 and "lp_not" not in wrong.text
    assert "key" in wrong.json()["error"]["message"]
    assert (await keyed.client.post("/v1/chat/completions", json=chat())).status_code == 401
    by_header = await keyed.client.get("/v1/models", headers={"x-api-key": ALICE})
    assert by_header.status_code == 200
    tool_call = await keyed.client.get("/v1/tool_calls/call-1", headers=bearer(ALICE))
    assert tool_call.status_code == 403 and "LUFTPAUSE_TOKEN" in tool_call.text


async def test_a_key_ends_only_its_own_callers_runs(keyed: Stack) -> None:
    """B13, D8: DELETE /v1/runs/{id} with a key ends a run of its own caller, not one this
    dataplane knows as another caller's."""
    for key, run in ((ALICE, "mine"), (MALLORY, "theirs")):
        resp = await keyed.client.post(
            "/v1/chat/completions", json=chat(), headers=bearer(key, **{"x-luftpause-run-id": run})
        )
        assert resp.status_code == 200
    refused = await keyed.client.delete("/v1/runs/theirs", headers=bearer(ALICE))
    assert refused.status_code == 403
    assert (await keyed.client.delete("/v1/runs/mine", headers=bearer(ALICE))).status_code == 200
    assert (await keyed.client.delete("/v1/runs/theirs", headers=bearer(TOKEN))).status_code == 200


async def test_a_caller_past_its_tokens_per_minute_gets_429_with_retry_after(
    keyed: Stack,
) -> None:
    """B13: once alice has spent her 4 tokens per minute (a turn reports 6), her next turn
    is a 429 with Retry-After, in OpenAI's shape (``rate_limit_exceeded``) and in
    Anthropic's (``rate_limit_error``) on Messages, and never reaches the engine; mallory,
    with no limit, is served meanwhile."""
    limited = (CALLERS[0].model_copy(update={"tokens_per_minute": 4}), *CALLERS[1:])
    keyed.host.quotas = Quotas.of(limited)
    first = await keyed.client.post("/v1/chat/completions", json=chat(), headers=bearer(ALICE))
    assert first.status_code == 200
    await settle(keyed.host, lambda: not keyed.host.state.turns)
    seen = len(keyed.engine.seen)
    refused = await keyed.client.post("/v1/chat/completions", json=chat(), headers=bearer(ALICE))
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "'alice'" in error["message"]
    messages = await keyed.client.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": ALICE},
    )
    assert messages.status_code == 429 and "retry-after" in messages.headers
    assert messages.json()["error"]["type"] == "rate_limit_error"
    assert len(keyed.engine.seen) == seen
    other = await keyed.client.post("/v1/chat/completions", json=chat(), headers=bearer(MALLORY))
    assert other.status_code == 200
    metrics = (await keyed.client.get("/metrics")).text
    assert 'luftpause_dataplane_over_quota_total{limit="tokens_per_minute"} 2.0' in metrics


_TEXT = st.text(alphabet=string.printable + "é\u2028ÿ", max_size=80)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    credential=st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k[:-1]), _TEXT),
    scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "x-api-key"]),
    caller=_TEXT,
    cls=st.sampled_from(["", "batch", "interactive", "urgent", "INTERACTIVE"]),
)
async def test_fuzzed_keys_and_headers_never_fail_or_leak(
    keyed: Stack,
    caplog: pytest.LogCaptureFixture,
    credential: str,
    scheme: str,
    caller: str,
    cls: str,
) -> None:
    """B13, D9: arbitrary credentials, caller and class headers give 200, 400, 401 or
    403, never a 5xx; no answer and no log line contains any configured key or the
    token."""
    caplog.set_level(logging.DEBUG)
    keyed.engine.seen.clear()
    headers = {"x-luftpause-caller": caller.strip(), "x-luftpause-class": cls}
    if scheme == "x-api-key":
        headers["x-api-key"] = credential.strip()
    else:
        headers["authorization"] = f"{scheme}{credential}".strip()
    headers = {k: v for k, v in headers.items() if v}
    try:
        resp = await keyed.client.post("/v1/chat/completions", json=chat(), headers=headers)
    except (httpx.LocalProtocolError, UnicodeEncodeError):
        return  # not a header a client can send
    assert resp.status_code in (200, 400, 401, 403), resp.text
    for key in KEYS:
        assert key not in resp.text
        assert all(key not in v for v in resp.headers.values())
        assert key not in caplog.text
