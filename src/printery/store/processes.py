"""The process registry's keyspace: a status key per service process, with a TTL, and
the sorted set indexing them by last beat (what they mean: :mod:`printery.service.registry`).
"""

from __future__ import annotations

from printery.base._util import as_text
from printery.transport.connection import Redis
from printery.wire.keys import StreamKeys

__all__ = ["forget_beat", "read_beats", "write_beat"]

#: Keys fetched per round trip: bounded work however many processes there are.
BATCH = 200


async def write_beat(client: Redis, keys: StreamKeys, process_id: str, status: bytes, *,
                     ttl_ms: int, now_ms: float, forget_ms: int) -> None:
    """One round trip: the status with its expiry (SET PX: they change together), the id
    in the index, and the index's members that stopped beating ``forget_ms`` ago dropped.
    Not a transaction: the key and the index are in two slots on a cluster, and a reader
    skips an indexed id whose key is gone anyway."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.process(process_id), status, px=max(1, ttl_ms))
        pipe.zadd(keys.processes, {process_id: now_ms})
        pipe.zremrangebyscore(keys.processes, "-inf", now_ms - forget_ms)
        await pipe.execute()


async def forget_beat(client: Redis, keys: StreamKeys, process_id: str) -> None:
    """The process's key and its index entry removed (a graceful stop)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.delete(keys.process(process_id))
        pipe.zrem(keys.processes, process_id)
        await pipe.execute()


async def read_beats(client: Redis, keys: StreamKeys) -> list[tuple[str, object]]:
    """Every indexed process id (sorted) with its stored status as read: a value, None
    when its key expired, an error reply when the key holds another type. Reads the
    index (no SCAN: the keyspace may be large), then the keys a batch at a time, one GET
    each in a pipeline (on a cluster the keys are in many slots: each node gets its own)."""
    members = await client.zrange(keys.processes, 0, -1)
    found = sorted({as_text(m) for m in members})
    read: list[tuple[str, object]] = []
    for start in range(0, len(found), BATCH):
        batch = found[start : start + BATCH]
        async with client.pipeline(transaction=False) as pipe:
            for process_id in batch:
                pipe.get(keys.process(process_id))
            values = await pipe.execute(raise_on_error=False)
        read.extend(zip(batch, values, strict=True))
    return read
