"""``luftpause status``: the scheduler's picture in the terminal (S12), once or with ``--watch``.

Replicas (in flight vs cap, engine running and queue, health), held turns by
class and caller with the oldest wait, runs by phase and class, the configured
callers (B13: in flight and held against their limits, tokens left); with
``--runtime URL`` also the runtime's run tree with each run's own work and its
subtree totals. The same picture as the scheduler's page at ``GET /``.

Exit status: 0 printed; 2 the scheduler (or the runtime given with
``--runtime``) could not be reached, refused the token or did not answer like
luftpause. ``--watch`` keeps refreshing through errors (shown in the frame)
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

import httpx

from luftpause.cliargs import positive_float

DEFAULT_SCHEDULER = "http://127.0.0.1:5001"
DEFAULT_WATCH_S = 2.0
TIMEOUT_S = 5.0
TERMINAL = frozenset({"Completed", "Failed", "Cancelled"})
CLASSES = ("interactive", "batch")
CLEAR = "\x1b[H\x1b[2J"


class SourceError(Exception):
    """A status source could not be read; the message is one line for the user."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print the scheduler's status: replicas (in flight vs cap, engine queue, health), "
        "held turns by class and caller, runs by phase and class; with --runtime also the "
        "runtime's run tree with each run's own work and subtree totals. Exit status 2 when a "
        "source cannot be read; --watch shows such errors in the frame and keeps refreshing."
    )
    parser.add_argument(
        "--scheduler",
        metavar="URL",
        default=DEFAULT_SCHEDULER,
        help=f"the scheduler's status HTTP base URL (default: {DEFAULT_SCHEDULER})",
    )
    parser.add_argument(
        "--runtime",
        metavar="URL",
        help="also show this runtime's run tree (its base URL, e.g. http://127.0.0.1:7000; "
        "a URL ending in /mcp or /status works too)",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token (the stack's LUFTPAUSE_TOKEN) sent to the scheduler and the runtime "
        "(default: $LUFTPAUSE_TOKEN; --token '' sends none)",
    )
    parser.add_argument(
        "--watch",
        "-w",
        nargs="?",
        type=positive_float,
        const=DEFAULT_WATCH_S,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C, like top",
    )


# ---- fetching ------------------------------------------------------------------------------


def base_url(url: str, suffixes: Sequence[str] = ("/status",)) -> str:
    """``host:port`` → ``http://host:port``; a trailing ``/``, ``/status`` (or ``/mcp``) dropped."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    for suffix in suffixes:
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def fetch_status(
    client: httpx.Client, what: str, base: str, token: str | None, key: str
) -> dict[str, Any]:
    """``GET base/status`` as a dict holding ``key``, or :class:`SourceError`."""
    url = f"{base}/status"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = client.get(url, headers=headers)
    except httpx.TimeoutException:
        raise SourceError(f"the {what} at {base} did not answer within {TIMEOUT_S:g} s") from None
    except httpx.HTTPError as exc:
        reason = re.sub(r"^\[Errno -?\d+\] ", "", str(exc).strip()) or type(exc).__name__
        hint = " (is it running? `luftpause up` starts the stack)" if what == "scheduler" else ""
        raise SourceError(f"cannot reach the {what} at {base}: {reason}{hint}") from None
    if resp.status_code == 401:
        if token:
            raise SourceError(f"the {what} at {base} refused the token")
        raise SourceError(
            f"the {what} at {base} needs a token: pass --token or set LUFTPAUSE_TOKEN"
        )
    if resp.status_code != 200:
        raise SourceError(f"{url} answered HTTP {resp.status_code}")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or key not in data:
        raise SourceError(f"{url} is not a luftpause {what}'s status")
    return data


# ---- rendering -----------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{round(value * 1000)}ms"
    if value < 60:
        return f"{value:.1f}s"
    minutes = int(value // 60)
    if minutes < 60:
        return f"{minutes}m{round(value % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def count(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 10_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Columns padded to the widest cell; indices in ``right`` right-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


def bar(used: int, cap: int | None, width: int = 8) -> str:
    if not cap:
        return ""
    filled = min(width, round(width * used / cap))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render_scheduler(status: dict[str, Any], source: str) -> list[str]:
    head = f"luftpause status - scheduler {source}"
    if "uptime_s" in status:
        head += f" - up {seconds(status['uptime_s'])}"
    replicas = status.get("replicas", [])
    healthy = sum(1 for r in replicas if r.get("healthy"))
    totals = (
        f"turns in flight {status.get('in_flight_total', 0)} - "
        f"held {status.get('held_total', 0)} - runs {status.get('runs_total', 0)} - "
        f"replicas healthy {healthy}/{len(replicas)}"
    )
    lost = status.get("dataplanes_lost") or {}
    if lost:
        totals += f" - dataplanes lost {len(lost)}"
    out = [head, totals, "", "REPLICAS"]
    rows = []
    for r in replicas:
        cap = r.get("capacity")
        if r.get("probed_s_ago") is None:
            health = "not probed"
        else:
            health = "healthy" if r.get("healthy") else "DOWN"
        if r.get("membership") in ("draining", "leaving"):  # B11: no new runs go there
            health = f"{health}, {r['membership']}"
        kv = r.get("kv_usage")
        probed = r.get("probed_s_ago")
        rows.append(
            [
                r["name"],
                "single-pass" if r.get("kind") == "single_pass" else str(r.get("kind", "")),
                health,
                f"{r.get('in_flight', 0)}/{'-' if cap is None else cap}",
                bar(int(r.get("in_flight", 0)), cap),
                _opt(r.get("engine_running")),
                _opt(r.get("engine_waiting")),
                "-" if kv is None else f"{round(kv * 100)}%",
                str(r.get("runs_pinned", 0)),
                str(r.get("reserved_for_interactive", 0)),
                "never" if probed is None else f"{seconds(probed)} ago",
            ]
        )
    header = [
        "NAME",
        "KIND",
        "HEALTH",
        "IN FLIGHT/CAP",
        "",
        "ENGINE RUN",
        "ENGINE QUEUE",
        "KV",
        "PINNED",
        "RESERVED",
        "PROBED",
    ]
    out += table(header, rows, {3, 5, 6, 7, 8, 9}) if rows else ["  no replicas configured"]

    out += ["", f"HELD TURNS ({status.get('held_total', 0)})"]
    held = status.get("held") or {}
    held_rows = [
        [cls, caller, str(h.get("held", 0)), seconds(h.get("oldest_wait_s"))]
        for cls in sorted(held, key=_class_order)
        for caller, h in held[cls].items()
    ]
    out += (
        table(["CLASS", "CALLER", "HELD", "OLDEST WAIT"], held_rows, {2, 3})
        if held_rows
        else ["  no turns held"]
    )

    out += ["", f"RUNS ({status.get('runs_total', 0)})"]
    runs = status.get("runs") or {}
    run_rows = [
        [
            phase.replace("_", " "),
            *(str(by_class.get(c, 0)) for c in CLASSES),
            str(sum(by_class.values())),
        ]
        for phase, by_class in runs.items()
    ]
    out += (
        table(["PHASE", *(c.upper() for c in CLASSES), "TOTAL"], run_rows, {1, 2, 3})
        if run_rows
        else ["  no runs"]
    )
    callers = status.get("callers_in_flight") or {}
    if callers:
        out += ["", "callers in flight: " + ", ".join(f"{k} {v}" for k, v in callers.items())]
    out += render_callers(status)
    return out


def render_callers(status: dict[str, Any]) -> list[str]:
    """B13: the configured callers (nothing without ``[[callers]]``)."""
    configured = status.get("callers") or []
    if not configured:
        return []
    rows = []
    for c in configured:
        refused = c.get("refused") or {}
        subs = [f"{x['name']} {x['in_flight']}+{x['held']}" for x in c.get("sub_callers", [])]
        if c.get("sub_callers_more"):
            subs.append(f"+{c['sub_callers_more']} more")
        tpm = c.get("tokens_per_minute")
        rows.append(
            [
                str(c.get("name", "")),
                f"{c.get('weight', 1.0):g}",
                _limit(c.get("in_flight", 0), c.get("max_in_flight")),
                str(c.get("held", 0)),
                "-" if tpm is None else f"{count(c.get('tokens_per_minute_left'))}/{count(tpm)}",
                _limit(c.get("tokens_today", 0), c.get("daily_tokens")),
                f"{refused.get('tokens_per_minute', 0)}/{refused.get('daily_tokens', 0)}",
                ", ".join(subs) or "-",
            ]
        )
    header = [
        "CALLER",
        "WEIGHT",
        "IN FLIGHT/MAX",
        "HELD",
        "TOKENS/MIN LEFT",
        "TOKENS TODAY",
        "REFUSED MIN/DAY",
        "SUB-CALLERS (IN FLIGHT+HELD)",
    ]
    out = ["", f"CALLERS ({len(configured)})", *table(header, rows, {1, 2, 3, 4, 5, 6})]
    other = status.get("unconfigured_callers") or {}
    if other.get("callers"):
        out.append(
            f"  others: {other['callers']} callers, {other.get('in_flight', 0)} in flight, "
            f"{other.get('held', 0)} held"
        )
    return out


def _limit(used: int, limit: int | None) -> str:
    return count(used) if limit is None else f"{count(used)}/{count(limit)}"


def _opt(value: Any) -> str:
    return "-" if value is None else str(value)


def _class_order(cls: str) -> int:
    return CLASSES.index(cls) if cls in CLASSES else len(CLASSES)


def _pair(own: str, sub: str) -> str:
    return f"{own}/{sub}"


def _usage(u: dict[str, Any]) -> dict[str, str]:
    return {
        "turns": str(u.get("turns", 0)),
        "tools": str(u.get("toolCalls", 0)),
        "failed": str(u.get("failedToolCalls", 0)),
        "tokens": count(int(u.get("promptTokens", 0)) + int(u.get("completionTokens", 0))),
        "turn": seconds(float(u.get("turnSeconds", 0.0))),
        "tool": seconds(float(u.get("toolSeconds", 0.0))),
    }


def _tree_rows(node: Any, prefix: str, last: bool, depth: int, rows: list[list[str]]) -> None:
    glyph = "" if depth == 0 else ("`- " if last else "|- ")
    if isinstance(node, str):  # cut below 64 levels: only the handle
        rows.append([f"{prefix}{glyph}{node}", "(deeper)", "", *[""] * 6, ""])
        return
    if "session" in node and "handle" not in node:  # an agent harness's session (#38)
        sub = _usage(node.get("subtree") or {})
        rows.append(
            [
                f"session {node['session']}",
                "",
                "",
                *(f"-/{sub[k]}" for k in ("turns", "tools", "failed", "tokens", "turn", "tool")),
                f"agent harness session: {node.get('runs', 0)} sub-agent run(s)",
            ]
        )
        kids = node.get("children") or []
        for i, child in enumerate(kids):
            _tree_rows(child, "", i == len(kids) - 1, 1, rows)
        return
    own, sub = _usage(node.get("own") or {}), _usage(node.get("subtree") or {})
    state = str(node.get("state", ""))
    if node.get("pendingApproval"):
        state += " (approval)"
    if (node.get("budget") or {}).get("exceeded"):
        state += " (budget)"
    rows.append(
        [
            f"{prefix}{glyph}{node.get('handle', '?')}",
            state,
            str(node.get("serviceClass", "")),
            *(
                _pair(own[k], sub[k])
                for k in ("turns", "tools", "failed", "tokens", "turn", "tool")
            ),
            str(node.get("task", "")).replace("\n", " "),
        ]
    )
    kids = node.get("children") or []
    child_prefix = "" if depth == 0 else prefix + ("   " if last else "|  ")
    for i, child in enumerate(kids):
        _tree_rows(child, child_prefix, i == len(kids) - 1, depth + 1, rows)


def render_runtime(tree: dict[str, Any], source: str) -> list[str]:
    by_state = tree.get("byState") or {}
    counts = ", ".join(f"{k} {v}" for k, v in by_state.items())
    out = [
        f"RUN TREE - runtime {source} - {tree.get('runs', 0)} runs"
        + (f": {counts}" if counts else "")
    ]
    rows: list[list[str]] = []
    for root in tree.get("tree") or []:
        _tree_rows(root, "", True, 0, rows)
    if not rows:
        return [*out, "  no runs"]
    header = ["RUN", "STATE", "CLASS", "TURNS", "TOOLS", "FAILED", "TOKENS", "TURN T", "TOOL T"]
    lines = table([*header, "TASK"], rows, {3, 4, 5, 6, 7, 8})
    return [*out, *lines, "  a/b: the run's own work / its whole subtree (T: time)"]


def render(
    status: dict[str, Any] | None,
    scheduler: str,
    *,
    tree: dict[str, Any] | None = None,
    runtime: str | None = None,
    errors: Sequence[str] = (),
    width: int | None = None,
) -> str:
    """The whole picture as text; ``errors`` are shown first, one line each. With a
    ``width`` (a terminal's), longer lines are cut (the task column goes first)."""
    lines = [f"error: {e}" for e in errors]
    if errors:
        lines.append("")
    if status is not None:
        lines += render_scheduler(status, scheduler)
    if runtime is not None and tree is not None:
        lines += ["", *render_runtime(tree, runtime)]
    if width is not None:
        lines = [ln if len(ln) <= width else ln[: max(0, width - 1)] + "~" for ln in lines]
    return "\n".join(lines) + "\n"


# ---- the command ---------------------------------------------------------------------------


@dataclass
class Snapshot:
    status: dict[str, Any] | None
    tree: dict[str, Any] | None
    errors: list[str]


def take(client: httpx.Client, scheduler: str, runtime: str | None, token: str | None) -> Snapshot:
    """Read the scheduler (and the runtime); what failed is in ``errors``."""
    snap = Snapshot(None, None, [])
    try:
        snap.status = fetch_status(client, "scheduler", scheduler, token, "replicas")
    except SourceError as exc:
        snap.errors.append(str(exc))
    if runtime is not None:
        try:
            snap.tree = fetch_status(client, "runtime", runtime, token, "tree")
        except SourceError as exc:
            snap.errors.append(str(exc))
    return snap


def watch(
    frame: Callable[[], str],
    every_s: float,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
    frames: int | None = None,
) -> int:
    """Redraw ``frame()`` every ``every_s`` seconds until Ctrl-C (``frames`` bounds it)."""
    clear = out.isatty()
    shown = 0
    try:
        while True:
            started = time.monotonic()
            text = frame()
            stamp = f"every {every_s:g}s - {datetime.now():%H:%M:%S} - Ctrl-C to quit"
            out.write((CLEAR if clear else "") + text + stamp + "\n")
            out.flush()
            shown += 1
            if frames is not None and shown >= frames:
                return 0
            sleep(max(0.0, every_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0


def _width(out: TextIO) -> int | None:
    """A terminal's width (lines are cut to it); None when piped (nothing is cut)."""
    return shutil.get_terminal_size((120, 40)).columns if out.isatty() else None


def main(args: argparse.Namespace) -> int:
    # The one place the environment is read: the rest gets the token passed in.
    token = args.token if args.token is not None else os.environ.get("LUFTPAUSE_TOKEN")
    scheduler = base_url(args.scheduler)
    runtime = None if args.runtime is None else base_url(args.runtime, ("/status", "/mcp"))
    with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as client:
        if args.watch is not None:

            def frame() -> str:
                snap = take(client, scheduler, runtime, token or None)
                return render(
                    snap.status,
                    scheduler,
                    tree=snap.tree,
                    runtime=runtime,
                    errors=snap.errors,
                    width=_width(sys.stdout),
                )

            return watch(frame, args.watch, sys.stdout)
        snap = take(client, scheduler, runtime, token or None)
    if snap.status is not None or snap.tree is not None:
        width = _width(sys.stdout)
        sys.stdout.write(
            render(snap.status, scheduler, tree=snap.tree, runtime=runtime, width=width)
        )
    for error in snap.errors:
        print(f"luftpause status: {error}", file=sys.stderr)
    return 2 if snap.errors else 0
