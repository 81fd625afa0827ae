"""The dataplane's request headers (D1, D3): looked up once per name as starlette's
``Headers`` answers - a name's first value, any case asked - with every header,
repeated ones included, in ``items()``, ``keys()`` and ``len()``."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from luftpause.dataplane.asgi import RequestHeaders

RAW = [
    (b"x-luftpause-run-id", b"run-1"),
    (b"accept", b"text/event-stream"),
    (b"x-luftpause-run-id", b"run-2"),
    (b"x-odd", "\u00e9t\u00e9".encode("latin-1")),
]


def test_request_headers_answer_as_starlette_headers_do() -> None:
    ours, theirs = RequestHeaders(RAW), Headers(raw=RAW)
    for name in ("x-luftpause-run-id", "X-Luftpause-Run-Id", "accept", "x-odd", "missing"):
        assert ours.get(name) == theirs.get(name), name
        assert ours.get(name, "d") == theirs.get(name, "d"), name
        assert (name in ours) == (name in theirs), name
    assert ours["X-Odd"] == theirs["X-Odd"] == "\u00e9t\u00e9"
    assert ours.items() == theirs.items()
    assert list(ours) == list(theirs.keys()) and len(ours) == len(theirs.raw) == 4
    assert ours.get("x-luftpause-run-id") == "run-1"  # the first of a repeated name
    assert 3 not in ours
    with pytest.raises(KeyError):
        ours["missing"]
