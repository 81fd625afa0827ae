"""The benchmarks: each script runs as ``python tools/bench/NAME.py`` (or ``python -m
tools.bench.NAME``); how they measure is in ``docs/benchmarks/methodology.md``."""
