"""The documentation site builds, and every link in it and in the README leads somewhere.

``mkdocs build --strict`` (``mkdocs.yml``'s ``validation`` makes a broken link or anchor, a
page missing from the navigation and an unrecognised link errors), then a check over the
built HTML: every internal ``href`` and ``src`` names a file the build wrote, and every
fragment an element id on that page. The README is checked the same way: its relative links
name files in the repository, and a link into ``docs/`` with a fragment names a heading of
that page as the site renders it. The generated reference pages are current
(``tools/gen_docs.py --check``). No behaviour IDs: this guards the documentation itself.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif name in ("href", "src") and tag in ("a", "img", "link", "script", "source"):
                self.links.append(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        # Notices about MkDocs 2.0 from Material and mkdocs-redirects' dependency: the docs
        # extra pins MkDocs 1.6, which they do not concern.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
    )
    problems = [line for line in proc.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems or proc.stderr.splitlines()[-20:]
    )
    return out


def _internal(link: str) -> bool:
    parts = urlsplit(link)
    return not parts.scheme and not parts.netloc and not link.startswith(("mailto:", "data:"))


def _target(page: Path, site: Path, link: str) -> tuple[Path, str]:
    """The file a link on ``page`` names in the built site, and its fragment."""
    parts = urlsplit(link)
    if parts.path.startswith("/"):  # the 404 page links from the site's root
        base, rest = site, parts.path.lstrip("/")
    else:
        base, rest = page.parent, parts.path
    path = Path(posixpath.normpath(str(base / unquote(rest)))) if parts.path else page
    if path.is_dir() or not path.suffix:
        path = path / "index.html"
    return path, unquote(parts.fragment)


def _broken_links(site: Path) -> Iterator[str]:
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    for page, parsed in pages.items():
        for link in parsed.links:
            if not _internal(link) or (link.startswith("#") and not link[1:]):
                continue
            target, fragment = _target(page, site, link)
            where = f"{page.relative_to(site)}: {link}"
            if not target.exists():
                yield f"{where} (no such file)"
            elif fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    yield f"{where} (no id {fragment!r} on that page)"


def test_site_builds_strict_and_every_internal_link_resolves(site: Path) -> None:
    assert (site / "index.html").exists()
    broken = sorted(set(_broken_links(site)))
    assert not broken, f"{len(broken)} broken links in the built site:\n" + "\n".join(broken)


def test_every_file_in_docs_is_reachable_from_a_page(site: Path) -> None:
    """A page in the navigation is linked from every page; an archived report, a picture or
    a JSON file must be linked from some page, or it is lost to a reader of the site."""
    linked: set[Path] = set()
    for page in site.rglob("*.html"):
        for link in _parse(page).links:
            if _internal(link):
                linked.add(_target(page, site, link)[0])
    docs = ROOT / "docs"
    lost = []
    for path in sorted(p for p in docs.rglob("*") if p.is_file()):
        rel = path.relative_to(docs)
        if rel.suffix == ".md":
            stem = rel.with_suffix("")
            built = site / (stem.parent if stem.name == "index" else stem) / "index.html"
        else:
            built = site / rel
        if built not in linked:
            lost.append(str(rel))
    assert not lost, "files in docs/ that no page links to:\n" + "\n".join(lost)


_MD_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _readme_links() -> Iterator[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    for match in _MD_LINK.finditer(text):
        yield match.group(1) or match.group(2)


def test_readme_links_name_files_and_headings_that_exist(site: Path) -> None:
    broken = []
    links = list(_readme_links())
    assert links, "the README links nowhere: the pattern no longer matches its links"
    for link in links:
        if not _internal(link):
            continue
        parts = urlsplit(link)
        target = ROOT / unquote(parts.path) if parts.path else ROOT / "README.md"
        if not target.exists():
            broken.append(f"{link} (no such file)")
            continue
        if parts.fragment and target.suffix == ".md" and target.is_relative_to(ROOT / "docs"):
            page = target.relative_to(ROOT / "docs").with_suffix("")
            html = site / (page.parent if page.name == "index" else page) / "index.html"
            if parts.fragment not in _parse(html).ids:
                broken.append(f"{link} (no heading {parts.fragment!r} on that page)")
    assert not broken, "broken README links:\n" + "\n".join(broken)


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; the rest belongs on the site (docs/)"


def test_generated_reference_pages_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
