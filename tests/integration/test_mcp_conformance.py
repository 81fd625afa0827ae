"""R1: the runtime's ``/mcp`` endpoint passes the MCP conformance suite's generic server
scenarios, in both protocol eras it serves (2025-11-25 and 2026-07-28).

A real ``luftpause runtime`` process (standalone: these scenarios never call a tool, so
no dataplane or tool server is needed; bound to 127.0.0.1, so DNS-rebinding protection
is on) is driven by the npm suite ``@modelcontextprotocol/conformance`` (see
``tests/_conformance.py`` for how Node 22 and the suite are installed and pinned). The
scenarios are the ones any MCP server must pass; the suite's other scenarios need
fixture tools (``test_simple_text``, ``test_missing_capability``, ...) that a product
server does not have. Each (era, scenario) is its own test, so the report lists them
one by one; a failure shows the suite's output for that scenario.
"""

from __future__ import annotations

import pytest
from _conformance import (
    INSTALL_TIMEOUT_S,
    ConformanceResults,
    installed_or_skip,
    run_conformance,
)
from conftest import Services

from luftpause.procs import ServiceProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.conformance,
    # The first test of a fresh checkout installs Node and the suite (npm) in its setup.
    pytest.mark.timeout(INSTALL_TIMEOUT_S + 300),
]

# Generic server scenarios, by the spec version the suite applies them to
# (`conformance list --server --spec-version V`). initialize, session lifecycle and
# ping are legacy-only (2026-07-28 is stateless and removed them); caching and HTTP
# header validation (Mcp-Method / Mcp-Name) exist only in 2026-07-28.
SCENARIOS: dict[str, tuple[str, ...]] = {
    "2025-11-25": (
        "server-initialize",
        "server-session-lifecycle",
        "ping",
        "tools-list",
        "resources-list",
        "prompts-list",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ),
    "2026-07-28": (
        "tools-list",
        "resources-list",
        "prompts-list",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
        "caching",
        "http-header-validation",
    ),
}
CASES = [(era, name) for era, names in SCENARIOS.items() for name in names]
RUN_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def suite_ready() -> None:
    installed_or_skip()


@pytest.fixture(scope="module")
def runtime(
    suite_ready: None, module_services: Services, tmp_path_factory: pytest.TempPathFactory
) -> ServiceProcess:
    tmp = tmp_path_factory.mktemp("conformance")
    config = tmp / "runtime.toml"
    # Nothing listens on the dataplane address: no scenario here spawns a sub-agent.
    config.write_text(
        f'[runtime]\ndataplane_url = "http://127.0.0.1:9"\nstate_dir = "{tmp / "state"}"\n'
    )
    return module_services.start(
        "runtime",
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        name="runtime-conformance",
        env={"LUFTPAUSE_TOKEN": ""},  # the suite sends no Authorization header
    )


@pytest.fixture(scope="module")
def results(runtime: ServiceProcess) -> dict[str, ConformanceResults]:
    """Era -> its scenarios' results, filled once per era by that era's first test."""
    return {}


@pytest.mark.parametrize(("era", "scenario"), CASES, ids=[f"{e}/{s}" for e, s in CASES])
def test_generic_scenario_passes(
    era: str,
    scenario: str,
    runtime: ServiceProcess,
    results: dict[str, ConformanceResults],
    request: pytest.FixtureRequest,
) -> None:
    """R1: the runtime passes this generic conformance scenario in this protocol era."""
    if era not in results:
        results[era] = run_conformance(
            runtime.urls["http"] + "/mcp",
            spec_version=era,
            scenarios=list(SCENARIOS[era]),
            timeout=RUN_TIMEOUT_S,
        )
        run = results[era]  # the era's whole table, once (shown with -rA or on failure)
        request.node.add_report_section(
            "call", f"conformance {era} ({run.seconds:.1f} s)", run.report()
        )
    run = results[era]
    if run[scenario] != "passed":
        section = run.output.partition(f"\n=== {scenario} ")[2].partition("\n=== ")[0]
        pytest.fail(
            f"{era}/{scenario}: {run[scenario]}\n{run.report()}\n\n--- suite output ---\n"
            f"{section}\n--- runtime stderr (tail) ---\n{runtime.stderr()[-4000:]}",
            pytrace=False,
        )
