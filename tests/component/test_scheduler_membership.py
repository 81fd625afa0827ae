"""B11: the scheduler's replica set changes while it runs: members of configured endpoints
from its sources (``Membership.set_members``) and the bearer-protected admin routes join,
drain and remove replicas; the core sees the events, the prober follows, admissions are
answered with each member's own URL, and ``/status`` shows each replica's membership.
X2: the admin routes need the token, and without one configured they are refused."""

from __future__ import annotations

import time

import httpx

from luftpause.config import Endpoint
from luftpause.dataplane.context import Dataplane
from luftpause.members import entry_of, member_name
from luftpause.scheduler.core import EndpointKind, Params, ReplicaSpec, initial_state
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.membership import Membership
from luftpause.scheduler.service.probe import Prober
from luftpause.scheduler.service.status_http import status_app

TOKEN = "admin-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
STATIC = Endpoint(name="a", url="http://127.0.0.1:1", models=("m",))
POOL = Endpoint(name="pool", url="http://engines.example:30000", models=("m",), discover="dns")


def _stack() -> tuple[Host, Prober, Membership, dict[str, str]]:
    spec = ReplicaSpec("a", EndpointKind.GENERATIVE, frozenset({"m"}))
    host = Host(initial_state((spec,), Params(), time.monotonic()), time.monotonic)
    prober = Prober((STATIC,), {}, 2.0, host.post)
    urls = {"a": STATIC.url}
    return host, prober, Membership((STATIC, POOL), host, prober, urls), urls


def test_member_names_carry_their_entry() -> None:
    """B11: ``ENTRY@HOST:PORT``, the port explicit, IPv6 in brackets; the entry is found
    again before the ``@``."""
    assert member_name("pool", "http://10.0.0.5:30000/") == "pool@10.0.0.5:30000"
    assert member_name("pool", "https://e.example") == "pool@e.example:443"
    assert member_name("pool", "http://[fd00::1]:8000") == "pool@[fd00::1]:8000"
    assert entry_of("pool@10.0.0.5:30000") == "pool" and entry_of("a") == "a"


def test_sources_join_and_leave_members_and_the_prober_follows() -> None:
    """B11: a source's member list is applied as a difference; a member listed by two
    sources stays until neither lists it; an entry not configured is ignored."""
    host, prober, membership, urls = _stack()
    membership.set_members("dns", "pool", ("http://10.0.0.5:30000", "http://10.0.0.6:30000"))
    membership.set_members("file", "pool", ("http://10.0.0.6:30000",))
    membership.set_members("dns", "nope", ("http://10.0.0.9:1",))
    host.drain()
    five, six = "pool@10.0.0.5:30000", "pool@10.0.0.6:30000"
    assert {five, six} <= set(host.state.replicas)
    assert urls[five] == "http://10.0.0.5:30000"
    assert sorted(e.name for e in prober.endpoints) == ["a", five, six]
    assert host.state.serving[(EndpointKind.GENERATIVE, "m")] == ("a", five, six)
    membership.set_members("dns", "pool", ())  # the pool scaled to zero
    host.drain()
    assert five not in host.state.replicas  # left, and dropped: nothing referred to it
    assert six in host.state.replicas and six not in host.state.left  # the file lists it
    assert sorted(e.name for e in prober.endpoints) == ["a", six]


async def test_admin_routes_add_drain_and_remove_replicas() -> None:
    """B11, X2: add a member, drain the static replica with a deadline, remove the member;
    each answer names the replica; bad input is a 400 naming the problem, an unknown name
    a 404; /status shows the membership."""
    host, _, membership, _ = _stack()
    app = status_app(host, time.monotonic, dict, token=TOKEN, membership=membership)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        added = await c.post(
            "/admin/endpoints/pool/members", json={"url": "http://10.0.0.7:30000"}, headers=AUTH
        )
        assert added.status_code == 201 and added.json()["replica"] == "pool@10.0.0.7:30000"
        drained = await c.post("/admin/replicas/a/drain", json={"deadline_s": 30}, headers=AUTH)
        assert drained.status_code == 202 and drained.json()["draining"] is True
        host.drain()
        view = {r["name"]: r for r in (await c.get("/status", headers=AUTH)).json()["replicas"]}
        assert view["a"]["membership"] == "draining"
        assert 0 < view["a"]["drain_moves_s_from_now"] <= 30
        assert view["pool@10.0.0.7:30000"]["membership"] == "serving"
        removed = await c.delete("/admin/replicas/pool@10.0.0.7:30000", headers=AUTH)
        assert removed.status_code == 202
        host.drain()
        view = {r["name"]: r for r in (await c.get("/status", headers=AUTH)).json()["replicas"]}
        assert view.get("pool@10.0.0.7:30000", {"membership": "gone"})["membership"] in (
            "leaving",
            "gone",
        )
        bad = [
            await c.post("/admin/endpoints/pool/members", json={"url": 5}, headers=AUTH),
            await c.post("/admin/endpoints/pool/members", content=b"[", headers=AUTH),
            await c.post("/admin/replicas/a/drain", json={"deadline_s": -1}, headers=AUTH),
            await c.post("/admin/endpoints/pool/members", json={"url": "ftp://x"}, headers=AUTH),
        ]
        assert [r.status_code for r in bad] == [400] * 4
        assert all(r.json()["error"]["message"] for r in bad)
        unknown = [
            await c.post("/admin/endpoints/zz/members", json={"url": "http://h:1"}, headers=AUTH),
            await c.post("/admin/replicas/zz/drain", headers=AUTH),
            await c.delete("/admin/replicas/zz", headers=AUTH),
        ]
        assert [r.status_code for r in unknown] == [404] * 3
        assert (await c.delete("/admin/replicas/a")).status_code == 401  # no token


async def test_admin_routes_are_refused_without_a_token_configured() -> None:
    """X2: with no LUFTPAUSE_TOKEN anyone could remove replicas, so the routes say 403."""
    host, _, membership, _ = _stack()
    app = status_app(host, time.monotonic, dict, token=None, membership=membership)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        refused = await c.delete("/admin/replicas/a")
        assert refused.status_code == 403
        assert "LUFTPAUSE_TOKEN" in refused.json()["error"]["message"]
    assert "a" not in host.state.left


def test_the_dataplane_serves_a_member_with_its_entrys_settings() -> None:
    """B11: an admission to ``pool@10.0.0.5:30000`` teaches the dataplane that replica:
    the entry's settings at the member's own URL; names without an entry are ignored."""
    dp = Dataplane.__new__(Dataplane)
    dp.endpoints = {"pool": POOL.model_copy(update={"class_priority": None})}
    dp.learn_replica("pool@10.0.0.5:30000", "http://10.0.0.5:30000/")
    dp.learn_replica("other@10.0.0.5:1", "http://10.0.0.5:1")
    member = dp.endpoints["pool@10.0.0.5:30000"]
    assert member.url == "http://10.0.0.5:30000" and member.models == ("m",)
    assert member.discover == "static" and "other@10.0.0.5:1" not in dp.endpoints


def test_a_dropped_replica_takes_its_admission_series_with_it() -> None:
    """B11: the per-replica admission counter of a member that left and was dropped is
    removed from /metrics (a churning fleet must not grow the series without bound)."""
    from luftpause.scheduler.core import (
        ClockTicked,
        ReplicaProbed,
        ServiceClass,
        TurnFinished,
        TurnRequested,
    )

    host, _, membership, _ = _stack()
    membership.set_members("dns", "pool", ("http://10.0.0.5:30000",))
    host.drain()
    name = "pool@10.0.0.5:30000"
    host.post(lambda at: ReplicaProbed(at, name, True, 0, 0))
    host.post(
        lambda at: TurnRequested(
            at, "t1", "r1", "m", ServiceClass.BATCH, "c", EndpointKind.GENERATIVE, "dp"
        )
    )
    host.drain()
    assert f'replica="{name}"' in host.metrics.render()[0].decode()
    membership.set_members("dns", "pool", ())
    host.post(lambda at: TurnFinished(at, "t1", False))
    host.post(lambda at: ClockTicked(at))  # (dropped on the next event: nothing refers to it)
    host.drain()
    assert name not in host.state.replicas
    text = host.metrics.render()[0].decode()
    assert f'luftpause_scheduler_admissions_total{{replica="{name}"' not in text
