"""H3, H4: load progress is drawn on a terminal only; benchmarks say arm k/N and an ETA."""

from __future__ import annotations

import io
import re

from luftpause.measure.progress import ArmClock, LiveLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_line_draws_on_a_terminal_and_ends_with_the_last_state() -> None:
    screen = Terminal()
    state = {"runs": 0}
    with LiveLine(screen, lambda: f"runs done: {state['runs']}", auto_refresh=False) as line:
        state["runs"] = 1
        line.refresh()
        state["runs"] = 7
    frames = [
        re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f).strip()
        for f in re.split(r"[\r\n]", screen.getvalue())
    ]
    frames = [f for f in frames if f]
    assert "runs done: 1" in frames  # redrawn in place while it runs
    assert frames[-1] == "runs done: 7"  # the final state stays on screen
    assert "\r" in screen.getvalue() or "\x1b[" in screen.getvalue()  # in place, not appended


def test_live_line_writes_nothing_to_a_pipe_or_log() -> None:
    log = io.StringIO()
    with LiveLine(log, lambda: "runs done: 3") as line:
        line.refresh()
    assert not line.enabled and log.getvalue() == ""


def test_arm_clock_counts_arms_and_estimates_what_is_left() -> None:
    now = [100.0]
    clock = ArmClock(4, clock=lambda: now[0])
    assert clock.start() == "arm 1/4, 0 s in"  # nothing finished: no estimate yet
    now[0] += 60
    clock.finished()
    assert clock.start() == "arm 2/4, 60 s in, ~3 min left"
    now[0] += 60
    clock.finished()
    now[0] += 60
    clock.finished()
    assert clock.start() == "arm 4/4, 3 min in, ~60 s left"
