"""Tool leases: how long a run paused on a tool keeps living on its replica.

Pure arithmetic over the state's ``tool_times`` (tool name -> ``ToolTime``); ``decide``
applies it (``_back_from_tool`` learns, ``_lapse`` ends a pause, the clock tick checks
leases) and ``view`` shows it. docs/concepts/admission.md, "Tool leases", says what
it does and docs/benchmarks/policies.md, "Tool leases", why.

* A pause's tools become estimate keys with ``tool_keys``: distinct, cut to
  ``MAX_TOOL_NAME`` characters, at most ``MAX_PAUSE_TOOLS``; a pause that named none is
  keyed ``""`` (the estimate of unnamed tools).
* When the run comes back, the pause's length is a sample of each of its tools
  (``learn``): a smoothed time and deviation with the weights of TCP's round-trip
  estimate (RFC 6298), a sample counting for at most ``MAX_SAMPLE_LEASES`` leases, and
  at most ``Params.tool_estimates_max`` names learned.
* ``tool_lease``: ``tool_lease_factor`` x (time + 4 x deviation) of the slowest tool,
  ``tool_lease_default_s`` for one never seen back, at least ``tool_lease_min_s``.
* ``retain_time`` (B8, ``Params.kv_retention``): how long an engine is asked to keep a
  turn's prefix after it: the smoothed time + deviation of the slowest tool of the pause
  the run comes back from (its next pause is likely alike), 0 (no hint) when no tool of
  it has an estimate.
"""

from __future__ import annotations

from immutables import Map

from luftpause.scheduler.core.state import ToolTime
from luftpause.scheduler.core.types import Params

TOOL_MEAN_WEIGHT = 0.125  # a new sample's weight in a tool's smoothed time
TOOL_DEV_WEIGHT = 0.25  # and in its smoothed deviation
MAX_TOOL_NAME = 64  # longer names are cut
MAX_PAUSE_TOOLS = 8  # the most tools one pause is learned for
MAX_SAMPLE_LEASES = 4.0  # a return counts as at most this many times its pause's lease

Times = Map[str, ToolTime]
UNNAMED = ("",)  # the keys of a pause that named no tool


def tool_keys(names: tuple[str, ...]) -> tuple[str, ...]:
    """A pause's tools as estimate keys: distinct, cut, at most ``MAX_PAUSE_TOOLS``, in
    order; ("",) when it named none (its estimate is that of unnamed tools)."""
    keys = sorted({name[:MAX_TOOL_NAME] for name in names})[:MAX_PAUSE_TOOLS]
    return tuple(keys) if keys else UNNAMED


def tool_lease(params: Params, times: Times, tools: tuple[str, ...]) -> float:
    """The lease of a pause on ``tools``: for its slowest tool, ``tool_lease_factor`` x
    (smoothed duration + 4 x deviation), or the default for a tool never seen back; at
    least ``tool_lease_min_s``."""
    lease = params.tool_lease_min_s
    for name in tools or ("",):
        est = times.get(name)
        if est is None:
            t = params.tool_lease_default_s
        else:
            t = params.tool_lease_factor * (est.mean_s + 4.0 * est.dev_s)
        if t > lease:
            lease = t
    return lease


def learn(params: Params, times: Times, tools: tuple[str, ...], away_s: float) -> Times:
    """``times`` with a pause of ``away_s`` on ``tools`` folded into each tool's estimate
    (the tools of one pause ran together: each is taken to have taken the whole pause).
    One return far later than its lease (a person away, a laptop asleep) would make the
    tool's lease huge for many returns after it: a sample counts for at most
    ``MAX_SAMPLE_LEASES`` times the lease the pause had."""
    cap = MAX_SAMPLE_LEASES * tool_lease(params, times, tools)
    seconds = min(max(0.0, away_s), cap)
    for name in tools:
        est = times.get(name)
        if est is None:
            if len(times) >= params.tool_estimates_max:
                continue  # (a peer naming endless tools: the rest get the default)
            est = ToolTime(seconds, seconds / 2, 1)
        else:
            err = seconds - est.mean_s
            est = ToolTime(
                est.mean_s + TOOL_MEAN_WEIGHT * err,
                est.dev_s + TOOL_DEV_WEIGHT * (abs(err) - est.dev_s),
                est.samples + 1,
            )
        times = times.set(name, est)
    return times


def retain_time(times: Times, tools: tuple[str, ...]) -> float:
    """How long an engine should keep a run's prefix after the turn it admits now: the
    smoothed time plus one deviation of the slowest of ``tools`` (those of the pause the
    run comes back from, or, for a run with none, of unnamed tools): about as long as
    the tool usually takes, where the lease (``tool_lease``) is a generous bound. 0 when
    none of them has an estimate yet."""
    keep = 0.0
    for name in tools or UNNAMED:
        est = times.get(name)
        if est is not None and est.mean_s + est.dev_s > keep:
            keep = est.mean_s + est.dev_s
    return keep
