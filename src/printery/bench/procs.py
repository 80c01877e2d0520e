"""The relay processes of one side of a run, driven over the line protocol of
:mod:`printery.bench.worker_proc`, with their CPU time and peak memory.

Relays always run in child processes, even with one process: the driver's own work
(loading, offering load, polling) then never counts against either side, and CPU
readings are of the relay processes alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from printery.base import _json
from printery.base.errors import PrinteryError
from printery.bench.cpu import cpu_seconds
from printery.bench.names import PROTOCOL_PREFIX

#: How long a relay process may take to import, connect and create its groups.
READY_TIMEOUT = 60.0


class BenchProcessError(PrinteryError):
    """A relay process of the bench died or broke the line protocol."""


def _child_env() -> dict[str, str]:
    """The environment with printery's own source root on ``PYTHONPATH``, so a child
    imports the same printery as the driver even from an uninstalled tree."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class RelayProcesses:
    """``count`` relay processes of ``kind`` (``ceiling``, ``ceiling_minimal`` or
    ``printery``); ``prefetch`` None leaves printery's at the library's default."""

    def __init__(
        self, kind: str, count: int, *, url: str, prefix: str, stages: int, batch: int,
        block_ms: int, log_dir: Path, prefetch: int | None = None,
        features: Sequence[str] = (), partitions: int = 1,
    ) -> None:
        self.kind = kind
        self.count = count
        self.args = [kind, url, prefix, "--stages", str(stages), "--batch", str(batch),
                     "--block-ms", str(block_ms), "--partitions", str(partitions)]
        if prefetch is not None:
            self.args += ["--prefetch", str(prefetch)]
        for feature in features:
            self.args += ["--with", feature]
        #: What the first process said it runs with (its ``ready`` line), e.g. ``prefetch``.
        self.settings: dict[str, Any] = {}
        self.log_dir = log_dir
        self.procs: list[asyncio.subprocess.Process] = []
        self._logs: list[IO[bytes]] = []
        self._cpu_start = 0.0
        self.cpu_seconds = 0.0
        self.maxrss_kb: list[int] = []
        self.idle_rss_mb = 0.0

    async def start(self) -> None:
        """Start every process and wait until each has its groups and is ready."""
        for index in range(self.count):
            log = (self.log_dir / f"{self.kind}-{index}.log").open("wb")
            self._logs.append(log)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "printery.bench.worker_proc", *self.args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                env=_child_env(),
            )
            self.procs.append(proc)
        for proc in self.procs:
            said = await asyncio.wait_for(self._expect(proc, "ready"), READY_TIMEOUT)
            if said and not self.settings:
                self.settings = dict(_json.loads(said))
        self.idle_rss_mb = self._rss_now() / 1_048_576

    async def go(self, *, wait_running: bool) -> None:
        """Start relaying everywhere at once; CPU time counts from here."""
        self._cpu_start = self._cpu_now()
        for proc in self.procs:
            self._send(proc, "go")
        if wait_running:
            for proc in self.procs:
                await asyncio.wait_for(self._expect(proc, "running"), READY_TIMEOUT)

    def mark_done(self) -> None:
        """The run's work is over: CPU time counts until here, not through shutdown."""
        self.cpu_seconds = self._cpu_now() - self._cpu_start

    async def stop(self) -> None:
        """Stop gracefully and collect each process's peak RSS; kill what does not stop."""
        for proc in self.procs:
            with contextlib.suppress(OSError):
                self._send(proc, "stop")
        for proc in self.procs:
            try:
                done = await asyncio.wait_for(self._expect(proc, "done"), 30)
                self.maxrss_kb.append(int(_json.loads(done)["maxrss_kb"]))
                await asyncio.wait_for(proc.wait(), 10)
            except (TimeoutError, BenchProcessError):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for log in self._logs:
            log.close()

    @property
    def peak_rss_mb(self) -> float:
        """Sum of the processes' peaks: what the side needed at most, all processes together."""
        return sum(self.maxrss_kb) / 1024

    def _cpu_now(self) -> float:
        return sum(cpu_seconds(proc.pid) or 0.0 for proc in self.procs)

    def _rss_now(self) -> int:
        total = 0
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                total += int(psutil.Process(proc.pid).memory_info().rss)
        return total

    @staticmethod
    def _send(proc: asyncio.subprocess.Process, line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write((line + "\n").encode())

    async def _expect(self, proc: asyncio.subprocess.Process, word: str) -> str:
        """The rest of the next protocol line, which must start with ``word``."""
        assert proc.stdout is not None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                raise BenchProcessError(
                    f"{self.kind} relay process {proc.pid} exited before {word!r}; "
                    f"see {self.log_dir}"
                )
            line = raw.decode().rstrip("\n")
            if not line.startswith(PROTOCOL_PREFIX):
                continue
            head, _, rest = line[len(PROTOCOL_PREFIX) :].partition(" ")
            if head == "running" and word != "running":
                continue  # not awaited in backlog mode, where the clock starts at go
            if head != word:
                raise BenchProcessError(f"expected {word!r} from relay process, got {line!r}")
            return rest

