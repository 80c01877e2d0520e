"""Stopping a server (:meth:`~printery.servers.process.ServerProcess.stop`) is a clean
shutdown also while the server refuses one: a server writing its first AOF (a replica
just after its first sync, or one whose ``appendonly`` was just turned on) answers
SIGTERM with "Writing initial AOF, can't exit" and runs on. A single SIGTERM then left
the stop waiting its whole timeout and killing the server (10 s per replica in the
tests); sent again, the server exits cleanly once its AOF is written."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from printery.servers.process import ServerProcess


def test_a_server_writing_its_first_aof_stops_cleanly_when_it_is_written(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "server", appendonly=False)
    server.start()
    with redis.Redis.from_url(server.url) as r:
        # Enough data that the first AOF's background write is still going on at the stop.
        r.eval("for i = 1, 300000 do redis.call('SET', 'k' .. i, i) end", 0)
        r.config_set("appendonly", "yes")
    process = server.process
    assert process is not None
    started = time.monotonic()
    server.stop(timeout=10)
    took = time.monotonic() - started
    assert process.returncode == 0, "a clean shutdown, not the SIGKILL after the timeout"
    assert took < 5, f"the stop took {took:.1f} s"
    assert "Writing initial AOF, can't exit" in (tmp_path / "server" / "server.log").read_text()
