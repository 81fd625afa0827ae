"""R14: the pure parts of the runtime's dataplane client - Retry-After and backoff."""

from __future__ import annotations

import email.utils
import time

import pytest

from luftpause.runtime.llm import DataplaneClient, retry_after_s


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3.0),
        ("0.25", 0.25),
        ("0", 0.0),
        ("-4", 0.0),
        (None, 1.0),
        ("", 1.0),
        ("soon", 1.0),
        ("inf", 1.0),
        ("nan", 1.0),
        ("Mon, 99 Foo 2024 99:99:99 GMT", 1.0),
    ],
)
def test_retry_after_seconds_and_fallbacks(value: str | None, expected: float) -> None:
    """R14: delta-seconds as given (never negative); missing or unreadable: the default."""
    assert retry_after_s(value, 1.0) == expected


def test_retry_after_as_an_http_date() -> None:
    """R14: an HTTP date means "until then"; one already past means "now"."""
    future = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100.0 < retry_after_s(future, 1.0) <= 121.0
    past = email.utils.formatdate(time.time() - 120, usegmt=True)
    assert retry_after_s(past, 1.0) == 0.0


def test_backoff_is_exponential_with_jitter() -> None:
    """R14: the n-th transient failure waits base * 2**(n-1) times a factor in [0.5, 1.5),
    so runs that failed together do not retry together."""
    client = DataplaneClient(
        "http://dataplane.test",
        token=None,
        turn_timeout_s=1.0,
        retry_after_default_s=1.0,
        transient_backoff_s=0.5,
    )
    for failures, base in ((1, 0.5), (2, 1.0), (3, 2.0)):
        waits = [client.backoff_s(failures) for _ in range(200)]
        assert all(0.5 * base <= w < 1.5 * base for w in waits)
        assert len(set(waits)) > 100  # spread, not one value
