"""How long a full garbage collection takes in a service process, before and after
freezing what start-up made (what ``serving.Bootstrap`` does once a service is up).

    python tools/bench/gc_pause.py                 # the dataplane
    python tools/bench/gc_pause.py --service scheduler

Imports the service's modules as its process does at start (the dataplane also loads
its client-API translators and their wire types), then times ``gc.collect()`` over
the objects tracked, five times, and again after ``gc.freeze()``. Prints a table; a
measurement, nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time

MODULES = {
    "dataplane": ("luftpause.dataplane.main", "luftpause.dataplane.app"),
    "scheduler": ("luftpause.scheduler.service.main",),
    "runtime": ("luftpause.runtime.main",),
}


def full_collections(times: int = 5) -> list[float]:
    """Milliseconds of each of ``times`` full collections."""
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", choices=sorted(MODULES), default="dataplane")
    args = parser.parse_args()
    for name in MODULES[args.service]:
        importlib.import_module(name)
    if args.service == "dataplane":
        from luftpause.dataplane.apis import client_apis

        for api in client_apis():
            api.load()
    tracked = len(gc.get_objects())
    before = full_collections()
    gc.freeze()
    after = full_collections()
    print(f"{args.service}: {tracked:,} objects tracked after start-up imports\n")
    print("| | full collection, median ms | min–max ms |")
    print("|---|---|---|")
    for label, ms in (("as started", before), ("after gc.freeze()", after)):
        print(f"| {label} | {statistics.median(ms):.2f} | {min(ms):.2f}–{max(ms):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
