"""B11: the sources that say which replicas a configured endpoint has right now.

Two sources feed a membership owner (anything with ``set_members``, :class:`MemberSink`);
each says, per configured ``[[endpoints]]`` entry, the full set of member base URLs it
knows of, and the owner diffs that against what the same source said before. An empty
tuple means the source lists no member for that entry.

**DNS** (:class:`DnsSource`, an entry with ``discover = "dns"``): the host of the entry's
``url`` is resolved every ``discover_every_s``.

* A host starting with ``_`` (``_http._tcp.sglang.ns.svc.cluster.local``) is an SRV name:
  each record's (target, port) gives ``scheme://ADDRESS:PORT`` for every A/AAAA address
  of the target. The addresses are taken from the answer's additional section when it
  carries the target's records (a Kubernetes headless Service's does); otherwise the
  target is resolved with its own A and AAAA queries. A target with no address (or the
  SRV "no service" target ``.``) adds no member. The URL's own port is not used.
* Any other host is resolved for A and AAAA: each address gives ``scheme://ADDRESS:PORT``
  with the URL's port (80 or 443 by scheme when it has none).
* A host that is already an IP address is its own single member.

The URL's scheme and path are kept; IPv6 addresses are bracketed. The set is sorted and
de-duplicated; the sink hears it the first time and whenever it changes. NXDOMAIN or an
answer without records is an empty set (the pool scaled to zero). A failed resolution
(timeout, SERVFAIL, no nameserver answering) keeps the last good set: the sink is not
called, and one warning naming the entry and the error is logged per streak of failures.
Names are resolved as written (the resolver's search list applies only where the
resolver is set to use it by default): write the full name.

**A members file** (:class:`MembersFile`, ``[scheduler] members_file``): a TOML file (the
name ends in ``.toml``) or a JSON file (any other name) holding one table or object,
entry name → list of ``http(s)://host[:port]`` URLs. Every name must be a configured
entry; each URL is written back with its port (80 or 443 when it has none) and no
trailing ``/``, sorted and de-duplicated. The file's (mtime, size, inode) is checked
every ``members_file_every_s``; a changed file is read again and the sink hears every
entry the new file names or the last good one named (an entry dropped from the file gets
``()``). A file that cannot be used is logged once, naming the file and the problem, and
the last good one is kept; a missing file is an empty one (logged once). Writers should
replace the file atomically (write elsewhere, then rename): a half-written file is
either rejected or, if it parses, taken as written.

This module knows nothing of the scheduler core or the host: it reads the configuration
and talks to DNS and the file system.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import tomllib
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from luftpause.config import Endpoint
from luftpause.members import DEFAULT_PORTS

log = logging.getLogger("luftpause.scheduler.discovery")


class MemberSink(Protocol):
    """The membership owner: hears a source's full member set for one entry."""

    def set_members(self, source: str, entry: str, urls: tuple[str, ...]) -> None:
        """``source`` ("dns", "file") now lists ``urls`` for ``entry`` (``()``: none)."""


def _address_url(scheme: str, address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}{path}"


def _sorted_unique(urls: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(urls)))


# --- DNS -------------------------------------------------------------------------------


def a_urls(scheme: str, addresses: Iterable[str], port: int, path: str) -> tuple[str, ...]:
    """The member URLs of A/AAAA ``addresses``: ``scheme://ADDRESS:PORT/path``, sorted."""
    return _sorted_unique(_address_url(scheme, a, port, path) for a in addresses)


def srv_urls(
    scheme: str,
    targets: Iterable[tuple[str, int]],
    addresses: Mapping[str, Collection[str]],
    path: str,
) -> tuple[str, ...]:
    """The member URLs of SRV ``(target, port)`` pairs, given each target's addresses.

    Target names are compared without their trailing dot and case; a target missing from
    ``addresses`` (or with none) adds no member.
    """
    urls = []
    for target, port in targets:
        for address in addresses.get(_norm_name(target), ()):
            urls.append(_address_url(scheme, address, port, path))
    return _sorted_unique(urls)


def _norm_name(name: str) -> str:
    return name.rstrip(".").lower()


class DnsSource:
    """Resolves a ``discover = "dns"`` entry's host and tells the sink its members."""

    SOURCE = "dns"

    def __init__(
        self,
        entry: Endpoint,
        sink: MemberSink,
        resolver: dns.asyncresolver.Resolver | None = None,
    ) -> None:
        parts = urlsplit(entry.url)
        if not parts.hostname:
            raise ValueError(f"endpoint {entry.name!r}: url {entry.url!r} has no host")
        self.entry = entry
        self._sink = sink
        self._resolver = resolver if resolver is not None else dns.asyncresolver.Resolver()
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or DEFAULT_PORTS[parts.scheme]
        self._path = parts.path.rstrip("/")
        self._failing = False
        self._last: tuple[str, ...] | None = None

    @property
    def members(self) -> tuple[str, ...] | None:
        """The last set the sink heard (``None`` before the first good resolution)."""
        return self._last

    async def resolve_once(self) -> tuple[str, ...] | None:
        """The entry's member URLs now, or ``None`` if resolution failed (logged)."""
        try:
            urls = await self._resolve()
        except (dns.exception.DNSException, OSError) as error:
            if not self._failing:
                log.warning(
                    "endpoint %s: resolving %s failed (%s: %s); keeping its last members",
                    self.entry.name,
                    self._host,
                    type(error).__name__,
                    error,
                )
            self._failing = True
            return None
        if self._failing:
            log.info("endpoint %s: %s resolves again", self.entry.name, self._host)
        self._failing = False
        return urls

    async def refresh(self) -> None:
        """Resolve once; tell the sink when the set is new or changed."""
        urls = await self.resolve_once()
        if urls is not None and urls != self._last:
            self._last = urls
            self._sink.set_members(self.SOURCE, self.entry.name, urls)

    async def run_forever(self) -> None:
        """:meth:`refresh` every ``discover_every_s`` (counted from each start)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.refresh()
            await asyncio.sleep(max(0.0, started + self.entry.discover_every_s - loop.time()))

    async def _resolve(self) -> tuple[str, ...]:
        try:
            ipaddress.ip_address(self._host)
        except ValueError:
            pass
        else:
            return a_urls(self._scheme, [self._host], self._port, self._path)
        if self._host.startswith("_"):
            return await self._resolve_srv()
        return a_urls(self._scheme, await self._addresses(self._host), self._port, self._path)

    async def _addresses(self, name: str) -> list[str]:
        """A and AAAA addresses of ``name``; none when it does not exist or has none."""
        found: list[str] = []
        for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            try:
                answer = await self._resolver.resolve(name, rdtype, raise_on_no_answer=False)
            except dns.resolver.NXDOMAIN:
                return []
            if answer.rrset is not None:
                found.extend(rdata.to_text() for rdata in answer.rrset)
        return found

    async def _resolve_srv(self) -> tuple[str, ...]:
        try:
            answer = await self._resolver.resolve(
                self._host, dns.rdatatype.SRV, raise_on_no_answer=False
            )
        except dns.resolver.NXDOMAIN:
            return ()
        if answer.rrset is None:
            return ()
        targets = [
            (rdata.target.to_text(), int(rdata.port))
            for rdata in answer.rrset
            if rdata.target != dns.name.root
        ]
        addresses: dict[str, list[str]] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                name = _norm_name(rrset.name.to_text())
                addresses.setdefault(name, []).extend(r.to_text() for r in rrset)
        for target, _ in targets:
            name = _norm_name(target)
            if name not in addresses:
                addresses[name] = await self._addresses(target)
        return srv_urls(self._scheme, targets, addresses, self._path)


# --- the members file ------------------------------------------------------------------


class MembersFileError(ValueError):
    """The members file cannot be used; the message says why."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise MembersFileError(f"{key!r} is given twice")
        seen[key] = value
    return seen


def check_member_url(url: object) -> str:
    """``url`` as ``scheme://host:port`` (port written out), or :class:`MembersFileError`."""
    if not isinstance(url, str):
        raise MembersFileError(f"a URL must be a string, got {url!r}")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise MembersFileError(f"{url!r} has a bad port") from None
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or any(c.isspace() for c in url)
    ):
        raise MembersFileError(f"{url!r} is not an http(s)://host[:port] URL")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{port or DEFAULT_PORTS[parts.scheme]}"


def parse_members(text: str, *, toml: bool, entries: Collection[str]) -> dict[str, tuple[str, ...]]:
    """The members file's content: entry name → sorted, de-duplicated member URLs.

    ``toml`` picks the format (else JSON); every name must be one of ``entries``.
    Raises :class:`MembersFileError` naming the problem.
    """
    data: object
    try:
        if toml:
            data = tomllib.loads(text)
        else:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except tomllib.TOMLDecodeError as error:
        raise MembersFileError(f"not valid TOML: {error}") from None
    except json.JSONDecodeError as error:
        raise MembersFileError(f"not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise MembersFileError(f"must be an object of endpoint → URLs, got {type(data).__name__}")
    members: dict[str, tuple[str, ...]] = {}
    for name, urls in data.items():
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise MembersFileError(f"{name!r} is not a configured endpoint (configured: {known})")
        if not isinstance(urls, list):
            raise MembersFileError(f"{name}: must be a list of URLs, got {type(urls).__name__}")
        try:
            members[name] = _sorted_unique(check_member_url(u) for u in urls)
        except MembersFileError as error:
            raise MembersFileError(f"{name}: {error}") from None
    return members


_NEVER = object()


class MembersFile:
    """Watches ``[scheduler] members_file`` and tells the sink each entry's members."""

    SOURCE = "file"

    def __init__(
        self,
        path: str,
        entries: Mapping[str, Endpoint],
        sink: MemberSink,
        every_s: float,
    ) -> None:
        self.path = path
        self._entries = entries
        self._sink = sink
        self._every_s = every_s
        self._toml = path.endswith(".toml")
        self._good: dict[str, tuple[str, ...]] = {}
        self._seen: object = _NEVER  # (mtime_ns, size, inode); None: missing
        self._missing_logged = False

    @property
    def members(self) -> Mapping[str, tuple[str, ...]]:
        """The last good file's content (empty before one, or while the file is missing)."""
        return dict(self._good)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load_once(self) -> bool:
        """Read the file and apply it; ``False`` (logged, last good kept) if it is bad.

        A missing file is applied as an empty one (``True``).
        """
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning("members file %s: not found; no member from it", self.path)
                self._missing_logged = True
            self._apply({})
            return True
        except OSError as error:
            log.warning(
                "members file %s: cannot be read (%s); keeping the last good one",
                self.path,
                error,
            )
            return False
        self._missing_logged = False
        try:
            text = raw.decode("utf-8")
            members = parse_members(text, toml=self._toml, entries=self._entries.keys())
        except (UnicodeDecodeError, MembersFileError) as error:
            log.warning("members file %s: %s; keeping the last good one", self.path, error)
            return False
        self._apply(members)
        return True

    def _apply(self, members: dict[str, tuple[str, ...]]) -> None:
        names = sorted(set(self._good) | set(members))
        self._good = members
        for name in names:
            self._sink.set_members(self.SOURCE, name, members.get(name, ()))

    def poll(self) -> bool:
        """Load the file if its (mtime, size, inode) changed since the last look.

        Returns whether it was loaded. The first look always loads; the file going
        missing is a change too.
        """
        key = self._stat()
        if key == self._seen:
            return False
        self._seen = key
        self.load_once()
        return True

    async def run_forever(self) -> None:
        """Load the file now, then look for a change every ``every_s``."""
        self._seen = _NEVER
        while True:
            self.poll()
            await asyncio.sleep(self._every_s)
