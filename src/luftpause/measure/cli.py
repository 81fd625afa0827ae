"""The command-line options ``luftpause loadgen`` and ``luftpause sim`` share, and the
groups of runs they read from them.

:func:`add_run_shape` and :func:`add_trace_argument` add the options that shape a run
(``--context-chars``, ``--tool-calls``, ``--max-tokens``, ``--profile``) and name a
trace to replay (``--trace``); :func:`build_groups` turns ``--mix``, ``--group``,
``--agents`` and ``--subagents`` into groups (``mix``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from luftpause.cliargs import positive_int as _positive_int
from luftpause.measure.mix import (
    Defaults,
    Group,
    MixError,
    ToolCalls,
    load_mix,
    parse_group,
    unique_names,
)
from luftpause.measure.workload import PROFILES


def _tool_calls(text: str) -> ToolCalls:
    try:
        return ToolCalls.parse(text)
    except MixError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_shape(group: argparse._ArgumentGroup, tool_calls_help: str) -> None:
    """The shape of a run: its context, tool calls and reply limit (loadgen and sim)."""
    group.add_argument(
        "--context-chars",
        type=int,
        default=8000,
        help="characters of context per run: shared preamble + per-run task (default: 8000)",
    )
    group.add_argument(
        "--tool-calls",
        type=_tool_calls,
        default=ToolCalls(3, 3),
        metavar="N|A-B",
        help=tool_calls_help,
    )
    group.add_argument(
        "--max-tokens", type=_positive_int, default=256, help="reply limit per turn (default: 256)"
    )
    group.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="shape every own-loop group's runs like real agent traces instead (turns, "
        "context growth, tool times, parallel sub-agents; replaces the three options above; "
        "see docs/guides/workloads.md)",
    )


def add_trace_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help='replay the runs of a JSONL trace, one run per line: {"id", "class", '
        '"start_s", "turns": [{"prompt_tokens", "completion_tokens", "tool_s"}]} '
        "(see docs/guides/workloads.md)",
    )


def build_groups(args: argparse.Namespace) -> list[Group]:
    defaults = Defaults(
        context_chars=args.context_chars,
        tool_calls=args.tool_calls,
        max_tokens=args.max_tokens,
        profile=getattr(args, "profile", None),
    )
    groups: list[Group] = []
    if args.mix is not None:
        groups.extend(load_mix(args.mix, defaults))
    for text in args.group:
        groups.append(parse_group(text, len(groups), defaults))
    for count, kind in ((args.agents, "agents"), (args.subagents, "subagents")):
        if count:
            cls = args.cls or "batch"
            name = args.caller or f"{cls}-{kind}"
            groups.append(
                Group(
                    name=name,
                    count=count,
                    cls=cls,
                    caller=args.caller or name,
                    kind=kind,
                    context_chars=args.context_chars,
                    tool_calls=args.tool_calls,
                    max_tokens=args.max_tokens,
                    profile=getattr(args, "profile", None) if kind == "agents" else None,
                )
            )
    return unique_names(groups)
