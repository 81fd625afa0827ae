"""tools/bench/dataplane_profile.py's summary of a py-spy profile (D10 benchmark tooling):
own-time and with-callees shares from py-spy's raw folded stacks."""

from __future__ import annotations

import pytest

from tools.bench import dataplane_profile as profile


def test_shares_by_own_time_and_with_callees() -> None:
    """Each stack's count goes to its innermost frame's own time and once to every frame
    on it (a recursive frame counted once); malformed lines are skipped."""
    folded = "\n".join(
        [
            "main;serve;send 6",
            "main;serve;parse 3",
            "main;serve;serve;parse 1",
            "not a stack line",
            "",
        ]
    )
    total, own, with_callees = profile.summarise(folded, top=10)
    assert total == 10
    assert own[0] == (pytest.approx(0.6), "send")
    assert dict((name, share) for share, name in own)["parse"] == pytest.approx(0.4)
    assert dict((name, share) for share, name in with_callees)["serve"] == pytest.approx(1.0)
    assert profile.summarise("", top=5) == (0, [], [])
    assert len(profile.summarise(folded, top=1)[1]) == 1
