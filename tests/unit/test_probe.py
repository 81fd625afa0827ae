"""Probe parsing and probing (S7, S8, S9) against in-memory HTTP transports."""

from __future__ import annotations

import httpx
import pytest

from luftpause.config import Endpoint, MetricsFlavour
from luftpause.scheduler.core import ReplicaProbed
from luftpause.scheduler.service.probe import Load, MetricsError, Prober, parse_load

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="llama"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="llama"} 3.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="llama"} 0.82
"""
VLLM_NEW = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""
VLLM_OLD = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
"""


def test_sglang_names_parse() -> None:
    """S9: SGLang's running, queue and token-usage gauges."""
    assert parse_load(SGLANG, MetricsFlavour.SGLANG) == Load(7, 3, 0.82)


def test_vllm_new_names_sum_over_engines() -> None:
    """S9: vLLM's names, summed over data-parallel engines; KV usage is the max."""
    assert parse_load(VLLM_NEW, MetricsFlavour.VLLM) == Load(9, 2, 0.5)


def test_vllm_old_kv_name_parses() -> None:
    """S9: older vLLM releases call KV usage gpu_cache_usage_perc."""
    assert parse_load(VLLM_OLD, MetricsFlavour.VLLM) == Load(2, 1, 0.9)


@pytest.mark.parametrize("text", [SGLANG, VLLM_NEW, VLLM_OLD])
def test_auto_accepts_either_family(text: str) -> None:
    """S9: the auto flavour reads whichever family the engine exposes."""
    load = parse_load(text, MetricsFlavour.AUTO)
    assert load.running > 0


SGLANG_POOL = (
    SGLANG
    + """# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="llama"} 120000.0
"""
)
# vLLM's cache config is an info gauge: every field a label (as text), value 1; one per
# data-parallel engine; "None" blocks before the engine has profiled its memory.
VLLM_POOL = (
    VLLM_NEW
    + """# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2000",num_cpu_blocks="None"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="3000",num_cpu_blocks="None"} 1.0
"""
)


def test_the_kv_pool_is_read_from_either_family() -> None:
    """B5, S9: the engine's KV pool in tokens: SGLang's max_total_num_tokens, vLLM's
    num_gpu_blocks x block_size from cache_config_info, summed over engines; an engine
    that reports neither (or no blocks yet) has none."""
    assert parse_load(SGLANG_POOL, MetricsFlavour.SGLANG) == Load(7, 3, 0.82, 120_000)
    assert parse_load(VLLM_POOL, MetricsFlavour.AUTO) == Load(9, 2, 0.5, 80_000)
    assert parse_load(SGLANG, MetricsFlavour.SGLANG).kv_tokens is None
    unprofiled = VLLM_OLD + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    assert parse_load(unprofiled, MetricsFlavour.VLLM).kv_tokens is None


async def test_the_probe_carries_the_pool_and_a_configured_one_overrides_it() -> None:
    """B5, S9: the pool reaches the core in ReplicaProbed.kv_tokens; an endpoint's
    kv_tokens replaces what the engine reports (or reports for an engine without one)."""

    def handle(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=VLLM_POOL if req.url.path == "/metrics" else "ok")

    read = Endpoint(name="a", url="http://a:1", models=("m",))
    told = Endpoint(name="b", url="http://b:1", models=("m",), kv_tokens=5000)
    prober, seen = _prober(httpx.MockTransport(handle), read, told)
    await prober.probe_all()
    assert {p.replica: p.kv_tokens for p in seen} == {"a": 80_000, "b": 5000}


def test_missing_gauges_are_an_error_naming_what_was_sought() -> None:
    """S9: metrics without the expected gauges do not silently read as zero load."""
    with pytest.raises(MetricsError, match="sglang:num_queue_reqs"):
        parse_load("# TYPE other gauge\nother 1\n", MetricsFlavour.SGLANG)


def _prober(
    handler: httpx.MockTransport, *endpoints: Endpoint, keys: dict[str, str] | None = None
) -> tuple[Prober, list[ReplicaProbed]]:
    seen: list[ReplicaProbed] = []
    prober = Prober(
        endpoints,
        keys or {},
        2.0,
        lambda stamp: seen.append(stamp(1.0)),
        client=httpx.AsyncClient(transport=handler),
    )
    return prober, seen


async def test_healthy_engine_reports_its_load() -> None:
    """S9: health path and /metrics read; load reaches the core as a ReplicaProbed."""

    def handle(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=SGLANG if req.url.path == "/metrics" else "ok")

    ep = Endpoint(name="e", url="http://e:1", models=("m",), metrics=MetricsFlavour.SGLANG)
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    assert seen == [
        ReplicaProbed(at=1.0, replica="e", healthy=True, running=7, waiting=3, kv_usage=0.82)
    ]


async def test_failing_health_marks_unhealthy() -> None:
    """S9: a failing health path makes the replica unhealthy (it gets no turns)."""

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/healthz":
            return httpx.Response(503)
        return httpx.Response(200, text=SGLANG)

    ep = Endpoint(name="e", url="http://e:1", models=("m",), health_path="/healthz")
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    assert seen[0].healthy is False and seen[0].running is None


async def test_unreachable_engine_is_unhealthy() -> None:
    """S9: a connection error is a failed probe, not a crash."""

    def handle(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    ep = Endpoint(name="e", url="http://e:1", models=("m",))
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    assert seen[0].healthy is False


async def test_one_timed_out_health_check_is_not_yet_unhealthy() -> None:
    """S9/S3: a health check that times out once reports nothing (a busy engine keeps its
    runs); the second in a row marks the replica unhealthy; an answer resets the count."""
    answers = iter(["timeout", "ok", "timeout", "timeout", "ok"])

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/health":
            if next(answers) == "timeout":
                raise httpx.ReadTimeout("slow", request=req)
            return httpx.Response(200, text="ok")
        return httpx.Response(200, text=SGLANG)

    ep = Endpoint(
        name="e", url="http://e:1", models=("m",), health_path="/health",
        metrics=MetricsFlavour.SGLANG,
    )  # fmt: skip
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    assert seen == []  # one timeout: no evidence either way
    await prober.probe_all()
    assert [p.healthy for p in seen] == [True]
    await prober.probe_all()
    assert [p.healthy for p in seen] == [True]  # the count started again
    await prober.probe_all()
    assert [p.healthy for p in seen] == [True, False]
    assert seen[-1].running is None
    await prober.probe_all()
    assert [p.healthy for p in seen] == [True, False, True]


async def test_router_load_is_read_from_its_engines() -> None:
    """S7: a router replica's load is the sum over the engines in load_from."""

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            assert req.url.host in ("e1", "e2"), "metrics must come from the engines"
            return httpx.Response(200, text=SGLANG)
        return httpx.Response(200, text="ok")

    ep = Endpoint(
        name="router",
        url="http://router:1",
        models=("m",),
        load_from=("http://e1:1", "http://e2:1"),
    )
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    assert (seen[0].running, seen[0].waiting) == (14, 6)


async def test_hosted_endpoint_gets_its_key_and_no_load() -> None:
    """S8: https endpoint, key from the environment as a bearer token, metrics off."""
    auth: list[str | None] = []

    def handle(req: httpx.Request) -> httpx.Response:
        auth.append(req.headers.get("authorization"))
        assert req.url.scheme == "https" and req.url.path == "/v1/models"
        return httpx.Response(200, json={"data": []})

    ep = Endpoint(
        name="hosted",
        url="https://api.example:443",
        models=("big",),
        health_path="/v1/models",
        metrics=MetricsFlavour.NONE,
        api_key_env="K",
    )
    prober, seen = _prober(httpx.MockTransport(handle), ep, keys={"hosted": "sk-1"})
    await prober.probe_all()
    assert auth == ["Bearer sk-1"]
    assert seen[0].healthy and seen[0].running is None


async def test_metrics_failure_keeps_last_load() -> None:
    """S2, S9: a metrics hiccup does not drop the sticky cap: the last load is re-sent."""
    fail = False

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            return httpx.Response(500) if fail else httpx.Response(200, text=SGLANG)
        return httpx.Response(200, text="ok")

    ep = Endpoint(name="e", url="http://e:1", models=("m",))
    prober, seen = _prober(httpx.MockTransport(handle), ep)
    await prober.probe_all()
    fail = True
    await prober.probe_all()
    assert (seen[1].running, seen[1].waiting) == (7, 3)
