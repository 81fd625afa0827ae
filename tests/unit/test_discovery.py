"""B11: the discovery sources' pure parts: the members file (format, validation, what the
sink hears as the file changes, goes bad or goes missing) and the mapping from A/AAAA
and SRV answers to member URLs.

The DNS source against a real DNS server is tests/component/test_discovery_dns.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from luftpause.config import Endpoint
from luftpause.members import member_name
from luftpause.scheduler.service.discovery import (
    DnsSource,
    MembersFile,
    MembersFileError,
    a_urls,
    check_member_url,
    parse_members,
    srv_urls,
)

ENTRIES = ("sglang", "vllm")


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    def set_members(self, source: str, entry: str, urls: tuple[str, ...]) -> None:
        self.calls.append((source, entry, urls))


def _endpoints() -> dict[str, Endpoint]:
    return {n: Endpoint(name=n, url="http://127.0.0.1:1", models=("m",)) for n in ENTRIES}


# --- parsing and validation ------------------------------------------------------------


def test_toml_and_json_give_sorted_unique_urls_with_their_ports() -> None:
    """B11: both formats; each URL gets its port written out, no trailing slash, sorted."""
    toml = """
sglang = ["http://10.0.0.6:30000", "http://10.0.0.5:30000/", "http://10.0.0.6:30000"]
vllm = ["https://Engine.example", "http://[::1]"]
"""
    want = {
        "sglang": ("http://10.0.0.5:30000", "http://10.0.0.6:30000"),
        "vllm": ("http://[::1]:80", "https://engine.example:443"),
    }
    assert parse_members(toml, toml=True, entries=ENTRIES) == want
    as_json = json.dumps({k: list(v) for k, v in want.items()})
    assert parse_members(as_json, toml=False, entries=ENTRIES) == want
    assert parse_members('{"sglang": []}', toml=False, entries=ENTRIES) == {"sglang": ()}
    assert parse_members("", toml=True, entries=ENTRIES) == {}


@pytest.mark.parametrize(
    ("text", "toml", "problem"),
    [
        ("sglang = [", True, "not valid TOML"),
        ('{"sglang": [}', False, "not valid JSON"),
        ('["http://a:1"]', False, "must be an object"),
        ('{"sglang": [], "sglang": []}', False, "given twice"),
        ('{"other": []}', False, "'other' is not a configured endpoint"),
        ('{"sglang": "http://a:1"}', False, "sglang: must be a list"),
        ('{"sglang": [5]}', False, "must be a string"),
        ('{"sglang": ["ftp://a:1"]}', False, "not an http(s)://host[:port] URL"),
        ('{"sglang": ["http://a:1/v1"]}', False, "not an http(s)://host[:port] URL"),
        ('{"sglang": ["http://a:1?x=1"]}', False, "not an http(s)://host[:port] URL"),
        ('{"sglang": ["http://u:p@a:1"]}', False, "not an http(s)://host[:port] URL"),
        ('{"sglang": ["http://:1"]}', False, "not an http(s)://host[:port] URL"),
        ('{"sglang": ["http://a:99999"]}', False, "bad port"),
        ('{"sglang": ["http://a:x"]}', False, "bad port"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_problem(text: str, toml: bool, problem: str) -> None:
    """B11: each way a members file can be wrong is refused with a message saying which."""
    with pytest.raises(MembersFileError) as caught:
        parse_members(text, toml=toml, entries=ENTRIES)
    assert problem in str(caught.value)


def test_check_member_url_and_member_name() -> None:
    """B11: ``NAME@HOST:PORT`` names, IPv6 bracketed, default ports filled in."""
    assert check_member_url("https://h") == "https://h:443"
    assert member_name("pool", "http://10.0.0.5:30000") == "pool@10.0.0.5:30000"
    assert member_name("pool", "http://[::1]:30000/v1") == "pool@[::1]:30000"
    assert member_name("pool", "https://h") == "pool@h:443"


# --- DNS answers to URLs ---------------------------------------------------------------


def test_a_and_aaaa_addresses_become_urls_with_the_port_and_path() -> None:
    """B11: each address is a member, IPv6 bracketed, the URL's path kept, sorted, unique."""
    got = a_urls("http", ["10.0.0.6", "fd00::1", "10.0.0.5", "10.0.0.6"], 30000, "/v1")
    assert got == (
        "http://10.0.0.5:30000/v1",
        "http://10.0.0.6:30000/v1",
        "http://[fd00::1]:30000/v1",
    )
    assert a_urls("https", [], 443, "") == ()


def test_srv_targets_become_their_addresses_with_the_record_port() -> None:
    """B11: each (target, port) gives one member per address of the target; a target
    without addresses gives none; names compare without the final dot or case."""
    targets = [("pod-a.pool.", 30000), ("POD-B.pool.", 30001), ("gone.pool.", 30002)]
    addresses = {"pod-a.pool": ["10.0.0.5"], "pod-b.pool": ["10.0.0.6", "fd00::6"]}
    assert srv_urls("http", targets, addresses, "") == (
        "http://10.0.0.5:30000",
        "http://10.0.0.6:30001",
        "http://[fd00::6]:30001",
    )


class NoResolver:
    async def resolve(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("an address needs no query")


async def test_an_address_host_is_its_own_member_without_a_query() -> None:
    """B11: ``discover = "dns"`` on an IP address: that one member, no DNS query."""
    for url, want in [
        ("http://10.0.0.5:30000", "http://10.0.0.5:30000"),
        ("https://[fd00::1]/v1", "https://[fd00::1]:443/v1"),
    ]:
        entry = Endpoint(name="pool", url=url, models=("m",), discover="dns")
        sink = Sink()
        source = DnsSource(entry, sink, resolver=NoResolver())  # type: ignore[arg-type]
        await source.refresh()
        await source.refresh()
        assert sink.calls == [("dns", "pool", (want,))]


# --- the file source -------------------------------------------------------------------


def _write(path: Path, data: dict[str, list[str]] | str) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_changed_file_tells_the_sink_every_entry_it_names_or_named(tmp_path: Path) -> None:
    """B11: the first load names each entry; an entry dropped later gets ``()``; an
    unchanged file is not read again."""
    path = tmp_path / "members.json"
    _write(path, {"sglang": ["http://10.0.0.5:30000"], "vllm": ["http://10.0.0.9:8000"]})
    sink = Sink()
    source = MembersFile(str(path), _endpoints(), sink, every_s=0.1)
    assert source.poll()
    assert sink.calls == [
        ("file", "sglang", ("http://10.0.0.5:30000",)),
        ("file", "vllm", ("http://10.0.0.9:8000",)),
    ]
    sink.calls.clear()
    assert not source.poll()
    assert sink.calls == []

    _write(path, {"sglang": ["http://10.0.0.5:30000", "http://10.0.0.6:30000"]})
    assert source.poll()
    assert sink.calls == [
        ("file", "sglang", ("http://10.0.0.5:30000", "http://10.0.0.6:30000")),
        ("file", "vllm", ()),
    ]


def test_a_toml_file_is_read_as_toml(tmp_path: Path) -> None:
    """B11: a name ending in ``.toml`` is TOML."""
    path = tmp_path / "members.toml"
    path.write_text('sglang = ["http://10.0.0.5:30000"]\n')
    sink = Sink()
    assert MembersFile(str(path), _endpoints(), sink, every_s=0.1).load_once()
    assert sink.calls == [("file", "sglang", ("http://10.0.0.5:30000",))]


def test_a_bad_file_is_logged_once_and_the_last_good_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B11: a file that cannot be used: one log line naming the file and the problem, the
    sink not called, the last good set kept; a good file later is applied against it."""
    caplog.set_level(logging.WARNING, "luftpause.scheduler.discovery")
    path = tmp_path / "members.json"
    _write(path, {"sglang": ["http://10.0.0.5:30000"]})
    sink = Sink()
    source = MembersFile(str(path), _endpoints(), sink, every_s=0.1)
    source.poll()
    sink.calls.clear()

    _write(path, {"sglang": ["http://10.0.0.5:30000"], "nope": []})
    assert source.poll()  # looked at, refused
    assert not source.load_once()
    source.poll()
    assert sink.calls == []
    assert source.members == {"sglang": ("http://10.0.0.5:30000",)}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # the poll and the explicit load_once: once per read
    assert str(path) in lines[0] and "'nope' is not a configured endpoint" in lines[0]

    _write(path, {"vllm": ["http://10.0.0.9:8000"]})
    assert source.poll()
    assert sink.calls == [("file", "sglang", ()), ("file", "vllm", ("http://10.0.0.9:8000",))]


def test_a_missing_file_is_an_empty_one_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B11: the file going away empties every entry it named; logged once while missing;
    it coming back is applied."""
    caplog.set_level(logging.WARNING, "luftpause.scheduler.discovery")
    path = tmp_path / "members.json"
    sink = Sink()
    source = MembersFile(str(path), _endpoints(), sink, every_s=0.1)
    assert source.poll()  # missing from the start: nothing to say
    assert sink.calls == []
    _write(path, {"sglang": ["http://10.0.0.5:30000"]})
    assert source.poll()
    path.unlink()
    assert source.poll()
    assert not source.poll()
    assert source.load_once()
    assert sink.calls == [
        ("file", "sglang", ("http://10.0.0.5:30000",)),
        ("file", "sglang", ()),
    ]
    missing = [r for r in caplog.records if "not found" in r.getMessage()]
    assert len(missing) == 2  # once at the start, once when it went away
    assert str(path) in missing[0].getMessage()
    _write(path, {"sglang": ["http://10.0.0.7:30000"]})
    assert source.poll()
    assert sink.calls[-1] == ("file", "sglang", ("http://10.0.0.7:30000",))


async def test_run_forever_applies_a_change_within_a_period(tmp_path: Path) -> None:
    """B11: the watcher loads at start and picks up a change on its own."""
    path = tmp_path / "members.json"
    _write(path, {"sglang": ["http://10.0.0.5:30000"]})
    sink = Sink()
    task = asyncio.create_task(
        MembersFile(str(path), _endpoints(), sink, every_s=0.02).run_forever()
    )
    try:
        async with asyncio.timeout(5):
            while not sink.calls:
                await asyncio.sleep(0.01)
            _write(path, {"sglang": ["http://10.0.0.6:30000"]})
            while sink.calls[-1] != ("file", "sglang", ("http://10.0.0.6:30000",)):
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert sink.calls == [
        ("file", "sglang", ("http://10.0.0.5:30000",)),
        ("file", "sglang", ("http://10.0.0.6:30000",)),
    ]
