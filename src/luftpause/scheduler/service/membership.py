"""B11: the replicas that join, drain and leave while the scheduler runs.

The static ``[[endpoints]]`` are replicas from the start. Besides them, a configured entry
may have *members*, replicas named ``ENTRY@HOST:PORT`` (``luftpause.members``) that carry
the entry's settings at their own URL. Sources say which members an entry has: a DNS pool
(``discover = "dns"``), the watched members file, the admin route. Each source's word is
kept per entry (``set_members``), and a member lives while any source lists it. This
module turns changes of that union into the core's events (``ReplicaJoined`` /
``ReplicaLeft``), starts and stops probing the member, and keeps the URL the scheduler
answers admissions with. Draining (``ReplicaDraining``) is the admin route's: a replica,
static or member, takes no new runs and its runs move at the drain time.

A member that leaves keeps its URL here until the core has dropped it, so a re-sent
admission for a turn still in flight there is answered with the same URL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping

from luftpause.config import Endpoint
from luftpause.config import EndpointKind as ConfigKind
from luftpause.members import SEPARATOR, entry_of, member_name
from luftpause.scheduler.core import (
    EndpointKind,
    ReplicaDraining,
    ReplicaJoined,
    ReplicaLeft,
    ReplicaSpec,
)
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.probe import Prober

log = logging.getLogger("luftpause.scheduler")

ADMIN = "admin"  # the admin route's source name


def replica_spec(endpoint: Endpoint) -> ReplicaSpec:
    """The core's view of a configured endpoint (or of a member, with its entry's
    settings)."""
    return ReplicaSpec(
        name=endpoint.name,
        kind=EndpointKind.SINGLE_PASS
        if endpoint.kind is ConfigKind.SINGLE_PASS
        else EndpointKind.GENERATIVE,
        models=frozenset(endpoint.models),
        orders_classes=endpoint.class_priority is not None,
    )


class UnknownReplica(LookupError):
    """The admin route named a replica the scheduler does not have."""


class Membership:
    """The members of configured entries, from every source; see the module docstring."""

    def __init__(
        self,
        endpoints: Iterable[Endpoint],
        host: Host,
        prober: Prober,
        urls: MutableMapping[str, str],
    ) -> None:
        self.entries: Mapping[str, Endpoint] = {e.name: e for e in endpoints}
        self.host = host
        self.prober = prober
        self.urls = urls  # name -> base URL, as admissions are answered (shared with gRPC)
        self._said: dict[tuple[str, str], dict[str, str]] = {}  # (source, entry) -> members
        self.members: dict[str, Endpoint] = {}  # the live members

    # ------------------------------------------------------------------ sources

    def set_members(self, source: str, entry: str, urls: Iterable[str]) -> None:
        """``source`` now lists exactly ``urls`` as ``entry``'s members (empty: none)."""
        if entry not in self.entries:
            log.warning("%s names endpoint %r, which is not configured: ignored", source, entry)
            return
        said: dict[str, str] = {}
        for url in urls:
            try:
                said[member_name(entry, url)] = url.rstrip("/")
            except ValueError as exc:
                log.warning("%s: endpoint %r: %s: ignored", source, entry, exc)
        if said:
            self._said[(source, entry)] = said
        else:
            self._said.pop((source, entry), None)
        self._reconcile()

    def add(self, entry: str, url: str) -> str:
        """The admin route adds a member of ``entry`` at ``url``; returns its name.
        Raises ``UnknownReplica`` for an entry not configured, ``ValueError`` for a bad
        URL."""
        if entry not in self.entries:
            raise UnknownReplica(f"no endpoint {entry!r} is configured")
        name = member_name(entry, url)
        self._said.setdefault((ADMIN, entry), {})[name] = url.rstrip("/")
        self._reconcile()
        return name

    def remove(self, name: str) -> None:
        """The admin route removes a replica: a member leaves whatever lists it (a source
        that lists it again adds it again); a static replica leaves until a restart."""
        if name in self.members:
            for said in self._said.values():
                said.pop(name, None)
            self._said = {k: v for k, v in self._said.items() if v}
            self._reconcile()
            return
        if name not in self.host.state.replicas or name in self.host.state.left:
            raise UnknownReplica(f"no replica {name!r}")
        self.prober.remove(name)
        self.host.post(_leaves(name))
        log.info("replica %s removed", name)

    def drain(self, name: str, deadline_s: float | None) -> None:
        """The admin route drains a replica: no new runs from now; its runs move after
        ``deadline_s`` (None: at their next turn)."""
        state = self.host.state
        if name not in state.replicas or name in state.left:
            raise UnknownReplica(f"no replica {name!r}")
        self.host.post(
            lambda at: ReplicaDraining(at, name, None if deadline_s is None else at + deadline_s)
        )
        log.info(
            "replica %s draining%s",
            name,
            "" if deadline_s is None else f"; its runs move in {deadline_s:g} s",
        )

    # ------------------------------------------------------------------ effects

    def _reconcile(self) -> None:
        wanted: dict[str, str] = {}
        for said in self._said.values():
            for name, url in said.items():
                wanted.setdefault(name, url)
        for name in sorted(set(self.members) - set(wanted)):
            del self.members[name]
            self.prober.remove(name)
            self.host.post(_leaves(name))
            log.info("replica %s left", name)
        for name in sorted(set(wanted) - set(self.members)):
            entry = self.entries[entry_of(name)]
            member = entry.model_copy(update={"name": name, "url": wanted[name]})
            self.members[name] = member
            self.urls[name] = member.url
            self.prober.add(member)
            spec = replica_spec(member)
            self.host.post(_joins(spec))
            log.info("replica %s joined at %s", name, member.url)
        gone = [
            n
            for n in self.urls
            if SEPARATOR in n and n not in self.members and n not in self.host.state.replicas
        ]
        for name in gone:  # (dropped by the core: no turn in flight there any more)
            del self.urls[name]


def _leaves(name: str) -> Callable[[float], ReplicaLeft]:
    return lambda at: ReplicaLeft(at, name)


def _joins(spec: ReplicaSpec) -> Callable[[float], ReplicaJoined]:
    return lambda at: ReplicaJoined(at, spec)
