"""kubectl for rendering the Kubernetes manifests (``kubectl kustomize``, X3).

The manifests use kustomize v5 syntax, so kubectl must bundle kustomize v5 or newer
(kubectl 1.27 and later). Debian's ``kubernetes-client`` (1.20, kustomize v2) is too
old; ``.ci/run`` installs the ``kubectl`` package when none is found, which works where
the Kubernetes apt repository is configured. ``LUFTPAUSE_KUBECTL`` names another binary.
Without a usable kubectl the manifest tests skip, except where they are required
(``CI``, ``LUFTPAUSE_REQUIRE_KUBECTL`` or ``LUFTPAUSE_REQUIRE_CONFORMANCE`` set): there
they fail. Every call is bounded in time.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REQUIRED_BY = ("CI", "LUFTPAUSE_REQUIRE_KUBECTL", "LUFTPAUSE_REQUIRE_CONFORMANCE")
MIN_KUSTOMIZE = (5, 0)
TIMEOUT_S = 60.0


@functools.cache
def find_kubectl() -> tuple[str | None, str]:
    """(path, "") for a usable kubectl, else (None, why not)."""
    exe = os.environ.get("LUFTPAUSE_KUBECTL") or shutil.which("kubectl")
    if exe is None:
        return None, "kubectl is not installed (apt-get install -y kubectl, 1.27 or newer)"
    try:
        out = subprocess.run(
            [exe, "version", "--client"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{exe} does not run: {exc}"
    found = re.search(r"Kustomize Version: v(\d+)\.(\d+)", out.stdout)
    if found is None:
        return None, f"{exe} names no bundled kustomize (kubectl 1.27 or newer needed)"
    version = (int(found[1]), int(found[2]))
    if version < MIN_KUSTOMIZE:
        return None, f"{exe} bundles kustomize v{found[1]}.{found[2]}, older than v5"
    return exe, ""


def require_kubectl() -> str:
    """kubectl's path; skip (fail where required) without a usable one."""
    exe, why = find_kubectl()
    if exe is not None:
        return exe
    required = [v for v in REQUIRED_BY if os.environ.get(v)]
    if required:
        pytest.fail(f"{why}, and {', '.join(required)} requires the Kubernetes manifest tests")
    pytest.skip(why)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIRECTORY`` renders."""
    exe = require_kubectl()
    out = subprocess.run(
        [exe, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    # kustomize warns about deprecated fields (commonLabels, patchesStrategicMerge, ...).
    assert "warning" not in out.stderr.lower(), out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]
