"""CPU time over the bench's measured window: of a process (each side's workers, our own
server: :func:`cpu_seconds`), or of a cluster's masters.

On one embedded server the bench reads the server process's CPU time
(:class:`ServerCpu`); a cluster's nodes may be anywhere, so each master's own count is
read instead (:class:`ClusterCpu`: ``INFO cpu``, ``used_cpu_user`` + ``used_cpu_sys``),
per master, because the model of docs/performance-history.md (Issue 18) scales by masters: server CPU per
event on a master times the events/s it carries.
"""

from __future__ import annotations

from typing import Any

import psutil

from printery.store import Redis
from printery.store.servers import master_cpu_seconds


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None once it is gone)."""
    try:
        times: Any = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user) + float(times.system)


class ServerCpu:
    """CPU time of our own server over the measured window (unknown for a remote one)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._start = 0.0

    def _now(self) -> float | None:
        return None if self.pid is None else cpu_seconds(self.pid)

    def start(self) -> None:
        self._start = self._now() or 0.0

    def seconds(self) -> float | None:
        now = self._now()
        return None if now is None else now - self._start


class ClusterCpu:
    """CPU seconds each master spent since :meth:`start` (None off a cluster)."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._start: dict[str, float] = {}

    async def start(self) -> None:
        self._start = await master_cpu_seconds(self.client) or {}

    async def seconds(self) -> dict[str, float] | None:
        """Each master's CPU seconds since :meth:`start`, by ``host:port``."""
        end = await master_cpu_seconds(self.client)
        if end is None:
            return None
        return {name: round(end[name] - self._start.get(name, end[name]), 4)
                for name in sorted(end)}
