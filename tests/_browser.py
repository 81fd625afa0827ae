"""Headless Chromium for page tests (S12): dump a page's DOM after its scripts ran, or
screenshot it.

Chromium is the Debian package (``apt-get install -y chromium``; ``.ci/run`` installs
it). Without it the browser tests skip, except where they are required (``CI``,
``LUFTPAUSE_REQUIRE_BROWSER`` or ``LUFTPAUSE_REQUIRE_CONFORMANCE`` set): there they
fail. Every launch gets a fresh profile, a bounded wall time, and its whole process
group is killed afterwards (by the PID of the process it started).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
REQUIRED_BY = ("CI", "LUFTPAUSE_REQUIRE_BROWSER", "LUFTPAUSE_REQUIRE_CONFORMANCE")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)
LAUNCH_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    override = os.environ.get("LUFTPAUSE_CHROMIUM")
    if override:
        return override
    return next((p for p in map(shutil.which, NAMES) if p), None)


def require_chromium() -> str:
    """The browser's path; skip (fail where required) without one."""
    path = find_chromium()
    if path is not None:
        return path
    why = "Chromium is not installed (apt-get install -y chromium)"
    required = [v for v in REQUIRED_BY if os.environ.get(v)]
    if required:
        pytest.fail(f"{why}, and {', '.join(required)} requires the browser tests")
    pytest.skip(why)


@dataclass
class Browser:
    exe: str
    tmp: Path
    launches: int = 0

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.launches += 1
        profile = Path(tempfile.mkdtemp(prefix=f"profile-{self.launches}-", dir=self.tmp))
        cmd = [self.exe, *FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its renderers, GPU and zygote share our child's group
            env={**os.environ, "HOME": str(profile)},
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(proc.pid)
            out, err = proc.communicate()
            raise AssertionError(
                f"chromium did not finish within {timeout:g} s: {' '.join(args)}\n{err[-3000:]}"
            ) from None
        finally:
            self._kill_group(proc.pid)
        if proc.returncode != 0:
            raise AssertionError(f"chromium exited with {proc.returncode}: {err[-3000:]}")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    @staticmethod
    def _kill_group(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def dump_dom(self, url: str, budget_ms: int = 5000, timeout: float = LAUNCH_TIMEOUT_S) -> str:
        """The DOM after the page's scripts ran for ``budget_ms`` of virtual time."""
        args = [f"--virtual-time-budget={budget_ms}", "--dump-dom", url]
        return self._run(args, timeout).stdout

    def screenshot(
        self,
        url: str,
        path: Path,
        size: tuple[int, int] = (1400, 1000),
        budget_ms: int = 5000,
        timeout: float = LAUNCH_TIMEOUT_S,
    ) -> Path:
        args = [
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={path}",
            url,
        ]
        self._run(args, timeout)
        assert path.is_file() and path.stat().st_size > 0, f"no screenshot written to {path}"
        return path


# ---- a small DOM for assertions ---------------------------------------------------------------

VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}
    | {"track", "wbr"}
)


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.walk()

    def find_all(self, match: Callable[[Node], bool]) -> list[Node]:
        return [n for n in self.walk() if match(n)]

    def by_id(self, ident: str) -> Node:
        found = self.find_all(lambda n: n.attrs.get("id") == ident)
        assert found, f"no element with id {ident!r}"
        return found[0]

    def with_attr(self, name: str, value: str | None = None) -> list[Node]:
        return self.find_all(
            lambda n: name in n.attrs and (value is None or n.attrs[name] == value)
        )

    @property
    def hidden(self) -> bool:
        node: Node | None = self
        while node is not None:
            if "hidden" in node.attrs:
                return True
            node = node.parent
        return False

    def cells(self) -> list[str]:
        return [" ".join(c.text().split()) for c in self.children if isinstance(c, Node)]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        node: Node | None = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data: str) -> None:
        self.cur.children.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
