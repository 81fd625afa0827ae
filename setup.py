"""The build switch for the compiled scheduling core (docs/development "The compiled core").

Everything else about the package is in pyproject.toml. Built as it is, luftpause is a
pure ``py3-none-any`` wheel. With ``LUFTPAUSE_MYPYC=1`` set at build or install time,
the modules of ``luftpause.scheduler.core`` and the simulator's engine model
(``ENGINE_MODEL``: ``luftpause.fakes.engine``'s pure modules) are compiled with mypyc
into C extensions beside their source (the pattern of black's and mypy's own builds);
the pure source stays the reference. The compiled build needs mypy (which ships mypyc, pinned in
constraints.txt) and a C compiler in the build environment:

    pip install -c constraints.txt mypy setuptools wheel
    LUFTPAUSE_MYPYC=1 pip install --no-build-isolation -c constraints.txt .

(``make test-compiled`` does this in .venv-mypyc and runs the core's and the engine
model's tests there.)
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

CORE = Path("src/luftpause/scheduler/core")
# The engine model the simulator steps (its server package stays interpreted).
ENGINE = Path("src/luftpause/fakes/engine")
ENGINE_MODEL = ("blocks", "model", "results", "script", "tokens")


def ext_modules() -> list[object]:
    switch = os.environ.get("LUFTPAUSE_MYPYC", "")
    if switch in ("", "0"):
        return []
    if switch != "1":
        raise SystemExit(f"LUFTPAUSE_MYPYC={switch!r}: set it to 1 (compiled core) or 0 (pure)")
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        raise SystemExit(
            "LUFTPAUSE_MYPYC=1 needs mypyc in the build environment: "
            "pip install -c constraints.txt mypy, then build with --no-build-isolation"
        ) from e
    modules = sorted(str(p) for p in CORE.glob("*.py"))
    modules += [str(ENGINE / f"{name}.py") for name in ENGINE_MODEL]
    return list(mypycify(modules, opt_level="3", debug_level="0"))


setup(ext_modules=ext_modules())
