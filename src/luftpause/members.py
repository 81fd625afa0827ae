"""How a replica discovered at run time is named after the endpoint it belongs to (B11).

A configured ``[[endpoints]]`` entry may be a pool whose replicas change while luftpause
runs (DNS, the members file, the scheduler's admin route). Each such replica is named
``ENTRY@HOST:PORT``; the dataplane and the scheduler find its settings (API key, metrics,
class priority, native APIs…) on the entry before the ``@``. Entry names cannot contain
``@`` (``config.Endpoint.name``), so the split is unambiguous.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SEPARATOR = "@"
DEFAULT_PORTS = {"http": 80, "https": 443}  # a URL without a port


def entry_of(replica: str) -> str:
    """The configured endpoint a replica belongs to: itself, or the part before ``@``."""
    return replica.split(SEPARATOR, 1)[0]


def member_name(entry: str, url: str) -> str:
    """``ENTRY@HOST:PORT`` for a replica of ``entry`` at ``url`` (the port made explicit;
    an IPv6 host in brackets). Raises ``ValueError`` for a URL without a host."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host or parts.scheme not in DEFAULT_PORTS:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    shown = f"[{host}]" if ":" in host else host
    return f"{entry}{SEPARATOR}{shown}:{port}"
