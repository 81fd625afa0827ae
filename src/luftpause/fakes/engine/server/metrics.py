"""``/metrics`` in two dialects (H1, read by S9): SGLang's or vLLM's Prometheus names.

Both read the model's ``EngineMetrics`` at scrape time. The running and queue
gauges follow SGLang's rule for when it updates them (see docs/guides/calibration.md,
"What /metrics reports"); ``/debug/state`` and ``/get_load`` show live counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from luftpause.fakes.engine.results import EngineMetrics
from luftpause.fakes.engine.server.driver import EngineDriver

Dialect = Literal["sglang", "vllm"]
# vLLM's KV block, in tokens (its default on CUDA): the pool it reports in
# ``vllm:cache_config_info`` is whole blocks of this many token slots.
VLLM_BLOCK_SIZE = 16


def sglang_families(m: EngineMetrics, model_name: str) -> Iterator[Metric]:
    """SGLang's scheduler gauges (``--enable-metrics``), labelled as SGLang labels them."""
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    values = [model_name, "unified", "0", "0"]
    gauges: tuple[tuple[str, str, float], ...] = (
        ("sglang:num_running_reqs", "The number of running requests.", m.running_gauge),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", m.queue_gauge),
        ("sglang:token_usage", "The token usage.", m.token_usage),
        ("sglang:num_used_tokens", "The number of used tokens.", m.used_tokens),
        (
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV pool.",
            m.max_tokens,
        ),
        ("sglang:cache_hit_rate", "The prefix cache hit rate.", m.cache_hit_rate),
    )
    for name, doc, value in gauges:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        yield g


def vllm_families(m: EngineMetrics, model_name: str) -> Iterator[Metric]:
    """vLLM's scheduler gauges and prefix-cache counters (v1 names)."""
    labels = ["model_name", "engine"]
    values = [model_name, "0"]
    gauges = (
        ("vllm:num_requests_running", "Requests in the running batch", m.running_gauge),
        ("vllm:num_requests_waiting", "Requests waiting to be scheduled", m.queue_gauge),
        ("vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", m.token_usage),
    )
    for name, doc, value in gauges:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        yield g
    # vLLM's cache config as an info gauge (value 1; every field a label, as text), the
    # labels it writes: the pool is num_gpu_blocks x block_size tokens.
    info = {
        "block_size": str(VLLM_BLOCK_SIZE),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(m.max_tokens // VLLM_BLOCK_SIZE),
        "engine": "0",
    }
    cache = GaugeMetricFamily(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
    )
    cache.add_metric(list(info.values()), 1.0)
    yield cache
    counters = (
        ("vllm:prefix_cache_queries", "Prefix cache queries (tokens)", m.cache_queries_tokens),
        ("vllm:prefix_cache_hits", "Prefix cache hits (tokens)", m.cache_hit_tokens),
    )
    for name, doc, value in counters:
        c = CounterMetricFamily(name, doc, labels=labels)
        c.add_metric(values, value)
        yield c


class EngineCollector(Collector):
    """Reads the driver's model at every scrape, in one dialect, for one model name."""

    def __init__(self, driver: EngineDriver, dialect: Dialect, model_name: str) -> None:
        self._driver = driver
        self._dialect = dialect
        self._model_name = model_name

    def collect(self) -> Iterable[Metric]:
        m = self._driver.model.metrics()
        if self._dialect == "vllm":
            return vllm_families(m, self._model_name)
        return sglang_families(m, self._model_name)
