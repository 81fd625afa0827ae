"""Callers bound to keys (B13), measured: an impostor's flood against an honest caller.

    python tools/bench/callers.py --quick     # short arms: about 2 minutes
    python tools/bench/callers.py             # the report's run: about 5 minutes

Two callers share one stack (``[[callers]]``, ``LUFTPAUSE_TOKEN`` set): ``alice``, whose
key may use the interactive and batch classes, and ``mallory``, whose key may use batch
only (``on_denied_class = "downgrade"``). Four arms, each with the same warm-up, window,
seeds and agents, one after the other, each on a **fresh stack** (every process started
for the arm and stopped after it, so no arm inherits another's learned caps, cached
prefixes or counters):

1. ``alone``: alice's interactive agents only (4, her key);
2. ``impostor-keys``: beside them, 24 of mallory's agents that claim
   ``x-luftpause-class: interactive`` and ``x-luftpause-caller: alice`` with mallory's key;
3. ``impostor-token``: the same flood where every agent (alice's too) sends the shared
   token, the services' trusted credential: the impostor's claims are believed, as they
   were before keys;
4. ``honest-batch-keys``: mallory's agents honest (batch, their own name, mallory's key).

With ``--reps`` the repetitions alternate the arms' order
([Methodology](docs/benchmarks/methodology.md#alternation)).

The stack: one fake engine (``--priority-scheduling``, the floods' calibrated model), so
28 agents of about 8,000-character contexts saturate it as 48 batch agents saturate the
floods' two engines; fake MCP tools; a scheduler with the floods' defaults (the probe
period and the decode pace's target scaled with the time scale) and one dataplane. The
load generator (``luftpause loadgen --mix``, in this process) drives each arm; its groups
``alice`` and ``mallory`` are reported apart even where both claim ``interactive``.

Per arm: alice's interactive turns that ended in the window (p50 / p90 of their wall
time, from the request to the last token), the mean time a turn of hers was held, her
runs finished in the window; mallory's turns; and what mallory's turns ran as, read
from the services' ``/metrics`` when the arm ends (warm-up included): the dataplane's
turns by served class, its class denials by caller, and the scheduler's tokens by caller
(``mallory/alice`` is mallory's sub-caller: mallory's claim of alice's name, kept under
mallory's key). Times are in the engine model's time (measured × the time scale), as in every
report ([Methodology](docs/benchmarks/methodology.md)). Nothing is asserted: this
measures.

Output: the table on stdout; a Markdown report and the raw results as JSON, by default
``docs/benchmarks/results/YYYY-MM-DD-callers.{md,json}`` (``-callers-quick`` with
``--quick``; ``--out`` names the Markdown file, the JSON goes beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import secrets
import shlex
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from luftpause.callers import new_key
from luftpause.loadgen import main as loadgen
from tools.bench.arms.luftpause import _config, scheduler_and_dataplane
from tools.bench.arms.plan import QUICK as FLOOD_QUICK
from tools.bench.arms.plan import ROOT, Stack, probe_period
from tools.bench.arms.stack import EngineWatch
from tools.bench.flood_report import code_version, machine

ARMS = ("alone", "impostor-keys", "impostor-token", "honest-batch-keys")
ARM_TEXT = {
    "alone": "alice's interactive agents alone (her key)",
    "impostor-keys": "beside them, mallory's agents claiming class interactive and caller "
    "alice, with mallory's key",
    "impostor-token": "the same flood with every agent on the shared token (trusted: the "
    "claims are believed)",
    "honest-batch-keys": "beside alice, mallory's agents honest: class batch, caller "
    "mallory, mallory's key",
}
ALICE_ENV, MALLORY_ENV = "BENCH_CALLERS_KEY_ALICE", "BENCH_CALLERS_KEY_MALLORY"
CALLERS_TOML = f"""
[[callers]]
name = "alice"
key_env = "{ALICE_ENV}"
classes = ["interactive", "batch"]

[[callers]]
name = "mallory"
key_env = "{MALLORY_ENV}"
classes = ["batch"]
on_denied_class = "downgrade"
"""
ENGINE_FLAGS = ("--priority-scheduling", "--chunk-tokens", "8", "--tool-results", "3")
CONTEXT_CHARS = 8000
TOOL_CALLS = 3
SERVED = ("finished", "paused_on_tool")  # the dataplane's outcomes of a turn that ran


@dataclass(frozen=True)
class Settings:
    time_scale: float
    warmup_s: float  # model seconds
    window_s: float  # model seconds
    alice: int
    mallory: int
    reps: int

    def real(self, model_s: float) -> float:
        return model_s / self.time_scale


QUICK = Settings(time_scale=5.0, warmup_s=25.0, window_s=60.0, alice=4, mallory=24, reps=1)
FULL = Settings(time_scale=5.0, warmup_s=60.0, window_s=240.0, alice=4, mallory=24, reps=1)


# ------------------------------------------------------------------ pure parts


def mix_toml(arm: str, alice: int, mallory: int) -> str:
    """The load generator's ``--mix`` for one arm: alice's group, and mallory's unless the
    arm is ``alone``. A group without ``key_env`` sends the load generator's ``--token``."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r} (arms: {', '.join(ARMS)})")
    keyed = arm != "impostor-token"
    alice_key = f'key_env = "{ALICE_ENV}"\n' if keyed else ""
    text = (
        f'[[group]]\nname = "alice"\ncount = {alice}\nclass = "interactive"\n'
        f'caller = "alice"\n{alice_key}'
    )
    if arm == "alone":
        return text
    honest = arm == "honest-batch-keys"
    cls, caller = ("batch", "mallory") if honest else ("interactive", "alice")
    mallory_key = f'key_env = "{MALLORY_ENV}"\n' if keyed else ""
    return text + (
        f'\n[[group]]\nname = "mallory"\ncount = {mallory}\nclass = "{cls}"\n'
        f'caller = "{caller}"\n{mallory_key}'
    )


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` (e.g. ``luftpause_dataplane_turns_total``) in a
    Prometheus text page: its labels and value."""
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def ran_as(dataplane: str, scheduler: str) -> dict[str, Any]:
    """What the turns ran as, from the dataplane's and the scheduler's ``/metrics``: the
    dataplane's turns by served class and outcome, its class denials by caller and
    action, the scheduler's admissions by class and its tokens by caller label."""
    turns: dict[str, dict[str, float]] = {}
    for labels, value in samples(dataplane, "luftpause_dataplane_turns_total"):
        turns.setdefault(labels["service_class"], {})[labels["outcome"]] = value
    denied: dict[str, dict[str, float]] = {}
    for labels, value in samples(dataplane, "luftpause_dataplane_class_denied_total"):
        denied.setdefault(labels["caller"], {})[labels["action"]] = value
    admitted: dict[str, float] = {}
    for labels, value in samples(scheduler, "luftpause_scheduler_admissions_total"):
        cls = labels["service_class"]
        admitted[cls] = admitted.get(cls, 0.0) + value
    tokens = {
        labels["caller"]: value
        for labels, value in samples(scheduler, "luftpause_scheduler_caller_tokens_total")
    }
    return {
        "dataplane_turns": turns,
        "served": {c: sum(v for o, v in by.items() if o in SERVED) for c, by in turns.items()},
        "class_denied": denied,
        "admissions": admitted,
        "caller_tokens": tokens,
    }


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def figures(arm: str, rep: int, result: dict[str, Any], scale: float) -> dict[str, Any]:
    """One arm's row from the load generator's result and its ``ran_as`` (``metrics``):
    alice's turns and runs, mallory's turns, errors by group; times in model seconds."""
    groups = result["groups"]
    alice = groups["alice"]
    turns = alice.get("turns_ended") or {}
    wall = turns.get("wall_s") or {}
    mallory = groups.get("mallory")
    m_turns = (mallory or {}).get("turns_ended") or {}
    return {
        "arm": arm,
        "rep": rep,
        "alice_turns": turns.get("turns", 0),
        "alice_turn_p50_s": _scaled(wall.get("p50"), scale),
        "alice_turn_p90_s": _scaled(wall.get("p90"), scale),
        "alice_held_s": _scaled(alice["turn"]["held_s"], scale),
        "alice_runs": alice["runs"],
        "alice_run_p50_s": _scaled(alice["run_s"]["p50"], scale),
        "mallory_turns": m_turns.get("turns") if mallory else None,
        "mallory_turn_p50_s": _scaled((m_turns.get("wall_s") or {}).get("p50"), scale),
        "errors": {name: g["error_count"] for name, g in groups.items()},
        "load_avg": result.get("load_avg", [None])[0],
    }


def _n(value: float | None) -> str:
    """A count, short: 950, 12.3k, 4.56M."""
    if value is None:
        return "-"
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.0f}"


def _s(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ran_as_text(metrics: dict[str, Any]) -> tuple[str, str, str]:
    """Three cells: the dataplane's served turns by class, the class denials by caller,
    the scheduler's tokens by caller (non-zero ones)."""
    if "error" in metrics:
        return ("unread", "unread", "unread")
    served = metrics.get("served", {})
    classes = " / ".join(f"{_n(served.get(c, 0.0))}" for c in ("interactive", "batch"))
    denied = ", ".join(
        f"{caller} {action} {_n(v)}"
        for caller, by in sorted(metrics.get("class_denied", {}).items())
        for action, v in sorted(by.items())
        if v
    )
    tokens = ", ".join(
        f"{caller} {_n(v)}" for caller, v in sorted(metrics.get("caller_tokens", {}).items()) if v
    )
    return classes, denied or "0", tokens or "-"


TABLE_HEAD = (
    "| arm | alice turns | alice turn p50 s | alice turn p90 s | alice held s/turn "
    "| alice runs | mallory turns | served interactive / batch | class denied "
    "| tokens by caller | errors | load avg |"
)


def table(rows: Sequence[dict[str, Any]], reps: int = 1) -> str:
    """The arms' table (one row per arm and repetition; a rep column when there are
    several). Each row is ``figures`` with its ``metrics`` (``ran_as``)."""
    head = TABLE_HEAD if reps == 1 else TABLE_HEAD.replace("| arm |", "| arm | rep |", 1)
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        classes, denied, tokens = ran_as_text(r.get("metrics", {}))
        errors = ", ".join(f"{g} {n}" for g, n in r["errors"].items() if n) or "0"
        cells = [
            r["arm"],
            *([str(r["rep"])] if reps > 1 else []),
            str(r["alice_turns"]),
            _s(r["alice_turn_p50_s"], 2),
            _s(r["alice_turn_p90_s"], 2),
            _s(r["alice_held_s"], 2),
            str(r["alice_runs"]),
            "-" if r["mallory_turns"] is None else str(r["mallory_turns"]),
            classes,
            denied,
            tokens,
            errors,
            _s(r["load_avg"], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


ENGINE_HEAD = "| arm | engine requests | decode batch | queued s | prefill s | decode s | behind |"


def engine_table(rows: Sequence[dict[str, Any]], reps: int = 1) -> str:
    """Per arm, the engine's side (``EngineWatch.summary``, model seconds)."""
    head = ENGINE_HEAD if reps == 1 else ENGINE_HEAD.replace("| arm |", "| arm | rep |", 1)
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e = r.get("engine") or {}
        behind = e.get("behind")
        cells = [
            r["arm"],
            *([str(r["rep"])] if reps > 1 else []),
            str(e.get("requests", "-")),
            _s(e.get("decode_batch")),
            _s(e.get("queued_s"), 2),
            _s(e.get("prefill_s"), 2),
            _s(e.get("decode_s"), 2),
            "-" if behind is None else f"{behind * 100:.0f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against_alone(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Alice's turn p50 in each arm over the ``alone`` arm's of the same repetition."""
    rows = list(rows)
    alone = {r["rep"]: r["alice_turn_p50_s"] for r in rows if r["arm"] == "alone"}
    out = []
    for r in rows:
        base = alone.get(r["rep"])
        if r["arm"] == "alone" or not base or r["alice_turn_p50_s"] is None:
            continue
        out.append(
            f"{r['arm']}" + (f" (rep {r['rep']})" if len(alone) > 1 else "")
            + f": {r['alice_turn_p50_s'] / base:.2f}× alone"
        )  # fmt: skip
    return out


def arm_order(reps: int) -> list[tuple[int, str]]:
    """(repetition, arm) in running order: the arms in order, reversed every other
    repetition, so drift over the run does not favour one arm."""
    return [(rep, arm) for rep in range(reps) for arm in (ARMS if rep % 2 == 0 else ARMS[::-1])]


# ------------------------------------------------------------------ running


def _get(url: str, token: str) -> str:
    r = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    r.raise_for_status()
    return r.text


def run_arm(settings: Settings, arm: str, rep: int, tmp: Path, token: str) -> dict[str, Any]:
    """One arm on a stack of its own: started, loaded, read, stopped."""
    scale = settings.time_scale
    plan = replace(FLOOD_QUICK, time_scale=scale)
    work = tmp / f"{arm}-{rep}"
    work.mkdir()
    stack = Stack(work, plan)
    try:
        ts = f"{scale:g}"
        engine = stack.start(
            "fake-engine", "--name", "engine-a", "--port", "0", "--time-scale", ts,
            *ENGINE_FLAGS, "--log-level", "WARNING", name="engine-a",
        )  # fmt: skip
        stack.engines.append(engine.urls["http"])
        tools = stack.start(
            "fake-mcp", "--port", "0", "--time-scale", ts, "--log-level", "WARNING",
            name="fake-mcp",
        )  # fmt: skip
        stack.tools_url = f"{tools.urls['http']}/mcp"
        config = _config(work / "stack.toml", stack, probe_period(plan))
        config.write_text(config.read_text() + CALLERS_TOML)
        sched, dp = scheduler_and_dataplane(stack, config)
        mix = work / "mix.toml"
        mix.write_text(mix_toml(arm, settings.alice, settings.mallory))
        out = work / "loadgen.json"
        argv = [
            "--target", f"{dp.urls['http']}/v1", "--tools-url", stack.tools_url,
            "--mix", str(mix), "--token", token,
            "--context-chars", str(CONTEXT_CHARS), "--tool-calls", str(TOOL_CALLS),
            "--warmup-s", f"{settings.real(settings.warmup_s):g}",
            "--ramp-s", f"{settings.real(settings.warmup_s / 2):g}",
            "--duration-s", f"{settings.real(settings.window_s):g}",
            "--seed", f"callers{arm}{rep}".replace("-", ""), "--plan-seed", f"callersrep{rep}",
            "--json", str(out), "--quiet", "--label", f"callers/{arm}/{rep}",
        ]  # fmt: skip
        parser = argparse.ArgumentParser(prog="luftpause loadgen")
        loadgen.add_arguments(parser)
        t0 = time.monotonic()
        with (
            EngineWatch(stack.engines) as watch,
            contextlib.redirect_stdout(io.StringIO()) as printed,
        ):
            rc = loadgen.main(parser.parse_args(argv))
        if rc not in (0, 3) or not out.exists():  # 3: it ran, some runs failed (counted)
            raise RuntimeError(f"loadgen failed for {arm} (rc {rc}):\n{printed.getvalue()[-3000:]}")
        result = dict(json.loads(out.read_text()))
        try:
            metrics = ran_as(
                _get(f"{dp.urls['http']}/metrics", token),
                _get(f"{sched.urls['http']}/metrics", token),
            )
        except (httpx.HTTPError, ValueError) as exc:
            metrics = {"error": repr(exc)}
        row = figures(arm, rep, result, scale)
        row["metrics"] = metrics
        row["engine"] = watch.summary(scale)
        row["wall_s"] = round(time.monotonic() - t0, 1)
        row["loadgen"] = result
        row["loadgen_argv"] = [a if a != token else "$LUFTPAUSE_TOKEN" for a in argv]
        return row
    finally:
        stack.stop()


def default_out(quick: bool) -> Path:
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    name = f"{day}-callers{'-quick' if quick else ''}.md"
    return ROOT / "docs" / "benchmarks" / "results" / name


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(out: dict[str, Any]) -> str:
    s = Settings(**out["settings"])
    rows = out["rows"]
    lines = [
        "# Callers bound to keys: the impostor flood",
        "",
        "*Generated by `tools/bench/callers.py`: how to read a report is in "
        "[Methodology](../methodology.md); every report is listed in the "
        "[archive](../archive.md).*",
        "",
        f"- command: `{out['command']}`",
        f"- code measured: commit {out['commit']}",
        f"- date: {out['date']}; duration {out['duration_s'] / 60:.1f} min",
        f"- machine: {out['machine']}; `/proc/loadavg` before the run `{out['loadavg_before']}`, "
        f"after `{out['loadavg_after']}` (other work shares these cores: the table gives "
        "each arm's 1-minute load average at its end)",
        f"- repetitions: {s.reps} per arm; arms in the order "
        + ", ".join(f"`{a}`" for _, a in arm_order(s.reps))
        + " (reversed every other repetition), each on a fresh stack: every process "
        "started for the arm and stopped after it",
        "- stack (127.0.0.1): one fake engine (`luftpause fake-engine "
        + " ".join(ENGINE_FLAGS)
        + f" --time-scale {s.time_scale:g}`, the calibrated model), fake MCP tools, a "
        "scheduler with the floods' defaults (probe period and decode pace target scaled "
        "with the time scale; the endpoint's `class_priority` interactive 10, batch 0) "
        "and one dataplane; `LUFTPAUSE_TOKEN` set; `[[callers]]`: `alice` (classes "
        "interactive and batch) and `mallory` (batch only, `on_denied_class = "
        '"downgrade"`), each with a key of its own',
        f"- load: time scale {s.time_scale:g}; {s.alice} agents of alice's (interactive) "
        f"and, beside them, {s.mallory} of mallory's; about {CONTEXT_CHARS:,}-character "
        f"contexts, {TOOL_CALLS} `lookup` tool calls per run, replies capped at 256 tokens; "
        f"{s.warmup_s:g} s of warm-up (the agents starting over its first half), then a "
        f"window of {s.window_s:g} s (model time); the same seeds in every arm of a "
        "repetition, so alice plays the same runs in each",
        "",
        "## Arms",
        "",
        "| arm | what runs |",
        "|---|---|",
        *(f"| `{a}` | {ARM_TEXT[a]} |" for a in ARMS),
        "",
        "## Alice's interactive service, and what mallory's turns ran as",
        "",
        table(rows, s.reps),
        "",
        "*alice turns*: her turns that ended in the window; *turn p50 / p90*: their wall "
        "time, request to last token; *held s/turn*: the mean time a turn of hers (of the "
        "runs that finished in the window) waited in luftpause for admission; *alice runs*: "
        "her runs finished in the window; *mallory turns*: mallory's turns that ended in the "
        "window. The next three columns are the services' counters over the whole arm, "
        "warm-up included: *served interactive / batch*: the dataplane's turns that ran "
        "(finished or paused on a tool call) by the class they ran as, every caller "
        "together; *class denied*: the dataplane's `luftpause_dataplane_class_denied_total` "
        "by caller and action; *tokens by caller*: the scheduler's "
        "`luftpause_scheduler_caller_tokens_total` (prompt + completion tokens of finished "
        "turns) by caller label, where `mallory/alice` is mallory's sub-caller: mallory's "
        "claim of alice's name, kept under mallory's key. Times in model seconds (measured × "
        f"{s.time_scale:g}).",
        "",
    ]
    ratios = against_alone(rows)
    if ratios:
        lines += ["Alice's interactive turn p50 against `alone`: " + "; ".join(ratios) + ".", ""]
    lines += [
        "## The engine",
        "",
        engine_table(rows, s.reps),
        "",
        "Over each arm (warm-up included): the engine's requests, its mean decode batch, "
        "the mean time a request queued in it, prefilled and decoded (model seconds), and "
        "*behind*, the share of its busy time its steps started late because the host's CPU "
        "was busy.",
        "",
        f"Raw results: [{out['json']}]({out['json']}).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short arms (about 2 minutes)")
    parser.add_argument("--reps", type=int, help="repetitions of every arm (default: 1)")
    parser.add_argument("--time-scale", type=float, help="engine/tool speed-up (default 5)")
    parser.add_argument("--out", type=Path, help="the Markdown report (JSON beside it)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error("--reps must be at least 1")
        settings = replace(settings, reps=args.reps)
    if args.time_scale is not None:
        if args.time_scale <= 0:
            parser.error("--time-scale must be positive")
        settings = replace(settings, time_scale=args.time_scale)
    md = args.out or default_out(args.quick)
    js = md.with_suffix(".json")
    # Fresh credentials for this run: the services inherit them, the mix names them.
    token = secrets.token_urlsafe(24)
    os.environ.update({"LUFTPAUSE_TOKEN": token, ALICE_ENV: new_key(), MALLORY_ENV: new_key()})
    before = loadavg()
    started = time.monotonic()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rows = []
    with tempfile.TemporaryDirectory(prefix="luftpause-callers-") as tmp:
        for rep, arm in arm_order(settings.reps):
            row = run_arm(settings, arm, rep, Path(tmp), token)
            print(
                f"  {arm:18} rep {rep}: alice turn p50 {_s(row['alice_turn_p50_s'], 2)} s, "
                f"{row['alice_runs']} runs (load avg {row['load_avg']})",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    after = loadavg()
    rows.sort(key=lambda r: (r["rep"], ARMS.index(r["arm"])))
    out = {
        "command": shlex.join(["python", "tools/bench/callers.py", *(argv or sys.argv[1:])]),
        "commit": code_version(),
        "date": date,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine(),
        "loadavg_before": before,
        "loadavg_after": after,
        "settings": asdict(settings),
        "callers_toml": CALLERS_TOML,
        "json": js.name,
        "rows": rows,
    }
    print(table(rows, settings.reps))
    ratios = against_alone(rows)
    if ratios:
        print("alice's turn p50 against alone: " + "; ".join(ratios))
    print(f"load average before: {before}; after: {after}")
    md.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(out, indent=1))
    md.write_text(report(out))
    print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
