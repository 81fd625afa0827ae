"""Argument types for the command line: numbers with a clear error naming the value.

``argparse`` turns an ``ArgumentTypeError`` into ``luftpause X: error: argument
--flag: <message>`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, cast: type[int] | type[float], what: str) -> float:
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "a non-negative integer"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a positive number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a non-negative number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value
