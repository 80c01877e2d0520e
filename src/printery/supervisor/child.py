"""ChildProcess: an OS process as a :class:`~printery.Worker`, so a
:class:`~printery.WorkerManager` supervises processes the way it supervises workers:
same start, health check, restart with backoff and stop (the parent of
``printery-workers --processes`` is built on it).

``run`` starts the command and reports ready; it returns after stopping the process
when asked to stop (SIGTERM, then SIGKILL once the drain timeout has passed), and
raises when the process exits by itself, which the manager treats as a crash. An exit
status in ``fatal_exits`` raises :class:`~printery.WorkerFailed` instead: restarting
cannot fix it (a child exiting 2 has a bad configuration), so it is not restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence

import structlog

from printery.base._util import wait_event
from printery.base.errors import WorkerFailed
from printery.base.worker import RunContext

__all__ = ["ChildProcess"]

log = structlog.get_logger("printery.process")

#: Seconds between checks of whether the process is still alive.
POLL_INTERVAL = 0.2


class ChildProcess:
    """One supervised OS process running ``command`` (with ``env``, else the parent's)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        fatal_exits: Collection[int] = (),
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self._name = name
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.fatal_exits = frozenset(fatal_exits)
        self.poll_interval = poll_interval
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The last run's exit status; None while it runs or before it started (polled:
        ``returncode`` alone stays None until someone asks the process)."""
        return self.proc.poll() if self.proc is not None else None

    def healthy(self) -> bool:
        """Started. An exit is reported by :meth:`run` itself within a poll interval, with
        its status (fatal or not): answering False here would race that report, and the
        supervisor would restart a process whose exit status says not to."""
        return self.proc is not None

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the command (a fork and exec: quick, so the event loop may call it)."""
        self.proc = subprocess.Popen(self.command, env=self.env)
        log.info("child started", child=self.name, pid=self.proc.pid)
        return self.proc

    async def run(self, ctx: RunContext) -> None:
        proc = self.spawn()
        ctx.started()
        try:
            while proc.poll() is None and not ctx.stopping.is_set():
                await wait_event(ctx.stopping, self.poll_interval)
                ctx.beat()
            if proc.poll() is None:  # asked to stop
                await self._terminate(proc, ctx.drain_timeout)
                return
        finally:
            if proc.poll() is None:  # cancelled: never leave the process behind
                self.kill()
        code = proc.returncode
        log.warning("child exited", child=self.name, pid=proc.pid, exit_code=code)
        if code in self.fatal_exits:
            raise WorkerFailed(self.name, f"exited with status {code}")
        raise RuntimeError(f"process {proc.pid} exited with status {code}")

    async def _terminate(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        self.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        # Exits are polled: there is no event to await for a subprocess.Popen.
        while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            log.warning("child did not stop in time: killing", child=self.name, pid=proc.pid)
            self.kill()
        elif proc.returncode != 0:
            log.warning("child exit status", child=self.name, exit_code=proc.returncode)

    def send_signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill(self, wait: float = 5.0) -> None:
        """SIGKILL the process if it runs, and reap it (synchronous: also for exit paths)."""
        self.send_signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=wait)
