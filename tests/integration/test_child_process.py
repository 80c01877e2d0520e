"""OS processes supervised by the WorkerManager (``ChildProcess``), the way the parent of
``printery-workers --processes`` runs its children: the manager's one restart policy,
with no end, a count that starts again after a stable run, and exits that must not be
restarted."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import psutil

from printery.supervisor.child import ChildProcess
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def _restarts(manager: WorkerManager, name: str, n: int) -> bool:
    return int(manager.get_status()[name]["restarts"]) >= n


async def test_a_crashing_child_is_restarted_without_end() -> None:
    child = ChildProcess("crashy", python("raise SystemExit(1)"), poll_interval=0.02)
    restarts: list[str] = []
    manager = WorkerManager(supervised=True, max_restarts=None, backoff_ms=10,
                            health_check_interval=0.05, on_restart=restarts.append)
    manager.register(child)
    await manager.start_all()
    try:
        await wait_for(lambda: _restarts(manager, "crashy", 4), timeout=20)
        assert not manager.failed.is_set()
        assert set(restarts) == {"crashy"}
        assert child.exit_code == 1 or child.alive
    finally:
        await manager.stop_all(2)


async def test_a_fatal_exit_is_failed_at_once() -> None:
    child = ChildProcess("bad-config", python("raise SystemExit(2)"), fatal_exits={2},
                         poll_interval=0.02)
    manager = WorkerManager(supervised=True, max_restarts=None, backoff_ms=10,
                            health_check_interval=0.05)
    manager.register(child)
    await manager.start_all()
    try:
        await asyncio.wait_for(manager.failed.wait(), 10)
        status = manager.get_status()["bad-config"]
        assert (status["state"], status["restarts"]) == ("failed", 0)
        assert manager.failures[0].worker == "bad-config"
        assert child.exit_code == 2
    finally:
        await manager.stop_all(1)


async def test_stop_terminates_then_kills_a_stubborn_child(tmp_path: Path) -> None:
    ignoring = tmp_path / "ignoring"
    stubborn = ("import pathlib, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                f"pathlib.Path({str(ignoring)!r}).touch()\ntime.sleep(60)")
    polite, rude = ChildProcess("polite", python("import time; time.sleep(60)")), ChildProcess(
        "rude", python(stubborn))
    manager = WorkerManager(supervised=True, max_restarts=None)
    manager.register(polite)
    manager.register(rude)
    await manager.start_all()
    pids = [polite.pid, rude.pid]

    async def ignores_sigterm() -> bool:
        return ignoring.exists()

    await wait_for(ignores_sigterm, timeout=10, message="the stubborn child ignoring SIGTERM")
    began = time.monotonic()
    await manager.stop_all(1.0)
    assert time.monotonic() - began < 3.5
    assert not polite.alive and not rude.alive
    assert polite.exit_code == -15 and rude.exit_code == -9
    assert not any(pid is not None and psutil.pid_exists(pid) and
                   psutil.Process(pid).status() != "zombie" for pid in pids)
    assert not manager.failed.is_set()


async def test_a_stable_run_starts_the_count_again() -> None:
    # Runs 0.3 s, then crashes: with stable_after 0.2 every crash is the first of a streak,
    # so max_restarts=1 is never exhausted.
    child = ChildProcess("steady", python("import time; time.sleep(0.3); raise SystemExit(1)"),
                         poll_interval=0.02)
    manager = WorkerManager(supervised=True, max_restarts=1, backoff_ms=10, stable_after=0.2,
                            health_check_interval=0.05)
    manager.register(child)
    await manager.start_all()
    try:
        await wait_for(lambda: _restarts(manager, "steady", 3), timeout=20)
        assert not manager.failed.is_set()
    finally:
        await manager.stop_all(2)
