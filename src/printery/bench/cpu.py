"""CPU time over the bench's measured window: of a process (each side's workers, our own
server: :func:`cpu_seconds`), or of a cluster's masters.

On one embedded server the bench reads the server process's CPU time
(:class:`ServerCpu`); a cluster's nodes may be anywhere, so each master's own count is
read instead (:class:`ClusterCpu`: ``INFO cpu``, ``used_cpu_user`` + ``used_cpu_sys``),
per master, because the model of docs/performance.md scales by masters: server CPU per
event on a master times the events/s it carries.
"""

from __future__ import annotations

from typing import Any, cast

import psutil
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from printery.transport.streams import one_slot


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

    def __init__(self, client: aioredis.Redis) -> None:
        cluster: object = client
        self.cluster = cast(RedisCluster, cluster) if one_slot(client) else None
        self._start: dict[str, float] = {}

    async def _now(self) -> dict[str, float]:
        assert self.cluster is not None
        found: dict[str, float] = {}
        for node in self.cluster.get_primaries():
            info: Any = await self.cluster.info("cpu", target_nodes=node)
            found[node.name] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return found

    async def start(self) -> None:
        if self.cluster is not None:
            self._start = await self._now()

    async def seconds(self) -> dict[str, float] | None:
        """Each master's CPU seconds since :meth:`start`, by ``host:port``."""
        if self.cluster is None:
            return None
        end = await self._now()
        return {name: round(end[name] - self._start.get(name, end[name]), 4)
                for name in sorted(end)}
