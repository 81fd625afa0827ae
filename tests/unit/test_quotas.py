"""B13: the callers' token limits as the scheduler service keeps them
(``scheduler/service/quotas.py``): a tokens-per-minute bucket and a UTC day's budget
per account, driven with explicit times; the usage file that keeps the day's totals
across restarts; the bounded ``caller`` label of the metrics."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.config import CallerConfig, SchedulerSettings
from luftpause.scheduler.core import CallerPolicy
from luftpause.scheduler.service.main import core_params, start_usage
from luftpause.scheduler.service.metrics import CallerLabels
from luftpause.scheduler.service.quotas import (
    DAILY,
    DAY_S,
    TPM,
    Limits,
    Quotas,
    UsageFile,
    day_text,
    utc_day,
)

NOON = 20_000 * DAY_S + DAY_S / 2  # a wall time: noon UTC of day 20000


def quotas(tpm: int | None = None, daily: int | None = None) -> Quotas:
    return Quotas({"alice": Limits(tpm, daily), "bob": Limits()})


# ------------------------------------------------------------------ tokens per minute


def test_the_bucket_refuses_once_spent_and_names_the_caller_and_the_limit() -> None:
    """B13: a full bucket admits; a finished turn that takes it to 0 or below makes the
    next turn of the account (a sub-caller's too) an OverQuota naming the caller, the
    limit and the whole seconds until the bucket is above 0 again."""
    q = quotas(tpm=600)  # refills 10 tokens a second
    assert q.admit("t1", "alice", 0.0, NOON) is None
    q.charge("alice/ci", 650, 1.0, NOON)  # a sub-caller spends its account's
    refused = q.admit("t2", "alice", 1.0, NOON)
    assert refused is not None
    assert (refused.turn_id, refused.caller, refused.limit) == ("t2", "alice", TPM)
    assert refused.retry_after_s == 6.0  # -50 + 10/s: 0 at 5 s, above 0 from 6 s
    assert refused.message == "caller 'alice' used its 600 tokens per minute; retry in 6 s"
    assert q.admit("t3", "alice/other", 1.0, NOON) is not None
    assert q.admit("t4", "alice", 6.0, NOON) is not None  # 5 s later: level 0, still out
    assert q.admit("t5", "alice", 7.0, NOON) is None  # 6 s later: above 0
    assert q.refused("alice") == {TPM: 3, DAILY: 0}


def test_callers_without_limits_and_unconfigured_callers_are_never_refused() -> None:
    """B13: limits are a configured caller's; others spend nothing that counts."""
    q = quotas(tpm=10)
    for who in ("bob", "bob/x", "carol", "", "alice2"):
        q.charge(who, 10**9, 0.0, NOON)
        assert q.admit("t", who, 0.0, NOON) is None
    assert not Quotas({"bob": Limits()}).limited


def test_the_bucket_refills_to_its_size_and_no_more() -> None:
    """B13: a caller idle for an hour has one minute's tokens, not sixty."""
    q = quotas(tpm=60)
    q.charge("alice", 30, 0.0, NOON)
    assert q.bucket("alice", 3600.0) == 60.0
    q.charge("alice", 60, 3600.0, NOON)
    assert q.admit("t", "alice", 3600.0, NOON) is not None


charges = st.lists(
    st.tuples(st.floats(0, 120, allow_nan=False), st.integers(0, 5_000)), max_size=30
)


@settings(max_examples=300, deadline=None)
@given(
    tpm=st.integers(1, 100_000),
    daily=st.one_of(st.none(), st.integers(1, 10**6)),
    steps=charges,
    start=st.floats(0, 10**6, allow_nan=False),
    wall=st.floats(0, 4 * 10**9, allow_nan=False),
)
def test_refused_then_admitted_retry_after_later(
    tpm: int, daily: int | None, steps: list[tuple[float, int]], start: float, wall: float
) -> None:
    """B13, property: whatever was charged, a caller is refused only over a limit, and
    once refused, ``retry_after_s`` later (nothing else charged) it is admitted; never
    earlier than one second."""
    q = quotas(tpm=tpm, daily=daily)
    now = start
    spent_today = 0
    for gap, tokens in steps:
        now += gap
        wall += gap
        refused = q.admit("t", "alice", now, wall)
        bucket = q.bucket("alice", now)
        assert bucket is not None
        over_daily = daily is not None and q.today("alice", wall) >= daily
        assert (refused is not None) == (bucket <= 0 or over_daily)
        if refused is not None:
            assert refused.retry_after_s >= 1 and refused.retry_after_s == int(
                refused.retry_after_s
            )
            later = refused.retry_after_s
            assert q.admit("t", "alice", now + later, wall + later) is None
        spent_today = q.today("alice", wall)
        q.charge("alice", tokens, now, wall)
        assert q.today("alice", wall) == spent_today + tokens


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.integers(1, 10_000),
    tpm=st.integers(1, 100_000),
    at=st.floats(0, 10**6, allow_nan=False),
)
def test_a_caller_under_its_limits_is_never_refused(tokens: int, tpm: int, at: float) -> None:
    """B13, property: a bucket above 0 and a day's total under the budget admit."""
    q = quotas(tpm=tpm + tokens, daily=tokens + 1)
    q.charge("alice", tokens, at, NOON)
    assert q.admit("t", "alice", at, NOON) is None
    assert q.admit("t", "alice/sub", at + 1.0, NOON + 1.0) is None


# ------------------------------------------------------------------ daily tokens


def test_the_daily_budget_refuses_until_the_next_utc_midnight() -> None:
    """B13: the day's total reaching the budget refuses until 00:00 UTC; Retry-After
    is the seconds until then; the next day starts at 0."""
    q = quotas(daily=1000)
    q.charge("alice", 1000, 0.0, NOON)
    refused = q.admit("t", "alice", 0.0, NOON)
    assert refused is not None and refused.limit == DAILY
    assert refused.retry_after_s == DAY_S / 2
    assert "1000 daily tokens" in refused.message
    assert q.admit("t", "alice", 1.0, NOON + DAY_S / 2 - 1) is not None
    assert q.admit("t", "alice", 2.0, NOON + DAY_S / 2) is None
    assert q.today("alice", NOON + DAY_S / 2) == 0
    just_before = (utc_day(NOON) + 1) * DAY_S - 0.25
    q.charge("alice", 1000, 3.0, NOON)
    late = q.admit("t", "alice", 3.0, just_before)
    assert late is not None and late.retry_after_s == 1.0  # at least a second


def test_both_limits_refusing_name_the_later() -> None:
    """B13: the caller can go only when both allow it."""
    q = quotas(tpm=60, daily=100)
    q.charge("alice", 200, 0.0, NOON)
    refused = q.admit("t", "alice", 0.0, NOON)
    assert refused is not None and refused.limit == DAILY


@settings(max_examples=200, deadline=None)
@given(
    day=st.integers(0, 40_000),
    offsets=st.lists(st.tuples(st.floats(0, DAY_S - 0.001), st.integers(0, 1000)), max_size=20),
)
def test_daily_totals_never_reset_within_a_day_and_do_at_midnight(
    day: int, offsets: list[tuple[float, int]]
) -> None:
    """B13, property: charges at any times of one UTC day (in any order of arrival)
    add up; the next day reads 0 until charged."""
    q = quotas(daily=10**9)
    total = 0
    for offset, tokens in offsets:
        q.charge("alice", tokens, 0.0, day * DAY_S + offset)
        total += tokens
        assert q.today("alice", day * DAY_S + offset) == total
    assert q.today("alice", (day + 1) * DAY_S) == 0
    q.charge("alice", 7, 0.0, (day + 1) * DAY_S)
    assert q.today("alice", (day + 1) * DAY_S + 5) == 7


# ------------------------------------------------------------------ the usage file


@settings(max_examples=100, deadline=None)
@given(spent=st.dictionaries(st.sampled_from(["alice", "bob", "carol"]), st.integers(1, 10**9)))
def test_the_usage_file_round_trips_and_survives_a_restart(
    tmp_path_factory: pytest.TempPathFactory, spent: dict[str, int]
) -> None:
    """B13, property: what one scheduler wrote, the next restores on the same UTC day
    (callers no longer configured left out), and ignores on another day."""
    path = tmp_path_factory.mktemp("usage") / "usage.json"
    before = Quotas({"alice": Limits(daily_tokens=10), "bob": Limits(), "carol": Limits()})
    for name, n in spent.items():
        before.charge(name, n, 0.0, NOON)
    UsageFile(path, before).save(NOON)
    after = Quotas({"alice": Limits(daily_tokens=10), "bob": Limits()})
    UsageFile(path, after).load(NOON + 3600)
    assert {n: after.today(n, NOON) for n in ("alice", "bob")} == {
        n: spent.get(n, 0) for n in ("alice", "bob")
    }
    if spent.get("alice", 0) >= 10:
        assert after.admit("t", "alice", 0.0, NOON) is not None
    tomorrow = Quotas({"alice": Limits(daily_tokens=10)})
    UsageFile(path, tomorrow).load(NOON + DAY_S)
    assert tomorrow.today("alice", NOON + DAY_S) == 0


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"version": 2, "day": "x", "tokens": {}}',
        b'{"version": 1, "day": "2024-10-04", "tokens": {"alice": -1}}',
        b'{"version": 1, "day": "2024-10-04", "tokens": {"alice": true}}',
        b"\xff\xfe",
    ],
)
def test_a_corrupt_usage_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: bytes
) -> None:
    """B13: a usage file that cannot be used is a warning and a fresh start, never a
    failed start."""
    path = tmp_path / "usage.json"
    path.write_bytes(body)
    q = quotas(daily=10)
    with caplog.at_level(logging.WARNING, logger="luftpause.scheduler"):
        UsageFile(path, q).load(NOON)
    assert q.today("alice", NOON) == 0
    assert "not usable" in caplog.text and str(path) in caplog.text


def test_the_usage_file_is_written_only_when_changed_and_whole(tmp_path: Path) -> None:
    """B13: no write while nothing changed; a write replaces the file (no temporary
    file left behind) with today's totals."""
    path = tmp_path / "usage.json"
    q = quotas(daily=10)
    usage = UsageFile(path, q)
    assert not usage.pending()
    usage.close(NOON)
    assert not path.exists()
    q.charge("alice", 3, 0.0, NOON)
    assert usage.pending()
    usage.close(NOON)
    assert json.loads(path.read_text()) == {
        "version": 1,
        "day": "2024-10-04",
        "tokens": {"alice": 3},
    }
    assert os.listdir(tmp_path) == ["usage.json"]
    assert not usage.pending()


# ------------------------------------------------------------------ config and labels


def test_core_params_carries_the_configured_callers() -> None:
    """B13: each configured caller's weight and in-flight limit reach the core."""
    callers = (
        CallerConfig(name="alice", key_env="A", weight=2.0, max_in_flight=3),
        CallerConfig(name="bob", key_env="B"),
    )
    params = core_params(SchedulerSettings(), (), callers)
    assert dict(params.callers) == {
        "alice": CallerPolicy(2.0, 3),
        "bob": CallerPolicy(1.0, None),
    }
    assert not core_params(SchedulerSettings()).callers


def test_caller_labels_are_bounded() -> None:
    """B13: configured names; up to 8 sub-callers each, the first seen, then NAME/other;
    any other caller is ``other``."""
    label = CallerLabels(["alice", "bob"])
    assert label("alice") == "alice" and label("bob") == "bob"
    subs = [label(f"alice/s{i}") for i in range(20)]
    assert subs[:8] == [f"alice/s{i}" for i in range(8)]
    assert set(subs[8:]) == {"alice/other"}
    assert label("alice/s3") == "alice/s3"  # a labelled sub-caller keeps its label
    assert label("alice/other") == "alice/other"
    assert label("bob/x") == "bob/x"
    for other in ("carol", "carol/x", "", "alic", "alice2/x"):
        assert label(other) == "other"
    values = {label(f"{n}/{i}") for n in ("alice", "bob", "x", "y") for i in range(100)}
    assert len(values) <= 2 * (8 + 1) + 1


class _Svc:
    def __init__(self) -> None:
        self.stops: list[object] = []

    def on_stop(self, hook: object) -> None:
        self.stops.append(hook)


def test_the_scheduler_warns_of_daily_budgets_kept_in_memory_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """B13: ``daily_tokens`` without ``[scheduler] usage_file`` is a warning at start
    (a restart starts the budgets afresh); no budget, no warning."""
    with caplog.at_level(logging.WARNING, logger="luftpause.scheduler"):
        assert start_usage(SchedulerSettings(), quotas(tpm=10), _Svc()) is None  # type: ignore[arg-type]
        assert "usage_file" not in caplog.text
        assert start_usage(SchedulerSettings(), quotas(daily=10), _Svc()) is None  # type: ignore[arg-type]
    assert "daily_tokens but [scheduler] usage_file is not set" in caplog.text


def test_the_scheduler_loads_the_usage_file_at_start_and_writes_it_at_stop(
    tmp_path: Path,
) -> None:
    """B13: with ``usage_file``, today's totals are read at start and written by the
    stop hook once they changed."""
    path = tmp_path / "usage.json"
    today = day_text(utc_day(time.time()))
    path.write_text(json.dumps({"version": 1, "day": today, "tokens": {"alice": 40}}))
    q = quotas(daily=100)
    svc = _Svc()
    usage = start_usage(SchedulerSettings(usage_file=str(path)), q, svc)  # type: ignore[arg-type]
    assert usage is not None and q.today("alice", time.time()) == 40
    q.charge("alice", 2, 0.0, time.time())
    (stop,) = svc.stops
    stop()  # type: ignore[operator]
    assert json.loads(path.read_text())["tokens"] == {"alice": 42}
