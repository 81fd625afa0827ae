"""Loading a script of tools/bench (not a package) for the unit tests of its helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


def load(name: str) -> ModuleType:
    """``tools/bench/<name>.py`` as the module ``name``. The scripts import each other
    by name (``from flood import ...``), as they do when run from the directory: the
    directory is on the path, and a script one of them already imported is reused."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    path = BENCH / f"{name}.py"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module
