"""B11 end to end: a flood through two dataplanes while the pool's DNS records change.

Three fake engines; the scheduler finds its replicas as the SRV records of a name served
by a DNS server this test runs (dnslib, on loopback) and changes while two load
generators drive own-loop agents with tool calls through two dataplanes: an engine is
added to the records, one is taken out of them, and one is drained through the admin
route. Every run finishes without an error (no turn lost), no new turn goes to the engine
after it left the records, the added one takes turns, and once the load stops nothing is
held or in flight anywhere (no slot leaked). X2: the admin route with the token.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from dnslib import QTYPE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer
from fullstack import MODEL, eventually, loadgen_here

pytestmark = pytest.mark.integration

TOKEN = "fleet-token"
POOL = "_http._tcp.pool.test."


class Records(BaseResolver):  # type: ignore[misc]
    """SRV records of ``POOL``: one per engine port, each target ``127.0.0.1.`` (an
    address that needs no lookup); any A query is answered 127.0.0.1. The test changes
    ``ports`` while the server runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ports: list[int] = []

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname)
        if request.q.qtype == QTYPE.SRV and name == POOL:
            with self.lock:
                ports = list(self.ports)
            for port in ports:
                reply.add_answer(RR(POOL, QTYPE.SRV, rdata=SRV(0, 0, port, "127.0.0.1."), ttl=1))
        elif request.q.qtype == QTYPE.A:
            reply.add_answer(RR(name, QTYPE.A, rdata=A("127.0.0.1"), ttl=1))
        return reply


async def _status(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        r = await c.get(f"{url}/status", headers={"authorization": f"Bearer {TOKEN}"}, timeout=5)
        return dict(r.json())


async def _submitted(engine: Any) -> int:
    async with httpx.AsyncClient() as c:
        state = (await c.get(f"{engine.urls['http']}/debug/state", timeout=5)).json()
    return int(state["submitted"])


async def test_a_flood_through_two_dataplanes_survives_records_that_change(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B11, D4, S3: added, removed and drained replicas under load lose no turn and leak no
    slot."""
    env = {"LUFTPAUSE_TOKEN": TOKEN}
    monkeypatch.setenv("LUFTPAUSE_TOKEN", TOKEN)  # the in-process load generators send it
    common = ("--port", "0", "--log-level", "WARNING", "--time-scale", "20")
    engines = {
        n: services.start("fake-engine", "--name", n, *common, name=n) for n in ("a", "b", "c")
    }
    port = {n: int(e.ports["http"]) for n, e in engines.items()}
    member = {n: f"pool@127.0.0.1:{p}" for n, p in port.items()}
    tools = services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.2", name="mcp")
    records = Records()
    records.ports = [port["a"], port["b"]]
    dns = DNSServer(records, address="127.0.0.1", port=0)
    dns.start_thread()
    try:
        dns_port = dns.server.server_address[1]
        config = tmp_path / "stack.toml"
        config.write_text(
            f'[scheduler]\nprobe_period_s = 0.2\ndns_servers = ["127.0.0.1:{dns_port}"]\n'
            "[dataplane]\nreport_reconnect_s = 0.2\n"
            f'[[endpoints]]\nname = "pool"\nurl = "http://{POOL.rstrip(".")}"\n'
            f'discover = "dns"\ndiscover_every_s = 0.3\nmodels = ["{MODEL}"]\n'
            'metrics = "sglang"\n'
        )
        sched = services.start(
            "scheduler", "--config", str(config), "--port", "0", "--http-port", "0", env=env
        )
        status_url = str(sched.urls["http"])
        dataplanes = [
            services.start(
                "dataplane",
                "--config",
                str(config),
                "--port",
                "0",
                "--dataplane-id",
                ident,
                "--scheduler",
                f"127.0.0.1:{sched.ports['grpc']}",
                name=ident,
                env=env,
            )
            for ident in ("dp1", "dp2")
        ]

        async def members() -> set[str]:
            reps = (await _status(status_url))["replicas"]
            return {r["name"] for r in reps if r["healthy"] and r["membership"] == "serving"}

        await eventually(
            lambda: _has(members, {member["a"], member["b"]}), what="the pool from DNS"
        )

        async def flood(dp: Any, tag: str) -> tuple[int, str, dict[str, Any]]:
            return await loadgen_here(
                tmp_path / tag,
                "--target", f"{dp.urls['http']}/v1", "--tools-url", f"{tools.urls['http']}/mcp",
                "--agents", "6", "--tool-calls", "2", "--context-chars", "2000",
                "--max-tokens", "24", "--duration-s", "14", "--warmup-s", "0", "--quiet",
            )  # fmt: skip

        for tag in ("dp1", "dp2"):
            (tmp_path / tag).mkdir()
        load = [asyncio.create_task(flood(dp, dp.name)) for dp in dataplanes]
        await asyncio.sleep(3)
        with records.lock:  # an engine joins
            records.ports = [port["a"], port["b"], port["c"]]
        await eventually(lambda: _has(members, {member["c"]}), what="c joining")
        await asyncio.sleep(2)
        with records.lock:  # one leaves
            records.ports = [port["b"], port["c"]]
        await eventually(lambda: _gone(status_url, member["a"]), what="a leaving")
        left_at = await _submitted(engines["a"])
        await asyncio.sleep(2)
        async with httpx.AsyncClient() as c:  # one drains, its runs moving after 1 s
            drained = await c.post(
                f"{status_url}/admin/replicas/{member['b']}/drain",
                json={"deadline_s": 1},
                headers={"authorization": f"Bearer {TOKEN}"},
            )
        assert drained.status_code == 202, drained.text
        results = await asyncio.gather(*load)
        for rc, stdout, result in results:
            assert rc == 0, stdout
            assert result["error_count"] == 0, result.get("errors")
            assert result["classes"]["batch"]["runs"] > 0
        assert await _submitted(engines["a"]) == left_at  # nothing new after it left
        assert await _submitted(engines["c"]) > 0
        runs = sum(r["classes"]["batch"]["runs"] for _, _, r in results)
        by_engine = {n: await _submitted(e) for n, e in engines.items()}
        print(f"\nfleet flood: {runs} runs through 2 dataplanes, 0 errors; requests {by_engine}")

        async def quiet() -> bool:
            s = await _status(status_url)
            return s["held_total"] == 0 and all(r["in_flight"] == 0 for r in s["replicas"])

        await eventually(quiet, what="no turn held or in flight once the load stopped")
        final = {r["name"]: r for r in (await _status(status_url))["replicas"]}
        assert member["a"] not in final  # left and dropped
        assert final[member["b"]]["membership"] == "draining"
        assert final[member["c"]]["membership"] == "serving"
    finally:
        dns.stop()


async def _has(members: Any, wanted: set[str]) -> bool:
    return wanted <= await members()


async def _gone(status_url: str, name: str) -> bool:
    reps = (await _status(status_url))["replicas"]
    return all(r["name"] != name or r["membership"] == "leaving" for r in reps)


def test_records_answer_srv_and_a() -> None:
    """The test's DNS server itself (its records, as the scheduler will read them)."""
    records = Records()
    records.ports = [8001]
    reply = records.resolve(DNSRecord.question(POOL, "SRV"), None)
    assert [(rr.rdata.port, str(rr.rdata.target)) for rr in reply.rr] == [(8001, "127.0.0.1.")]
    answer = records.resolve(DNSRecord.question("x.test.", "A"), None)
    assert str(answer.rr[0].rdata) == "127.0.0.1"
