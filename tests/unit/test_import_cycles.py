"""No module of ``luftpause`` takes part in an import cycle.

The import graph is read from the source with grimp (the library import-linter
uses): every ``import`` counts, those under ``if TYPE_CHECKING:`` and those inside
functions included, since a cycle hidden by either is still a cycle of design. The
layer contracts in ``pyproject.toml`` (``lint-imports``) keep the order of the
dataplane's and the scheduler service's modules; this test names any cycle, in any
package, import by import.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable

import grimp


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's
    algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = []
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(graph.find_modules_directly_imported_by(root)))))
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def shortest_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the modules in order
    (the first repeated at the end)."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.find_modules_directly_imported_by(node) & members):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start} in {component}")


def describe(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    """The cycle, one import a line: the module imported, and where its importer
    imports it (line number and text)."""
    steps = [cycle[0]]
    for importer, imported in itertools.pairwise(cycle):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details[:2])
        steps.append(f"{imported}  ({importer}, {where})")
    return "\n  -> ".join(steps)


def test_no_import_cycle_in_luftpause() -> None:
    """The import graph of ``luftpause``, every package of it, has no cycle."""
    graph = grimp.build_graph("luftpause", cache_dir=None)
    assert {"luftpause.dataplane.main", "luftpause.sim.main"} <= graph.modules
    cycles = [
        describe(graph, shortest_cycle(graph, component)) for component in strongly_connected(graph)
    ]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_and_names_a_cycle() -> None:
    """The finder reports a cycle in import order, with where each import is made, and
    not a module that only imports into it."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b", line_number=3, line_contents="import b")
    graph.add_import(importer="pkg.b", imported="pkg.c", line_number=4, line_contents="import c")
    graph.add_import(
        importer="pkg.c", imported="pkg.a", line_number=9, line_contents="from pkg import a"
    )
    graph.add_import(importer="pkg.d", imported="pkg.a", line_number=1, line_contents="import a")
    components = strongly_connected(graph)
    assert components == [["pkg.a", "pkg.b", "pkg.c"]]
    assert shortest_cycle(graph, components[0]) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    text = describe(graph, ["pkg.a", "pkg.b", "pkg.c", "pkg.a"])
    assert "line 9: from pkg import a" in text
