"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from printery.servers.process import ServerProcess
from support.relay_proc import Relays


@pytest.fixture
def relays(server: ServerProcess, tmp_path: Path) -> Iterator[Relays]:
    """Relay processes (``support.relay_proc``) on the session server, killed at the end."""
    started = Relays(server.url, tmp_path / "relays")
    yield started
    started.kill_all()
