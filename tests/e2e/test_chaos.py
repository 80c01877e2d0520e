"""The chaos test (issue 6 item 1): three printery-workers processes, one append-only
server behind a TCP proxy, deployments against real health endpoints and a real webhook
sink; kill -9 and restart a random process every few seconds, restart the server once,
cut every connection for two seconds. ``make test`` runs 1,000 deployments over 25 s of
chaos (every fault above, the kills about eight times), about 40 s; ``make chaos`` the
same with 2,000 over 45 s, and the longer soak (tests/chaos/soak.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.chaos.driver import Figures, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _assert_nothing_lost_nor_repeated(figures: Figures) -> None:
    assert figures.kills >= 3 and figures.server_restarts == 1 and figures.connection_cuts == 1
    assert figures.finished == figures.deployments, figures.line()
    assert figures.lost == 0 and figures.duplicates_finished == 0, figures.line()
    assert figures.sent_duplicates == 0, "notification:sent written exactly once"
    assert figures.dlq == 0 and figures.pending == 0, figures.line()
    assert figures.missing_webhooks == 0, figures.line()
    assert figures.webhook_keys == figures.deployments


async def test_chaos_1000_deployments(tmp_path: Path, report_figures: Callable[[str], None]) -> None:
    figures = await run_chaos(tmp_path, deployments=1000, duration=25, kill_every=3.0)
    report_figures(figures.line())
    _assert_nothing_lost_nor_repeated(figures)


@pytest.mark.long
async def test_chaos_2000_deployments(tmp_path: Path, report_figures: Callable[[str], None]) -> None:
    figures = await run_chaos(tmp_path, deployments=2000, duration=45, kill_every=3.0)
    report_figures(figures.line())
    _assert_nothing_lost_nor_repeated(figures)
