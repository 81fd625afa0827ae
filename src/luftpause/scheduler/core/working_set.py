"""Working-set admission (B5): a filter on where a new batch run may start.

Reads: a replica's record (``ReplicaState``): its KV pool in tokens (``kv_tokens``, from
the last probe: the engine's metrics or the endpoint's configured ``kv_tokens``), the
runs living there (``pinned_runs``: generating or paused on a tool, not lapsed), the sum
of their known contexts (``ws_tokens``) and how many of them have one (``ws_known``),
and the engine's last KV usage (``kv_usage``); the policy's ``Params``
(``working_set_share``, ``working_set_kv_usage``).

Decides: whether a batch run not living on the replica may start there now
(``admits``). It does not place or order: placement (``placement.py``) filters replicas
with it (beside the run limit, or instead of it: ``Params.working_set``) and scores what
is left by load; ``placement.may_start_run`` asks it before a held turn of a new run is
taken.

The rule. A run's *known context* is the prompt of its last finished turn
(``RunState.last_prompt``): what its next turn brings back and the engine should still
hold cached. (Its reply and tool result are not known to the core; they make the next
prompt a few hundred tokens longer, which ``working_set_share`` leaves room for.) The
replica's working set is the sum of the known contexts of the runs living there, a run
with none yet (its first turn still running) counted at the estimate. The *estimate* of
a run is the mean known context of the runs living there: a new run grows to about as
much as the runs around it hold. A new batch run may start while

    working set + estimate <= working_set_share x kv_tokens

and, with ``working_set_kv_usage`` set, the engine's last reported KV usage is below it.
A replica whose pool is unknown is not limited. A replica where no run lives always
admits: one run whose context alone exceeds the pool still starts (on an idle replica,
and only there), so a held turn is never stranded behind the rule; new runs wait on a
replica only while runs live there, and each of those ends, goes idle, or lapses
(``leases.py``), which frees its share.

Cost: the sums are kept incrementally on the replica's record (``decide._bump_replica``,
where runs pin, unpin and finish turns), so the filter is O(1) and placement stays
O(replicas); ``contribution`` is what one run adds to them (``invariants.py`` recomputes
them from scratch).
"""

from __future__ import annotations

from luftpause.scheduler.core.state import ReplicaState, RunState
from luftpause.scheduler.core.types import Params, RunPhase


def contribution(run: RunState | None) -> tuple[str | None, int, int]:
    """Where ``run`` counts in a working set and what it adds there: (replica or None,
    known context tokens, 1 if it has a known context else 0). A run counts on the
    replica it lives on (S3's pinned count): generating or paused there, not lapsed."""
    if run is None or run.phase is RunPhase.IDLE or run.lapsed or run.replica is None:
        return None, 0, 0
    return run.replica, run.last_prompt, 1 if run.last_prompt > 0 else 0


def estimate(rep: ReplicaState) -> int:
    """The context a run living on ``rep`` is expected to hold: the mean known context
    of the runs living there (0 when none has one yet)."""
    known = rep.ws_known
    return rep.ws_tokens // known if known > 0 else 0


def working_set(rep: ReplicaState) -> int:
    """The tokens the runs living on ``rep`` are expected to hold: their known contexts,
    and the estimate for each of them that has none yet."""
    unknown = rep.pinned_runs - rep.ws_known
    return rep.ws_tokens + (unknown * estimate(rep) if unknown > 0 else 0)


def admits(rep: ReplicaState, params: Params) -> bool:
    """Whether a batch run not living on ``rep`` may start there now."""
    pool = rep.kv_tokens
    if pool is None or rep.pinned_runs <= 0:
        return True  # unknown pool: not limited; no run lives there: nothing to protect
    threshold = params.working_set_kv_usage
    if threshold is not None and rep.kv_usage is not None and rep.kv_usage >= threshold:
        return False
    return working_set(rep) + estimate(rep) <= params.working_set_share * pool
