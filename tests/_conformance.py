"""The MCP conformance suite (npm ``@modelcontextprotocol/conformance``) for tests.

The suite needs Node >= 22; the system Node may be older. So Node itself comes
from the npm registry too (``node-linux-<arch>`` carries the binary), and both
are installed with the system ``npm`` into ``.cache/node/<pins>/`` in the
repository (git ignores ``.cache/``) by the shared helper ``tests/_npm.py``
(which the client tests use too), once: a file lock keeps parallel test
processes from installing over each other, and a stamp written last marks a
finished install. Versions are pinned exactly; ``npm install --before`` keeps
the suite's own dependencies at what the registry held on ``NPM_BEFORE``, so a
later publish cannot change what runs.

``run_conformance(url, spec_version=...)`` runs scenarios one by one with
``--output-dir`` and reads each scenario's ``checks.json`` (the suite's
machine-readable output): a scenario *failed* if any check is ``FAILURE``,
*passed* if at least one of its own checks is ``SUCCESS``, else *skipped* (the
suite says ``SKIPPED`` for scenarios outside the requested spec version;
``WARNING`` and ``INFO`` do not fail a scenario, as in the suite itself). The
returned mapping also carries the suite's full output and every check.

When Node cannot be installed (no ``npm`` on PATH, registry unreachable, no
pinned Node build for this platform) ``ConformanceUnavailable`` says why; tests
turn it into a skip with that reason, or into a failure where the suite must
run (``CI`` or ``LUFTPAUSE_REQUIRE_CONFORMANCE`` set).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _npm
from _npm import CACHE, INSTALL_TIMEOUT_S, LOCK_TIMEOUT_S, NODE_VERSION, ROOT

__all__ = [
    "CACHE",
    "CONFORMANCE_VERSION",
    "INSTALL_TIMEOUT_S",
    "LOCK_TIMEOUT_S",
    "NODE_VERSION",
    "NPM_BEFORE",
    "ROOT",
    "ConformanceResults",
    "ConformanceUnavailable",
    "ensure_installed",
    "install_dir",
    "installed_or_skip",
    "require_conformance",
    "run_conformance",
]

CONFORMANCE_VERSION = "0.2.0-alpha.12"
NPM_BEFORE = "2026-12-01"  # registry state for the suite's transitive dependencies

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the suite colours its output regardless
_OWN_CHECKS = frozenset({"wire-schema-valid"})  # appended by the suite to every scenario


class ConformanceUnavailable(_npm.NpmUnavailable):
    """Node or the suite cannot be installed here; the message says why."""


class ConformanceResults(dict[str, str]):
    """Scenario -> ``"passed"`` / ``"failed"`` / ``"skipped"``, plus what the suite said."""

    def __init__(self) -> None:
        super().__init__()
        self.output = ""  # the suite's stdout+stderr, scenario after scenario
        self.checks: dict[str, list[dict[str, Any]]] = {}  # scenario -> checks.json
        self.seconds = 0.0

    def failed(self) -> list[str]:
        return [name for name, outcome in self.items() if outcome == "failed"]

    def report(self) -> str:
        """One line per scenario, then every non-SUCCESS check with its message."""
        lines = [f"{outcome:8} {name}" for name, outcome in self.items()]
        for name, checks in self.checks.items():
            for c in checks:
                if c.get("status") not in ("SUCCESS", "INFO"):
                    msg = c.get("errorMessage") or c.get("description", "")
                    lines.append(f"  {name}: [{c.get('status')}] {c.get('id')}: {msg}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- install

# Installed by the shared helper (tests/_npm.py) into .cache/node/conformance-<V>-node-<N>/.
SUITE = _npm.Bundle(
    packages=(
        _npm.Package("conformance", "@modelcontextprotocol/conformance", CONFORMANCE_VERSION),
    ),
    before=NPM_BEFORE,
    files=("@modelcontextprotocol/conformance/dist/index.js",),
)


def install_dir() -> Path:
    return SUITE.install_dir()


def ensure_installed() -> tuple[Path, Path]:
    """Install the pinned Node and suite (once, under a lock); return (node, suite's index.js)."""
    try:
        _npm.ensure_installed(SUITE)
    except _npm.NpmUnavailable as exc:
        raise ConformanceUnavailable(str(exc)) from None
    return SUITE.node(), SUITE.modules() / SUITE.files[0]


# ----------------------------------------------------------------------------- run


def _env(node: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{node.parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    env["FORCE_COLOR"] = "0"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


def _outcome(checks: list[dict[str, Any]]) -> str:
    statuses = [c.get("status") for c in checks]
    if "FAILURE" in statuses:
        return "failed"
    own = [c.get("status") for c in checks if c.get("id") not in _OWN_CHECKS]
    return "passed" if "SUCCESS" in own else "skipped"


def run_conformance(
    url: str,
    *,
    spec_version: str,
    scenarios: list[str] | None = None,
    force: bool = False,
    timeout: float = 300,
) -> ConformanceResults:
    """Run server scenarios against ``url`` (all the suite's active ones for
    ``spec_version`` when ``scenarios`` is None); ``timeout`` bounds the whole run.

    Raises ``ConformanceUnavailable`` when Node or the suite cannot be installed."""
    node, suite = ensure_installed()
    env = _env(node)
    if scenarios is None:
        listed = subprocess.run(
            [str(node), str(suite), "list", "--server", "--spec-version", spec_version],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=True,
        ).stdout
        scenarios = [
            line.strip()[2:].split(" [")[0]
            for line in listed.splitlines()
            if line.strip().startswith("- ")
        ]
    results = ConformanceResults()
    started = time.monotonic()
    deadline = started + timeout
    with tempfile.TemporaryDirectory(prefix="luftpause-conformance-") as tmp:
        for name in scenarios:
            left = deadline - time.monotonic()
            if left <= 0:
                results[name] = "failed"
                results.output += f"\n=== {name}: not run, the {timeout:.0f} s budget is spent\n"
                continue
            out = Path(tmp) / name
            cmd = [str(node), str(suite), "server", "--url", url, "--scenario", name]
            cmd += ["--spec-version", spec_version, "--output-dir", str(out)]
            cmd += ["--timeout", str(int(max(1.0, min(left, 60.0)) * 1000))]
            if force:
                cmd.append("--force")
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=left, env=env, check=False
                )
                text, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as exc:
                partial = exc.stdout or b""
                text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
                text, rc = text + f"\n(killed after {left:.0f} s)", -1
            results.output += f"\n=== {name} (exit {rc})\n{_ANSI.sub('', text)}"
            files = sorted(out.glob("*/checks.json")) if out.exists() else []
            if files:
                checks = json.loads(files[-1].read_text())
                results.checks[name] = checks
                results[name] = _outcome(checks)
            elif rc == 0 and "SKIPPED:" in text:
                results[name] = "skipped"
            else:
                results[name] = "failed"
    results.seconds = time.monotonic() - started
    return results


def require_conformance() -> bool:
    """Whether a missing Node/suite must fail the tests instead of skipping them."""
    return _npm.required(("CI", "LUFTPAUSE_REQUIRE_CONFORMANCE"))


def installed_or_skip() -> None:
    """For a fixture: Node 22 + the suite, installed once; a real inability to install
    skips the test with the reason, or fails it where the suite must run (CI /
    LUFTPAUSE_REQUIRE_CONFORMANCE)."""
    import pytest

    try:
        ensure_installed()
    except ConformanceUnavailable as exc:
        reason = f"MCP conformance suite unavailable: {exc}"
        if require_conformance():
            pytest.fail(reason + " (required here: CI or LUFTPAUSE_REQUIRE_CONFORMANCE is set)")
        pytest.skip(reason)
