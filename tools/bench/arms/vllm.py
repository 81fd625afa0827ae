"""vLLM's router arms (PyPI vllm-router): their program-scheduling configurations,
command lines, the engines' KV pool and the router's ``/scheduling/diagnostics``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import httpx

from luftpause.procs import (
    launch_vllm_router,
)
from tools.bench.arms.plan import MODEL, Stack, package_version

# vLLM's router (PyPI vllm-router 0.1.17) arms. They run on two more fake engines, the same
# as the others' but serving vLLM's metric names: its program scheduling reads
# vllm:kv_cache_usage_perc and vllm:num_requests_running/_waiting from each engine's /metrics.
VLLM_ENGINE_ARGS = ("--metrics", "vllm")
VLLM_POLICY = "cache_aware"  # its default: where a request without a program goes
# How the load generator names a run's program to the router: the body's
# vllm_xargs.agentic_context (the router's default key), with the run ID as program_id,
# the class as priority and expected_resume false on the run's last turn, so that
# `vllm-prog` runs the router's defaults untouched.
VLLM_PROGRAM_FLAGS = ("--program-context", "xargs")


def kv_pool_tokens(server_infos: list[dict[str, Any]]) -> int:
    """The KV pool of one engine in tokens, from the engines' ``/server_info`` answers
    (``max_total_num_tokens``): the smallest, so that it holds for every engine."""
    sizes = []
    for info in server_infos:
        size = info.get("max_total_num_tokens")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"/server_info gave no positive max_total_num_tokens: {size!r}")
        sizes.append(size)
    if not sizes:
        raise ValueError("no engine to read a KV pool size from")
    return min(sizes)


def vllm_arms_config(kv_tokens: int) -> dict[str, dict[str, Any] | None]:
    """Each vLLM router arm's program-scheduling configuration (None: off): plain; its
    defaults (the load generator names programs as its default key expects, see
    ``VLLM_PROGRAM_FLAGS``); and the same with ``token_capacity_per_target``, the logical
    KV capacity of one engine, set to the engines' pool (``kv_tokens``), which turns on
    its token-based admission (else it guards by program count, 64 per engine)."""
    return {
        "vllm-router": None,
        "vllm-prog": {},
        "vllm-prog-kv": {"token_capacity_per_target": kv_tokens},
    }


def vllm_router_flags(config: dict[str, Any] | None) -> list[str]:
    """The ``vllm-router`` flags of one program-scheduling configuration (None: none)."""
    if config is None:
        return []
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return ["--enable-program-scheduling", "--program-scheduling-config-json", text]


def vllm_router_command(flags: list[str], policy: str = VLLM_POLICY) -> str:
    """The command line a vLLM router arm ran (ports and engine URLs by name)."""
    return shlex.join(
        [
            "vllm-router", "--host", "127.0.0.1", "--port", "PORT",
            "--worker-urls", "VLLM_ENGINE_A", "VLLM_ENGINE_B", "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", "PORT2", *flags,
        ]
    )  # fmt: skip


def start_vllm_routers(s: Stack) -> None:
    """vLLM's router, once per arm of ``vllm_arms_config``, in front of the stack's vLLM
    engines; their KV pool read from the engines themselves."""
    with httpx.Client(timeout=5) as c:
        kv = kv_pool_tokens([c.get(f"{url}/server_info").json() for url in s.vllm_engines])
    version = package_version("vllm-router")
    for name, config in vllm_arms_config(kv).items():
        flags = vllm_router_flags(config)
        s.routers[name] = launch_vllm_router(
            s.vllm_engines, VLLM_POLICY, s.tmp / f"{name}.log", MODEL, extra_args=flags
        )
        s.setups[name] = vllm_router_command(flags)
        s.router_info[name] = {
            "router": "vllm-router",
            "version": version,
            "command": s.setups[name],
            "policy": VLLM_POLICY,
            "program_scheduling": config,
            "engines": f"two fake engines with `{' '.join(VLLM_ENGINE_ARGS)}`",
            "kv_pool_tokens": kv,
            "loadgen_program_flags": list(VLLM_PROGRAM_FLAGS),
        }


def read_diagnostics(url: str) -> Any:
    """A router's diagnostics (its JSON answer), or what kept it from answering."""
    try:
        r = httpx.get(url, timeout=10)
        r.raise_for_status()
        return r.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"GET {url}: {exc!r}"}
