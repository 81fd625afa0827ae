"""S7–S9: read each replica's health and load every probe period.

A probe GETs the endpoint's health path (none configured: healthy) and its
Prometheus metrics, or those of the engines named in ``load_from`` when the
replica is a router. SGLang and vLLM names both parse, including vLLM's old
and new KV-usage gauges. Hosted endpoints get ``Authorization: Bearer <key>``.

The engine's KV pool in tokens (working-set admission) is read from the same text:
SGLang's ``sglang:max_total_num_tokens`` gauge, vLLM's ``vllm:cache_config_info``
(``num_gpu_blocks`` x ``block_size``, from its labels), summed over samples as the
running counts are (one per DP rank or engine) and over ``load_from``'s engines. An
endpoint's ``kv_tokens`` overrides it (an engine that exports neither).
The probe timeout equals the period. A refused connection or an error status
marks a replica unhealthy at once; a health check that only times out does so
the second time in a row (``TIMEOUTS_TO_UNHEALTHY``): an engine busy enough to
answer late once is slow, not dead, and marking it down would let every run
pinned there move off its cached prefix (S3).

If the metrics read fails while the health check passes, the last good load is
reported again (the cap stays sticky) and a warning is logged; a replica
configured with ``metrics = "none"`` reports no load and is never capped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from luftpause.config import Endpoint, MetricsFlavour
from luftpause.members import entry_of
from luftpause.scheduler.core import ReplicaProbed

log = logging.getLogger("luftpause.scheduler.probe")

RUNNING = {
    MetricsFlavour.SGLANG: ("sglang:num_running_reqs",),
    MetricsFlavour.VLLM: ("vllm:num_requests_running",),
}
WAITING = {
    MetricsFlavour.SGLANG: ("sglang:num_queue_reqs",),
    MetricsFlavour.VLLM: ("vllm:num_requests_waiting",),
}
KV = {
    MetricsFlavour.SGLANG: ("sglang:token_usage",),
    MetricsFlavour.VLLM: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
POOL_SGLANG = "sglang:max_total_num_tokens"  # KV pool, tokens
POOL_VLLM = "vllm:cache_config_info"  # an info gauge: labels num_gpu_blocks, block_size


TIMEOUTS_TO_UNHEALTHY = 2


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int
    kv_usage: float | None
    kv_tokens: int | None = None  # the KV pool in tokens (None: not reported)


class MetricsError(Exception):
    """The metrics text lacks the running/waiting gauges of the expected flavour."""


def _pool_tokens(sample_name: str, labels: Mapping[str, str], value: float) -> int | None:
    """The KV pool one sample reports, in tokens (None: it reports none it can read)."""
    if sample_name == POOL_SGLANG:
        return int(value) if value > 0 else None
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):  # (vLLM writes "None" before the engine profiled)
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def parse_load(text: str, flavour: MetricsFlavour) -> Load:
    """Sum running/waiting over all samples (one per model or DP rank); KV usage is the
    max; the KV pool is summed, in the flavour whose running/waiting gauges were read."""
    samples: dict[str, float] = {}
    seen: set[str] = set()
    kv: float | None = None
    pools: dict[str, int] = {}  # flavour's pool name -> tokens summed over its samples
    flavours = (
        (MetricsFlavour.SGLANG, MetricsFlavour.VLLM)
        if flavour is MetricsFlavour.AUTO
        else (flavour,)
    )
    wanted = {n for f in flavours for n in (*RUNNING[f], *WAITING[f])}
    kv_names = {n for f in flavours for n in KV[f]}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
                seen.add(sample.name)
            elif sample.name in kv_names:
                kv = sample.value if kv is None else max(kv, sample.value)
            elif sample.name in (POOL_SGLANG, POOL_VLLM):
                tokens = _pool_tokens(sample.name, sample.labels, sample.value)
                if tokens is not None:
                    pools[sample.name] = pools.get(sample.name, 0) + tokens
    for f in flavours:
        r = next((n for n in RUNNING[f] if n in seen), None)
        w = next((n for n in WAITING[f] if n in seen), None)
        if r is not None and w is not None:
            pool = pools.get(POOL_SGLANG if f is MetricsFlavour.SGLANG else POOL_VLLM)
            return Load(int(samples[r]), int(samples[w]), kv, pool)
    names = ", ".join(sorted({n for f in flavours for n in (*RUNNING[f], *WAITING[f])}))
    raise MetricsError(f"no running/waiting gauges found (looked for {names})")


class Prober:
    def __init__(
        self,
        endpoints: tuple[Endpoint, ...],
        api_keys: Mapping[str, str],
        period_s: float,
        post: Callable[[Callable[[float], ReplicaProbed]], None],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoints = list(endpoints)  # (replicas join and leave at run time, B11)
        self.api_keys = api_keys
        self.period_s = period_s
        self.post = post
        self.client = client or httpx.AsyncClient(timeout=period_s)
        self._last_load: dict[str, Load] = {}
        self._last_healthy: dict[str, bool] = {}
        self._timeouts: dict[str, int] = {}  # health checks timed out in a row

    async def run_forever(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.period_s)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(e) for e in tuple(self.endpoints)))

    def add(self, endpoint: Endpoint) -> None:
        """Probe ``endpoint`` too from the next round (a replica that joined, B11)."""
        if all(e.name != endpoint.name for e in self.endpoints):
            self.endpoints.append(endpoint)

    def remove(self, name: str) -> None:
        """Stop probing ``name`` (a replica that left) and forget what it said."""
        self.endpoints = [e for e in self.endpoints if e.name != name]
        self._last_load.pop(name, None)
        self._last_healthy.pop(name, None)
        self._timeouts.pop(name, None)

    async def probe(self, endpoint: Endpoint) -> None:
        headers = {}
        key = self.api_keys.get(entry_of(endpoint.name))  # (a discovered replica: its entry's)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        healthy, why, timed_out = await self._health(endpoint, headers)
        name = endpoint.name
        if timed_out:
            self._timeouts[name] = self._timeouts.get(name, 0) + 1
            if self._timeouts[name] < TIMEOUTS_TO_UNHEALTHY:
                log.info("replica %s: health check timed out once; not judged yet", name)
                return  # no evidence either way: nothing is reported
        else:
            self._timeouts.pop(name, None)
        load: Load | None = None
        if healthy and endpoint.metrics is not MetricsFlavour.NONE:
            load = await self._load(endpoint, headers)
        if self._last_healthy.get(endpoint.name) != healthy:
            if healthy:
                log.info("replica %s is healthy", endpoint.name)
            else:
                log.warning("replica %s is unhealthy: %s", endpoint.name, why)
            self._last_healthy[endpoint.name] = healthy
        self.post(
            lambda at: ReplicaProbed(
                at=at,
                replica=name,
                healthy=healthy,
                running=load.running if load else None,
                waiting=load.waiting if load else None,
                kv_usage=load.kv_usage if load else None,
                # working-set admission: the configured pool, else the engine's own
                kv_tokens=endpoint.kv_tokens or (load.kv_tokens if load else None),
            )
        )

    async def _health(self, endpoint: Endpoint, headers: dict[str, str]) -> tuple[bool, str, bool]:
        """(healthy, why not, whether it only timed out)."""
        if not endpoint.health_path:
            return True, "", False
        try:
            resp = await self.client.get(
                endpoint.url + endpoint.health_path, headers=headers, timeout=self.period_s
            )
        except httpx.HTTPError as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return False, why, isinstance(exc, httpx.TimeoutException)
        if resp.is_success:
            return True, "", False
        return False, f"{endpoint.health_path} answered {resp.status_code}", False

    async def _load(self, endpoint: Endpoint, headers: dict[str, str]) -> Load | None:
        sources = endpoint.load_from or (endpoint.url,)
        try:
            loads = await asyncio.gather(
                *(
                    self._read_metrics(url + endpoint.metrics_path, endpoint, headers)
                    for url in sources
                )
            )
        except (httpx.HTTPError, MetricsError, ValueError) as exc:
            last = self._last_load.get(endpoint.name)
            log.warning(
                "replica %s: metrics unreadable (%s); %s",
                endpoint.name,
                exc,
                "keeping the last load" if last else "treating it as not limited",
            )
            return last
        kvs = [x.kv_usage for x in loads if x.kv_usage is not None]
        pools = [x.kv_tokens for x in loads]
        load = Load(
            running=sum(x.running for x in loads),
            waiting=sum(x.waiting for x in loads),
            kv_usage=max(kvs) if kvs else None,
            # the engines' pools together; unknown if any of them reports none
            kv_tokens=sum(p for p in pools if p is not None) if None not in pools else None,
        )
        self._last_load[endpoint.name] = load
        return load

    async def _read_metrics(self, url: str, endpoint: Endpoint, headers: dict[str, str]) -> Load:
        resp = await self.client.get(url, headers=headers, timeout=self.period_s)
        resp.raise_for_status()
        return parse_load(resp.text, endpoint.metrics)
