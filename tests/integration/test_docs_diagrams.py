"""Every Mermaid diagram in ``docs/`` renders with the Mermaid the site loads.

Material for MkDocs draws ```` ```mermaid ```` blocks in the reader's browser with Mermaid 11
(``mermaid@11`` from a CDN), so ``mkdocs build --strict`` never sees a diagram's syntax. Here
each block is rendered by the same major version (pinned, from npm) in headless Chromium: a
diagram Mermaid cannot parse or lay out fails the test with its file, line and Mermaid's
message. Chromium and npm as the other browser and client tests get them (``.ci/run``). No
behaviour IDs: this guards the documentation.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import _npm
import pytest
from _browser import Browser, parse, require_chromium

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MERMAID = _npm.Bundle(
    packages=(_npm.Package("mermaid", "mermaid", "11.17.2"),),
    before="2026-12-01",
    files=("mermaid/dist/mermaid.min.js",),
)
REQUIRE_VARS = ("CI", "LUFTPAUSE_REQUIRE_BROWSER", "LUFTPAUSE_REQUIRE_CONFORMANCE")
_FENCE = re.compile(r"^( *)```mermaid[^\n]*\n(.*?)^\1```", re.S | re.M)

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><script src="{script}"></script></head>
<body><div id="results"></div>
<script>
const diagrams = {diagrams};
mermaid.initialize({{ startOnLoad: false, securityLevel: "strict" }});
(async () => {{
  const out = document.getElementById("results");
  for (let i = 0; i < diagrams.length; i++) {{
    const pre = document.createElement("pre");
    pre.id = "diagram-" + i;
    try {{
      const {{ svg }} = await mermaid.render("svg-" + i, diagrams[i]);
      pre.dataset.ok = svg.includes("<svg") ? "yes" : "no svg";
    }} catch (err) {{
      pre.dataset.ok = "no";
      pre.textContent = String(err && err.message || err);
    }}
    out.appendChild(pre);
  }}
  document.body.dataset.done = "yes";
}})();
</script></body></html>
"""


def _diagrams() -> list[tuple[str, str]]:
    """(``file:line``, source) of every Mermaid block in docs/."""
    found = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            indent = len(match.group(1))
            body = "\n".join(row[indent:] for row in match.group(2).splitlines())
            found.append((f"{path.relative_to(ROOT)}:{line}", body))
    return found


def test_every_mermaid_diagram_renders(tmp_path: Path) -> None:
    diagrams = _diagrams()
    assert diagrams, "docs/ has no Mermaid diagram: the architecture pages lost theirs"
    try:
        base = _npm.ensure_installed(MERMAID)
    except _npm.NpmUnavailable as exc:
        if any(os.environ.get(v) for v in REQUIRE_VARS):
            pytest.fail(f"Mermaid could not be installed: {exc}")
        pytest.skip(f"Mermaid could not be installed: {exc}")
    browser = Browser(require_chromium(), tmp_path)
    page = tmp_path / "diagrams.html"
    script = (base / "node_modules" / "mermaid" / "dist" / "mermaid.min.js").as_uri()
    sources = json.dumps([body for _, body in diagrams]).replace("</", "<\\/")
    page.write_text(PAGE.format(script=html.escape(script), diagrams=sources))
    dom = parse(browser.dump_dom(page.as_uri(), budget_ms=20_000, timeout=120))
    assert dom.by_id("results") is not None
    assert dom.find_all(lambda n: n.attrs.get("data-done") == "yes"), (
        "Mermaid did not finish rendering within the page's time budget"
    )
    failed = []
    for i, (where, _) in enumerate(diagrams):
        result = dom.by_id(f"diagram-{i}")
        if result.attrs.get("data-ok") != "yes":
            failed.append(f"{where}: {result.text().strip() or result.attrs.get('data-ok')}")
    assert not failed, "Mermaid diagrams that do not render:\n" + "\n".join(failed)
