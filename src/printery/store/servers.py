"""What the servers themselves report: their clock, and (``INFO``, for the benchmark's
figures) per master of a cluster, since a cluster client's ``INFO`` answers for one node
at a time."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio.cluster import RedisCluster

from printery.transport.connection import Redis
from printery.transport.streams import one_slot

__all__ = ["answers", "master_cpu_seconds", "server_ms"]


async def master_cpu_seconds(client: Redis) -> dict[str, float] | None:
    """CPU seconds (user and system) each master of a cluster has used, by ``host:port``;
    None off a cluster."""
    if not one_slot(client):
        return None
    cluster = cast(RedisCluster, client)
    found: dict[str, float] = {}
    for node in cluster.get_primaries():
        info: Any = await cluster.info("cpu", target_nodes=node)
        found[node.name] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return found


async def server_ms(client: Redis) -> int:
    """The server's clock in milliseconds: what entry ids are made of, so ages computed
    from ids against it do not depend on this host's clock."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def answers(client: Redis) -> bool:
    """Whether the server answers a ``PING`` (errors raise: the caller says what they mean)."""
    return bool(await client.ping())
