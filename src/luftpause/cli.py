"""The ``luftpause`` command: one subcommand per service, plus ``up`` for the whole stack.

Each service lives in a module that exposes ``add_arguments(parser)`` and
``main(args) -> int``; modules are imported only when their subcommand runs,
so ``luftpause --help`` stays fast and a missing optional piece never breaks
the others.

The services that read the stack file (scheduler, dataplane, runtime) also take
``--check``: validate the configuration as the service would load it, print a
summary and exit (see :mod:`luftpause.check`), without starting anything.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, cast


class _ServiceModule(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("up", "luftpause.up", "start the whole stack on loopback in the foreground"),
    Command(
        "scheduler", "luftpause.scheduler.service.main", "run the scheduler (gRPC + status HTTP)"
    ),
    Command("dataplane", "luftpause.dataplane.main", "run the OpenAI-compatible proxy"),
    Command("runtime", "luftpause.runtime.main", "run the MCP sub-agent runtime"),
    Command("fake-engine", "luftpause.fakes.engine.server", "run a simulated inference engine"),
    Command("fake-mcp", "luftpause.fakes.mcp_tools", "run the fake MCP tool server"),
    Command("loadgen", "luftpause.loadgen.main", "generate agent load and report run times"),
    Command("sim", "luftpause.sim.main", "simulate agent load on the engine model, arm by arm"),
    Command("status", "luftpause.status_cli", "show replicas, held turns, runs and the run tree"),
    Command("keys", "luftpause.keys_cli", "make, hash and check the keys that bind callers"),
)

# The services that read the stack file: each also takes --check (luftpause.check).
CHECKED_COMMANDS = frozenset({"scheduler", "dataplane", "runtime"})


def available(command: Command) -> bool:
    """True when the command's module is part of this installation."""
    try:
        return importlib.util.find_spec(command.module) is not None
    except ModuleNotFoundError:
        return False


def build_parser(
    wanted: str | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, _ServiceModule]]:
    """The command line's parser, with the arguments of the command ``wanted`` (default:
    the one ``sys.argv`` names); the other commands only list their help line."""
    parser = argparse.ArgumentParser(
        prog="luftpause",
        description=(
            "Run-aware admission control for agent workloads. `luftpause up` starts "
            "everything on fake engines; each service can also run on its own."
        ),
    )
    from luftpause import __version__

    parser.add_argument("--version", action="version", version=f"luftpause {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, _ServiceModule] = {}
    if wanted is None:
        wanted = sys.argv[1] if len(sys.argv) > 1 else None
    for command in COMMANDS:
        if not available(command):
            continue
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        # Import only the module whose subcommand runs; others just list their help line.
        if command.name == wanted:
            module = cast(_ServiceModule, importlib.import_module(command.module))
            module.add_arguments(p)
            modules[command.name] = module
            if command.name in CHECKED_COMMANDS:
                from luftpause.check import add_check_argument

                add_check_argument(p)
    return parser, modules


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run a command; ``environ`` (default: the process's) is what ``--check`` reads."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    parser, modules = build_parser()
    args = parser.parse_args()
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "check", False):
        from luftpause.check import run_check

        return run_check(args.command, args, os.environ if environ is None else environ)
    # A port out of range is refused here (``--check`` lists it with every other problem);
    # the kernel would otherwise take it modulo 65536.
    from luftpause.check import port_problem

    for flag in ("port", "http_port", "link_port"):
        problem = port_problem("--" + flag.replace("_", "-"), getattr(args, flag, None))
        if problem:
            print(f"luftpause {args.command}: {problem}", file=sys.stderr)
            return 2
    try:
        return modules[args.command].main(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
