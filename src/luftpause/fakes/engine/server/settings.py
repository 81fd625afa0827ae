"""The fake engine's settings (H1): ``ServerConfig`` and the command-line flags that fill it.

Flags are parsed once, in the entry point (``cli.main``), into one frozen
``ServerConfig`` that the app and the routes receive; nothing below reads the
environment.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

from luftpause.cliargs import non_negative_int as _non_negative_int
from luftpause.cliargs import positive_float as _positive_float
from luftpause.cliargs import positive_int as _positive_int
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.script import ScriptOptions
from luftpause.fakes.engine.server.faults import FAULTS
from luftpause.serving import add_service_arguments

DEFAULT_MODEL = "llama-3.2-1b"
DEFAULT_LABELS = ("lookup", "urgent", "chitchat")


@dataclass(frozen=True)
class ServerConfig:
    name: str = "fake-engine"
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    params: EngineParams = field(default_factory=EngineParams)
    script: ScriptOptions = field(default_factory=ScriptOptions)
    chunk_tokens: int = 1
    metrics: Literal["sglang", "vllm"] = "sglang"
    fault: str | None = None
    labels: tuple[str, ...] = DEFAULT_LABELS
    default_max_tokens: int | None = None  # None: context length - prompt (SGLang)
    # S6 at the engine: False answers any model name and echoes it (SGLang); True answers
    # 404 in vLLM's error shape for a model not in ``models`` (vLLM).
    strict_models: bool = False


def _per_mille(text: str) -> int:
    value = _non_negative_int(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"expected 0..1000, got {text!r}")
    return value


def _labels(text: str) -> tuple[str, ...]:
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if len(labels) < 2:
        raise argparse.ArgumentTypeError("expected at least two comma-separated labels")
    return labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, port_help="HTTP port (default: 8001)", config=False)
    defaults = EngineParams()
    parser.add_argument("--name", default="fake-engine", help="name shown in logs and /debug/state")
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help=f"model name to serve (repeatable; default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--strict-models",
        action="store_true",
        help="answer 404 (vLLM's error) for a model not given with --model; by default any "
        "model name is answered and echoed back, like SGLang",
    )
    parser.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="run the engine model this many times faster than real time (default: 1)",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=_positive_int,
        default=1,
        help="send one SSE chunk every N generated tokens, the first token alone as "
        "SGLang does (default: 1)",
    )
    parser.add_argument(
        "--metrics",
        choices=["sglang", "vllm"],
        default="sglang",
        help="Prometheus metric names on /metrics (default: sglang)",
    )
    parser.add_argument(
        "--priority-scheduling",
        action="store_true",
        help="honour the request body's priority (higher first, like SGLang)",
    )
    parser.add_argument(
        "--low-priority-first",
        action="store_true",
        help="with --priority-scheduling, schedule lower priority values first",
    )
    parser.add_argument(
        "--tool-results",
        type=_non_negative_int,
        default=3,
        help="with tools offered, call tools until the conversation holds N tool results "
        "(default: 3)",
    )
    parser.add_argument(
        "--text-tool-calls",
        action="store_true",
        help='write tool calls as Llama-3 plain text ({"name": ..., "parameters": ...})',
    )
    parser.add_argument(
        "--wrong-types",
        action="store_true",
        help="write numbers and booleans in tool arguments as strings",
    )
    parser.add_argument(
        "--runaway-per-mille",
        type=_per_mille,
        default=250,
        help="answers after tool results (agent loops), per thousand, that never stop on "
        "their own and run to max_tokens; only matters when a request sets no max_tokens "
        "(default: 250, calibrated)",
    )
    parser.add_argument(
        "--fault",
        choices=FAULTS,
        help="fail every request this way: refuse (close without answer), midstream, 429, "
        "500, 503, stall",
    )
    parser.add_argument(
        "--labels",
        type=_labels,
        default=DEFAULT_LABELS,
        help="comma-separated labels for /classify (default: lookup,urgent,chitchat)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed mixed into every generated reply (default: 0)"
    )
    parser.add_argument(
        "--max-running",
        type=_positive_int,
        help="cap on running requests (default: SGLang's memory-derived cap)",
    )
    parser.add_argument(
        "--kv-tokens",
        type=_positive_int,
        default=defaults.kv_tokens,
        help=f"KV pool size in tokens (default: {defaults.kv_tokens})",
    )
    parser.add_argument(
        "--context-length",
        type=_positive_int,
        default=defaults.context_length,
        help=f"model context length; also the default reply limit "
        f"(default: {defaults.context_length})",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=_positive_int,
        help="reply limit when a request sends no max_tokens "
        "(default: context length - prompt, like SGLang)",
    )
    parser.add_argument(
        "--gpu-sharers",
        type=_positive_int,
        default=defaults.gpu_sharers,
        help=f"replicas sharing one GPU; every step takes this many times longer "
        f"(default: {defaults.gpu_sharers})",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    try:
        params = EngineParams(
            kv_tokens=args.kv_tokens,
            context_length=args.context_length,
            max_running=args.max_running,
            gpu_sharers=args.gpu_sharers,
            priority_scheduling=args.priority_scheduling,
            low_priority_first=args.low_priority_first,
            time_scale=args.time_scale,
        )
    except ValueError as exc:
        raise SystemExit(f"luftpause fake-engine: {exc}") from None
    return ServerConfig(
        name=args.name,
        models=tuple(args.models or [DEFAULT_MODEL]),
        params=params,
        script=ScriptOptions(
            tool_results=args.tool_results,
            text_tool_calls=args.text_tool_calls,
            wrong_types=args.wrong_types,
            runaway_per_mille=args.runaway_per_mille,
            seed=args.seed,
        ),
        chunk_tokens=args.chunk_tokens,
        metrics=args.metrics,
        fault=args.fault,
        labels=args.labels,
        default_max_tokens=args.default_max_tokens,
        strict_models=args.strict_models,
    )
