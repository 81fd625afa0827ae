"""What the three examples share: their command line, the luftpause headers and how
they report a failure.

Kept small on purpose: each example reads on its own; this module only saves
repeating the flags and the one-line error message.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass
from typing import NoReturn

import openai

DEFAULT_URL = "http://127.0.0.1:8080/v1"  # the dataplane that `make run` starts
DEFAULT_MODEL = "llama-3.2-1b"
MAX_TOKENS = 256  # a short reply keeps a turn on the fake engines quick


@dataclass(frozen=True)
class Options:
    question: str
    base_url: str
    model: str
    service_class: str
    caller: str
    run_id: str

    @property
    def api_key(self) -> str:
        """The dataplane's token when it has one (D9); the client needs some key anyway."""
        return os.environ.get("LUFTPAUSE_TOKEN") or "unused"

    def headers(self) -> dict[str, str]:
        """The three headers luftpause reads on every turn of this run."""
        return {
            # One ID on every turn of the run: luftpause sends each turn back to the replica
            # that holds the run's prefix, and knows the run will come back while a tool runs.
            "x-luftpause-run-id": self.run_id,
            # Interactive turns are admitted before batch ones when the engines are full, and
            # an interactive run paused on a tool keeps a slot free on its replica.
            "x-luftpause-class": self.service_class,
            # Who is asking: within a class, the caller with fewest turns in flight goes first.
            "x-luftpause-caller": self.caller,
        }

    def banner(self) -> str:
        return (
            f"run {self.run_id} (class {self.service_class}, caller {self.caller}) "
            f"via {self.base_url}, model {self.model}"
        )


def parse_args(description: str, default_caller: str) -> Options:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("question", nargs="?", default="What is the weather in Oslo?")
    parser.add_argument(
        "--base-url",
        default=os.environ.get("LUFTPAUSE_URL", DEFAULT_URL),
        help=f"the luftpause dataplane (default: $LUFTPAUSE_URL or {DEFAULT_URL})",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default: {DEFAULT_MODEL}")
    parser.add_argument(
        "--class",
        dest="service_class",
        choices=("interactive", "batch"),
        default="interactive",
        help="service class of this run (default: interactive)",
    )
    parser.add_argument(
        "--caller", default=default_caller, help=f"who is asking (default: {default_caller})"
    )
    parser.add_argument("--run-id", help="the run's ID (default: a new UUID)")
    args = parser.parse_args()
    return Options(
        question=args.question,
        base_url=args.base_url,
        model=args.model,
        service_class=args.service_class,
        caller=args.caller,
        run_id=args.run_id or str(uuid.uuid4()),
    )


def fail(exc: BaseException, base_url: str) -> NoReturn:
    """One line on stderr saying what went wrong, then exit 1 (no traceback)."""
    print(f"error: {describe(exc, base_url)}", file=sys.stderr)
    raise SystemExit(1)


def describe(exc: BaseException, base_url: str) -> str:
    if isinstance(exc, openai.APIConnectionError):
        cause: BaseException = exc  # the transport's own error says most (refused, reset, ...)
        while isinstance(cause, openai.APIConnectionError) and cause.__cause__ is not None:
            cause = cause.__cause__
        reason = str(cause) or type(cause).__name__
        return f"no answer from the luftpause proxy at {base_url}: {reason} (is `make run` up?)"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        text = message if isinstance(message, str) else exc.message
        hint = "; set LUFTPAUSE_TOKEN to the proxy's token" if exc.status_code == 401 else ""
        return f"the proxy answered {exc.status_code}: {text}{hint}"
    return f"{type(exc).__name__}: {exc}"
