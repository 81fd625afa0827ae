"""B11: the DNS discovery source against a real DNS server (dnslib, UDP on loopback)
whose records the test changes while the source runs.

A records become members; records changing (one added, one removed) reach the sink;
NXDOMAIN and an empty answer empty the pool; the server failing (SERVFAIL) or stopping
keeps the last good set with one warning per streak; SRV records become target:port
members, with the targets' addresses from the additional section or from a lookup of
their own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import dns.asyncresolver
import pytest
from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

from luftpause.config import Endpoint
from luftpause.scheduler.service.discovery import DnsSource

WAIT_S = 5.0
EVERY_S = 0.05
LOGGER = "luftpause.scheduler.discovery"

Records = dict[tuple[str, str], list[object]]


class Zone(BaseResolver):  # type: ignore[misc]
    """Answers from ``records`` ((name, type) → rdata); a name absent for every type is
    NXDOMAIN; ``additional`` is added to every answer; ``servfail`` fails everything."""

    def __init__(self) -> None:
        self.records: Records = {}
        self.additional: list[RR] = []
        self.servfail = False
        self.queries = 0
        self._lock = threading.Lock()

    def set(self, records: Records, additional: list[RR] | None = None) -> None:
        with self._lock:
            self.records = records
            self.additional = additional or []

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self._lock:
            self.queries += 1
            if self.servfail:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            if not any(n == name for n, _ in self.records):
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            for rdata in self.records.get((name, qtype), []):
                reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=0))
            if reply.rr:
                for rr in self.additional:
                    reply.add_ar(rr)
        return reply


@dataclass
class Dns:
    zone: Zone
    port: int
    server: DNSServer
    running: bool = True

    def stop(self) -> None:
        if self.running:
            self.server.stop()
            self.server.server.server_close()
            self.running = False

    def resolver(self) -> dns.asyncresolver.Resolver:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = ["127.0.0.1"]
        resolver.port = self.port
        resolver.timeout = 0.2
        resolver.lifetime = 0.5
        return resolver


@pytest.fixture
async def dns_server() -> AsyncIterator[Dns]:
    zone = Zone()
    server = DNSServer(zone, address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda _: None))
    server.start_thread()
    running = Dns(zone=zone, port=server.server.server_address[1], server=server)
    try:
        yield running
    finally:
        running.stop()


@dataclass
class Sink:
    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    def set_members(self, source: str, entry: str, urls: tuple[str, ...]) -> None:
        self.calls.append((source, entry, urls))

    async def wait_for(self, urls: tuple[str, ...]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not self.calls or self.calls[-1][2] != urls:
                await asyncio.sleep(0.01)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


def _pool(url: str) -> Endpoint:
    return Endpoint(name="pool", url=url, models=("m",), discover="dns", discover_every_s=EVERY_S)


@pytest.fixture
async def running() -> AsyncIterator[Callable[[DnsSource], None]]:
    tasks: list[asyncio.Task[None]] = []

    def start(source: DnsSource) -> None:
        tasks.append(asyncio.create_task(source.run_forever()))

    try:
        yield start
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_records_are_members_and_follow_changes(
    dns_server: Dns, running: Callable[[DnsSource], None]
) -> None:
    """B11: each A/AAAA address is a member with the URL's port and path; a record added
    and one removed reach the sink as the new set; NXDOMAIN and an empty answer are ``()``."""
    zone = dns_server.zone
    zone.set(
        {
            ("pool.test", "A"): [A("10.0.0.5"), A("10.0.0.6")],
            ("pool.test", "AAAA"): [AAAA("fd00::7")],
        }
    )
    sink = Sink()
    running(DnsSource(_pool("http://pool.test:30000/v1"), sink, dns_server.resolver()))
    await sink.wait_for(
        ("http://10.0.0.5:30000/v1", "http://10.0.0.6:30000/v1", "http://[fd00::7]:30000/v1")
    )
    assert sink.calls[0][:2] == ("dns", "pool")

    zone.set({("pool.test", "A"): [A("10.0.0.6"), A("10.0.0.8")]})
    await sink.wait_for(("http://10.0.0.6:30000/v1", "http://10.0.0.8:30000/v1"))

    zone.set({})  # NXDOMAIN: the pool scaled to zero
    await sink.wait_for(())

    zone.set({("pool.test", "A"): [A("10.0.0.9")]})
    await sink.wait_for(("http://10.0.0.9:30000/v1",))
    zone.set({("pool.test", "TXT"): []})  # the name exists, no address: empty answers
    await sink.wait_for(())

    # Each set was told once: an unchanged answer is not repeated.
    seen = zone.queries
    await _until(lambda: zone.queries >= seen + 6)
    assert [c[2] for c in sink.calls] == [
        ("http://10.0.0.5:30000/v1", "http://10.0.0.6:30000/v1", "http://[fd00::7]:30000/v1"),
        ("http://10.0.0.6:30000/v1", "http://10.0.0.8:30000/v1"),
        (),
        ("http://10.0.0.9:30000/v1",),
        (),
    ]


async def test_a_default_port_comes_from_the_scheme(
    dns_server: Dns, running: Callable[[DnsSource], None]
) -> None:
    """B11: a URL without a port gives members on 80 or 443."""
    dns_server.zone.set({("pool.test", "A"): [A("10.0.0.5")]})
    sink = Sink()
    running(DnsSource(_pool("https://pool.test"), sink, dns_server.resolver()))
    await sink.wait_for(("https://10.0.0.5:443",))


async def test_a_failing_server_keeps_the_last_good_set_with_one_warning(
    dns_server: Dns,
    running: Callable[[DnsSource], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """B11: SERVFAIL, then the server stopped: the sink is not called, the last good set
    stands, and each streak of failures logs one warning naming the entry and the error."""
    caplog.set_level(logging.INFO, LOGGER)
    zone = dns_server.zone
    zone.set({("pool.test", "A"): [A("10.0.0.5")]})
    sink = Sink()
    source = DnsSource(_pool("http://pool.test:30000"), sink, dns_server.resolver())
    failures = 0
    resolve_once = source.resolve_once

    async def counted() -> tuple[str, ...] | None:
        nonlocal failures
        urls = await resolve_once()
        failures += urls is None
        return urls

    source.resolve_once = counted  # type: ignore[method-assign]
    running(source)
    await sink.wait_for(("http://10.0.0.5:30000",))

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    zone.servfail = True
    await _until(lambda: failures >= 3)
    assert len(warnings()) == 1
    assert "endpoint pool" in warnings()[0] and "pool.test" in warnings()[0]

    zone.servfail = False  # recovers: unchanged, so the sink hears nothing new
    await _until(lambda: any("resolves again" in r.getMessage() for r in caplog.records))
    assert sink.calls == [("dns", "pool", ("http://10.0.0.5:30000",))]

    dns_server.stop()
    await _until(lambda: failures >= 6)
    assert len(warnings()) == 2
    assert "endpoint pool" in warnings()[1]
    assert sink.calls == [("dns", "pool", ("http://10.0.0.5:30000",))]
    assert source.members == ("http://10.0.0.5:30000",)


async def test_srv_records_are_target_and_port_members(
    dns_server: Dns, running: Callable[[DnsSource], None]
) -> None:
    """B11: each SRV (target, port) gives a member per address of the target: from the
    additional section when the answer carries it, else from the target's own A/AAAA;
    the URL's port is not used; a target without an address adds none."""
    zone = dns_server.zone
    srv = "_http._tcp.pool.test"
    zone.set(
        {
            (srv, "SRV"): [
                SRV(port=30000, target="pod-a.pool.test."),
                SRV(port=30001, target="pod-b.pool.test."),
            ],
        },
        additional=[
            RR("pod-a.pool.test.", QTYPE.A, rdata=A("10.0.0.5"), ttl=0),
            RR("pod-b.pool.test.", QTYPE.AAAA, rdata=AAAA("fd00::6"), ttl=0),
        ],
    )
    sink = Sink()
    running(DnsSource(_pool(f"http://{srv}:9999"), sink, dns_server.resolver()))
    await sink.wait_for(("http://10.0.0.5:30000", "http://[fd00::6]:30001"))

    # No additional section: the targets are looked up; pod-c has no address.
    zone.set(
        {
            (srv, "SRV"): [
                SRV(port=30000, target="pod-a.pool.test."),
                SRV(port=30002, target="pod-c.pool.test."),
            ],
            ("pod-a.pool.test", "A"): [A("10.0.0.15")],
        }
    )
    await sink.wait_for(("http://10.0.0.15:30000",))

    zone.set({})
    await sink.wait_for(())
