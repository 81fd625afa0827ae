"""B13: the configured callers' token limits, checked when a turn is asked for (Admit)
and charged when a finished turn is reported.

Two limits per configured caller (``[[callers]]``), both per *account* (a sub-caller
``alice/ci`` spends ``alice``'s, ``order.account``), both on prompt + completion tokens:

* ``tokens_per_minute``: a token bucket of that many tokens that refills at that many
  per minute (``tpm / 60`` per second, never above full). A finished turn's tokens are
  taken out after the fact, so the level may go below 0; a turn asked for while it is
  at or below 0 is refused, and ``retry_after_s`` is the whole seconds until it is
  above 0 again (at least 1).
* ``daily_tokens``: the tokens charged since 00:00 UTC. A turn asked for once they
  reach the budget is refused until the next UTC midnight (``retry_after_s``: the whole
  seconds until then, at least 1).

Both limits refusing: the later of the two is the one named. A caller that is not
configured, or configured without these limits, is never refused here (``max_in_flight``
holds turns in the core instead). Refusals are answered by the service: the core never
sees the turn.

:class:`Quotas` is pure and reads no clock: every call takes the monotonic time
(``now``, the bucket's) and the wall time (``wall``, Unix seconds, the UTC day's), so a
test drives it with any times it likes. :class:`UsageFile` keeps today's totals across
restarts (``[scheduler] usage_file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from luftpause.config import CallerConfig
from luftpause.scheduler.core.order import account

log = logging.getLogger("luftpause.scheduler")

TPM = "tokens_per_minute"
DAILY = "daily_tokens"
LIMITS = (TPM, DAILY)
DAY_S = 86_400
USAGE_VERSION = 1
SAVE_EVERY_S = 5.0


def utc_day(wall: float) -> int:
    """The UTC day (days since 1970-01-01) of a Unix time."""
    return math.floor(wall / DAY_S)


def day_text(day: int) -> str:
    return datetime.fromtimestamp(day * DAY_S, UTC).date().isoformat()


@dataclass(frozen=True, slots=True)
class Limits:
    """A configured caller's token limits (None: none)."""

    tokens_per_minute: int | None = None
    daily_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class OverQuota:
    """A turn refused for its account's token limit (answered as ``Rejected`` with
    ``REJECT_CODE_OVER_QUOTA``)."""

    turn_id: str
    caller: str  # the account whose limit is spent
    limit: str  # TPM or DAILY
    retry_after_s: float  # whole seconds, at least 1
    message: str


@dataclass(slots=True)
class _Account:
    limits: Limits
    level: float = 0.0  # the bucket's tokens at ``at`` (tokens_per_minute only)
    at: float | None = None  # None: never charged (the bucket is full)
    day: int = 0  # the UTC day ``today`` counts
    today: int = 0
    total: int = 0  # charged since start
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIMITS, 0))


class Quotas:
    """The token limits of the configured callers (see the module docstring)."""

    def __init__(self, limits: Mapping[str, Limits]) -> None:
        self._accounts = {name: _Account(lim) for name, lim in limits.items()}
        # Only these are ever checked: an empty dict makes ``admit`` one lookup.
        self._limited = {
            name: a
            for name, a in self._accounts.items()
            if a.limits.tokens_per_minute is not None or a.limits.daily_tokens is not None
        }
        self.version = 0  # bumped by every charge that changes today's totals

    @classmethod
    def of(cls, callers: Iterable[CallerConfig]) -> Quotas:
        return cls(
            {c.name: Limits(c.tokens_per_minute, c.daily_tokens) for c in callers},
        )

    @property
    def names(self) -> list[str]:
        """The configured callers, in configuration order."""
        return list(self._accounts)

    def limits(self, name: str) -> Limits | None:
        a = self._accounts.get(name)
        return None if a is None else a.limits

    @property
    def limited(self) -> bool:
        """Whether any configured caller has a token limit."""
        return bool(self._limited)

    @property
    def has_daily(self) -> bool:
        return any(a.limits.daily_tokens is not None for a in self._accounts.values())

    # ------------------------------------------------------------------ checks

    def admit(self, turn_id: str, caller: str, now: float, wall: float) -> OverQuota | None:
        """None if a turn of ``caller`` may be asked of the core now; else why not (and
        the refusal is counted)."""
        if not self._limited:
            return None
        name = account(caller)
        a = self._limited.get(name)
        if a is None:
            return None
        refusal = self._refusal(a, now, wall)
        if refusal is None:
            return None
        limit, retry = refusal
        a.refused[limit] += 1
        if limit == TPM:
            spent = f"its {a.limits.tokens_per_minute} tokens per minute"
        else:
            spent = f"its {a.limits.daily_tokens} daily tokens (the UTC day's budget)"
        return OverQuota(
            turn_id=turn_id,
            caller=name,
            limit=limit,
            retry_after_s=float(retry),
            message=f"caller {name!r} used {spent}; retry in {retry} s",
        )

    def _refusal(self, a: _Account, now: float, wall: float) -> tuple[str, int] | None:
        """The limit that refuses a turn now and the whole seconds until it would not
        (the later of the two when both refuse)."""
        found: tuple[str, int] | None = None
        if a.limits.tokens_per_minute is not None and self._bucket(a, now) <= 0:
            retry = max(1, math.floor(-self._bucket(a, now) * 60 / a.limits.tokens_per_minute))
            # Whole seconds: the first one at which the level, computed exactly as the
            # check computes it, is above 0 (no rounding can make it a second short).
            while self._bucket(a, now + retry) <= 0:
                retry += 1
            found = (TPM, retry)
        if a.limits.daily_tokens is not None and self._today(a, wall) >= a.limits.daily_tokens:
            retry = max(1, math.ceil((utc_day(wall) + 1) * DAY_S - wall))
            while utc_day(wall + retry) == utc_day(wall):
                retry += 1
            if found is None or retry > found[1]:
                found = (DAILY, retry)
        return found

    @staticmethod
    def _bucket(a: _Account, now: float) -> float:
        tpm = a.limits.tokens_per_minute
        assert tpm is not None
        if a.at is None:
            return float(tpm)
        return min(float(tpm), a.level + max(0.0, now - a.at) * tpm / 60.0)

    @staticmethod
    def _today(a: _Account, wall: float) -> int:
        return a.today if a.day == utc_day(wall) else 0

    # ------------------------------------------------------------------ charges

    def charge(self, caller: str, tokens: int, now: float, wall: float) -> None:
        """A finished turn of ``caller`` used ``tokens`` (prompt + completion)."""
        a = self._accounts.get(account(caller))
        if a is None or tokens <= 0:
            return
        if a.limits.tokens_per_minute is not None:
            level = self._bucket(a, now)
            a.level = level - tokens
            a.at = now if a.at is None else max(now, a.at)
        day = utc_day(wall)
        if day > a.day:  # (a wall clock stepped back over midnight keeps the newer day)
            a.day, a.today = day, 0
        a.today += tokens
        a.total += tokens
        self.version += 1

    # ------------------------------------------------------------------ reads

    def bucket(self, name: str, now: float) -> float | None:
        """The tokens left in ``name``'s bucket now (below 0 after an overdraft); None:
        no ``tokens_per_minute``."""
        a = self._accounts.get(name)
        if a is None or a.limits.tokens_per_minute is None:
            return None
        return self._bucket(a, now)

    def today(self, name: str, wall: float) -> int:
        a = self._accounts.get(name)
        return 0 if a is None else self._today(a, wall)

    def total(self, name: str) -> int:
        a = self._accounts.get(name)
        return 0 if a is None else a.total

    def refused(self, name: str) -> dict[str, int]:
        a = self._accounts.get(name)
        return dict.fromkeys(LIMITS, 0) if a is None else dict(a.refused)

    # ------------------------------------------------------------------ persistence

    def usage(self, wall: float) -> dict[str, Any]:
        """Today's totals as the usage file holds them."""
        day = utc_day(wall)
        return {
            "version": USAGE_VERSION,
            "day": day_text(day),
            "tokens": {name: a.today for name, a in self._accounts.items() if a.day == day},
        }

    def restore(self, data: Any, wall: float) -> int:
        """Take today's totals from a usage file's contents (``usage``): another day's
        are ignored, as are callers no longer configured. Returns how many callers were
        restored; raises ``ValueError`` for contents that are not a usage file."""
        if not isinstance(data, dict) or data.get("version") != USAGE_VERSION:
            raise ValueError(f"not a version {USAGE_VERSION} usage file")
        day, tokens = data.get("day"), data.get("tokens")
        if not isinstance(day, str) or not isinstance(tokens, dict):
            raise ValueError('expected {"version": 1, "day": "YYYY-MM-DD", "tokens": {...}}')
        for name, n in tokens.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"tokens of {name!r}: expected a whole number >= 0, got {n!r}")
        today = utc_day(wall)
        if day != day_text(today):
            return 0
        restored = 0
        for name, n in tokens.items():
            a = self._accounts.get(name)
            if a is not None:
                a.day, a.today = today, n
                restored += 1
        return restored


class UsageFile:
    """``[scheduler] usage_file``: today's totals, loaded at start and written
    atomically (a temporary file in the same directory, fsync, ``os.replace``) at most
    every :data:`SAVE_EVERY_S` while they change, and at shutdown."""

    def __init__(self, path: str | os.PathLike[str], quotas: Quotas) -> None:
        self.path = Path(path)
        self.quotas = quotas
        self._saved = quotas.version  # the quotas' version last written (or loaded)

    def load(self, wall: float) -> None:
        """Restore today's totals; a missing file is a fresh start, a file that cannot
        be used is logged and ignored (budgets start afresh), never fatal."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            log.info("usage file %s does not exist yet: daily budgets start afresh", self.path)
            return
        except OSError as exc:
            log.warning("usage file %s cannot be read (%s): daily budgets start afresh",
                        self.path, exc)  # fmt: skip
            return
        try:
            restored = self.quotas.restore(json.loads(raw), wall)
        except ValueError as exc:  # (json's errors are ValueErrors too)
            log.warning("usage file %s is not usable (%s): ignored, daily budgets start "
                        "afresh", self.path, exc)  # fmt: skip
            return
        self._saved = self.quotas.version
        log.info("usage file %s: today's usage of %d callers restored", self.path, restored)

    def pending(self) -> bool:
        return self.quotas.version != self._saved

    def save(self, wall: float) -> None:
        """Write today's totals now (atomically)."""
        version = self.quotas.version
        write_atomic(self.path, json.dumps(self.quotas.usage(wall), sort_keys=True).encode())
        self._saved = version

    async def save_forever(self, wall: Callable[[], float], every_s: float = SAVE_EVERY_S) -> None:
        """Every ``every_s``, write the totals if they changed (in a thread: fsync may
        take a while). A failed write is logged and tried again next time."""
        while True:
            await asyncio.sleep(every_s)
            if not self.pending():
                continue
            version = self.quotas.version
            body = json.dumps(self.quotas.usage(wall()), sort_keys=True).encode()
            try:
                await asyncio.to_thread(write_atomic, self.path, body)
            except OSError as exc:
                log.warning("usage file %s not written (%s); trying again", self.path, exc)
                continue
            self._saved = version

    def close(self, wall: float) -> None:
        """At shutdown: the last totals, if they changed."""
        if not self.pending():
            return
        try:
            self.save(wall)
        except OSError as exc:
            log.warning("usage file %s not written at shutdown (%s)", self.path, exc)


def write_atomic(path: Path, body: bytes) -> None:
    """``path`` holds ``body`` or what it held before, never a part of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
