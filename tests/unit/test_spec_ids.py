"""The specification's behaviour IDs: defined once, and every one cited exists.

Covers no behaviour ID itself: it guards the IDs of docs/reference/spec.md.

* The spec defines each ID in a heading ``### S2 · Title {#s2}``: every such heading
  parses, no ID is defined twice, the anchor is the ID in lower case, and each letter's
  numbers run from 1 without a gap (so an item cannot silently drop out).
* Every ID cited in ``src/``, ``tests/``, ``tools/`` and ``examples/`` (``.py``,
  ``.toml``, ``.proto``, ``.yaml``), in ``docs/**/*.md`` and in ``README.md`` is defined
  there; the failure lists ``file:line ID`` for each one that is not.
* Every defined ID is cited by some test (the convention: tests name the IDs they cover
  in their docstrings). The IDs no test cites yet are printed and reported as a warning;
  the test fails only when an ID outside ``_UNCITED_IN_TESTS`` is uncited, so a citation
  that exists today cannot be lost.

What counts as a citation: a capital ``S``, ``D``, ``R``, ``H``, ``X`` or ``B`` followed
by one to three digits, standing alone as a word (``\\b`` on both sides). Three digits,
not two, so a slip such as a two-digit ID with a stray third digit is caught too. Word
boundaries already keep out hexadecimal (a letter or digit before the capital letter),
commit hashes (lower case) and lower-case anchors such as ``spec.md#s2``. ``HTTP/2`` is
always written out in this tree, never as the defined ``H2``. A range such as
``R1-R15`` checks both ends, and counts every ID between them as cited. Two narrow
contexts are not citations:

1. the rule codes of a ``# noqa:`` comment (ruff's flake8-bugbear ``B`` codes have three
   digits, and its ``S`` and ``D`` families would clash too, should they be enabled):
   only the comma-separated code list right after ``noqa:`` is skipped, not the rest of
   the line;
2. a token that is a whole quoted string literal, ``"B1"`` or ``'R2'``: tests use such
   strings as caller, run and turn names (``sim.req("b1", "B1")``). A citation is never
   a string of its own, so quoting nothing else is lost.

``test_the_scanner_*`` plant bad IDs in text to show each check fails on them.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "reference" / "spec.md"
LETTERS = "SDRHXB"

# IDs no test names today (they describe work not built yet). Shrink it as tests appear.
_UNCITED_IN_TESTS = frozenset({"B12"})

_ID_HEADING = re.compile(
    rf"^###[ \t]+(?P<id>[{LETTERS}]\d+)[ \t]+·[ \t]+\S.*?[ \t]*\{{#(?P<anchor>[^}} \t]+)\}}[ \t]*$"
)
_LOOKS_LIKE_ID_HEADING = re.compile(rf"^#{{1,6}}[ \t]+[{LETTERS}]\d+\b")
_CITATION = re.compile(rf"\b([{LETTERS}])(\d{{1,3}})\b")
_RANGE = re.compile(rf"\b([{LETTERS}])(\d{{1,2}})[ \t]*[-–][ \t]*\1(\d{{1,2}})\b")
_NOQA_CODES = re.compile(r"noqa:[ \t]*[A-Z]+\d+(?:[ \t]*,[ \t]*[A-Z]+\d+)*")
_SUFFIXES = (".py", ".toml", ".proto", ".yaml")
_SKIP_DIRS = {".venv", "__pycache__", ".git", "node_modules", ".cache"}


def spec_headings(text: str) -> tuple[list[tuple[int, str, str]], list[str]]:
    """``(line, id, anchor)`` of every ID heading, and the problems of malformed ones."""
    found: list[tuple[int, str, str]] = []
    problems: list[str] = []
    for no, line in enumerate(text.splitlines(), 1):
        m = _ID_HEADING.match(line)
        if m:
            found.append((no, m["id"], m["anchor"]))
        elif _LOOKS_LIKE_ID_HEADING.match(line):
            problems.append(f"spec.md:{no}: not '### ID · Title {{#id}}': {line.strip()}")
    return found, problems


def heading_problems(text: str) -> list[str]:
    headings, problems = spec_headings(text)
    counts = Counter(ident for _, ident, _ in headings)
    for no, ident, anchor in headings:
        if counts[ident] > 1:
            problems.append(f"spec.md:{no}: {ident} is defined {counts[ident]} times")
        if anchor != ident.lower():
            problems.append(f"spec.md:{no}: {ident}'s anchor is #{anchor}, not #{ident.lower()}")
    for letter in LETTERS:
        numbers = sorted({int(ident[1:]) for ident in counts if ident[0] == letter})
        if not numbers:
            problems.append(f"spec.md: no {letter} IDs")
        elif numbers != list(range(1, numbers[-1] + 1)):
            missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
            problems.append(f"spec.md: {letter} numbers have gaps: {missing}")
    return problems


def citations(line: str) -> Iterator[str]:
    """The IDs a line cites, ranges expanded, outside the excluded contexts."""
    for noqa in _NOQA_CODES.finditer(line):
        line = line[: noqa.start()] + " " * (noqa.end() - noqa.start()) + line[noqa.end() :]
    for m in _CITATION.finditer(line):
        before = line[m.start() - 1 : m.start()]
        after = line[m.end() : m.end() + 1]
        if before in ("'", '"') and after == before:
            continue
        yield m.group()
    for m in _RANGE.finditer(line):
        first, last = int(m[2]), int(m[3])
        for n in range(first + 1, last):
            yield f"{m[1]}{n}"


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for top in ("src", "tests", "tools", "examples"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in _SUFFIXES and path.is_file() and not _SKIP_DIRS & set(path.parts):
                files.append(path)
    files += [p for p in (ROOT / "docs").rglob("*.md") if p.is_file()]
    files.append(ROOT / "README.md")
    return sorted(files)


def undefined_citations(path_name: str, text: str, defined: set[str]) -> list[str]:
    return [
        f"{path_name}:{no} {ident}"
        for no, line in enumerate(text.splitlines(), 1)
        for ident in citations(line)
        if ident not in defined
    ]


def _defined() -> set[str]:
    headings, _ = spec_headings(SPEC.read_text(encoding="utf-8"))
    return {ident for _, ident, _ in headings}


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_the_spec_defines_each_id_once_with_its_anchor() -> None:
    problems = heading_problems(SPEC.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_every_cited_id_is_defined_in_the_spec() -> None:
    defined = _defined()
    assert defined
    bad = [
        line
        for path in scanned_files()
        for line in undefined_citations(str(path.relative_to(ROOT)), _read(path), defined)
    ]
    assert not bad, "cited but not defined in docs/reference/spec.md:\n" + "\n".join(bad)


def test_every_defined_id_is_cited_by_a_test() -> None:
    defined = _defined()
    this_file = Path(__file__).resolve()
    cited = {
        ident
        for path in scanned_files()
        if path.is_relative_to(ROOT / "tests") and path.resolve() != this_file
        for line in _read(path).splitlines()
        for ident in citations(line)
    }
    uncited = sorted(defined - cited, key=lambda i: (LETTERS.index(i[0]), int(i[1:])))
    if uncited:
        print("defined IDs no test cites:", ", ".join(uncited))
        warnings.warn(f"defined IDs no test cites: {', '.join(uncited)}", stacklevel=1)
    lost = [i for i in uncited if i not in _UNCITED_IN_TESTS]
    assert not lost, f"no test cites {', '.join(lost)} any more"


# The checks above, on planted text. Bad IDs are built from pieces so this file cites none.


def _id(letter: str, number: int) -> str:
    return f"{letter}{number}"


def test_the_scanner_finds_planted_undefined_ids() -> None:
    defined = {_id(letter, n) for letter in LETTERS for n in range(1, 14)}
    s31, d77, s131 = _id("S", 31), _id("D", 77), _id("S", 131)
    text = "\n".join(
        [
            f'    """{s31}: a typo in a docstring."""',
            f"# {d77}/S2: a comment",
            f"A range S1-{_id('S', 40)} and {s131} in prose.",
            "[S2](../reference/spec.md#s2), HTTP/2, sha a1b2c3d, 0xB1 fine",
        ]
    )
    assert undefined_citations("f.py", text, defined) == [
        f"f.py:1 {s31}",
        f"f.py:2 {d77}",
        f"f.py:3 {_id('S', 40)}",
        f"f.py:3 {s131}",
        *(f"f.py:3 {_id('S', n)}" for n in range(14, 40)),
    ]


def test_the_scanner_skips_only_noqa_codes_and_quoted_names() -> None:
    bad = _id("B", 77)
    assert list(citations("x  # noqa: B018, SIM105 - why")) == []
    assert list(citations(f"x  # noqa: B018 - see {bad}")) == [bad]
    assert list(citations('sim.req("b1", "B1")')) == []
    assert list(citations(f'"""{bad}: quoted docstring."""')) == [bad]
    assert list(citations(f"`{bad}` and ({bad})")) == [bad, bad]


def test_the_heading_checks_fail_on_planted_mistakes() -> None:
    good = "".join(
        f"### {letter}1 · One {{#{letter.lower()}1}}\n### {letter}2 · Two {{#{letter.lower()}2}}\n"
        for letter in LETTERS
    )
    assert heading_problems(good) == []
    assert any("defined 2 times" in p for p in heading_problems(good + "### S2 · Again {#s2}\n"))
    assert any("anchor is #s-2" in p for p in heading_problems(good + "### S3 · X {#s-2}\n"))
    assert any("not '### ID" in p for p in heading_problems(good + "### S3 · No anchor\n"))
    gap = good + f"### {_id('S', 4)} · Four {{#s4}}\n"
    assert any("gaps: [3]" in p for p in heading_problems(gap))
