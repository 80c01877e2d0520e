"""Server CPU of a cluster's masters over the bench's measured window.

On one embedded server the bench reads the server process's CPU time; a cluster's nodes
may be anywhere, so each master's own count is read instead (``INFO cpu``:
``used_cpu_user`` + ``used_cpu_sys``). Per master, because the model of docs/performance.md
scales by masters: server CPU per event on a master times the events/s it carries.
"""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from printery.transport.streams import one_slot


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
