"""The process registry: which service processes run, on which hosts, doing what.

Each running service keeps one key, ``<prefix>:process:<process_id>``, holding its
status JSON with a TTL, and rewrites it every ``interval`` seconds (half a second); the
same beat puts its id in the sorted set ``<prefix>:processes`` (score: the beat's time),
so listing the processes reads that set and never SCANs the keyspace (the console lists
them on every page load). ``printery status`` lists the processes. There is no
deregistration protocol to get wrong: a process that dies stops beating and its key
expires ``ttl`` seconds later; a graceful shutdown deletes it at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from printery import _json
from printery._util import idle
from printery.errors import ConfigError
from printery.keys import StreamKeys

log = logging.getLogger(__name__)

#: Keys fetched per MGET: bounded work per round trip.
_BATCH = 200
#: A process that has not beaten for this long leaves the index (its key expired long ago).
_FORGET_MS = 86_400_000


class ProcessRegistry:
    """Heartbeats of one service process.

    :param ttl: seconds the status stays visible after the last beat; how long a dead
      process keeps showing in ``printery status``.
    :param interval: seconds between beats, and so how old the counters ``printery
      status`` shows can be: half a second keeps them current within a second (one SET
      of a small JSON value per beat, nothing for the server). Much shorter than
      ``ttl``, so slow or lost beats do not make a live process vanish.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: StreamKeys,
        process_id: str,
        *,
        ttl: float = 15,
        interval: float = 0.5,
    ) -> None:
        if ttl <= 0:
            raise ConfigError("registry ttl", ttl, "seconds, greater than 0")
        if not 0 < interval < ttl:
            raise ConfigError("registry interval", interval, f"seconds, between 0 and ttl={ttl}")
        self.redis = redis
        self.keys = keys
        self.process_id = process_id
        self.ttl = ttl
        self.interval = interval
        self.key = keys.process(process_id)

    async def beat(self, status: dict[str, Any]) -> None:
        """Write ``status`` (any JSON-able dict) under this process's key, with the TTL.

        One round trip: SET with PX (the value and its expiry change together), the id in
        the process index, and the index's members that stopped beating a day ago
        dropped. Not a transaction: the key and the index are in two slots on a cluster,
        and a reader skips an indexed id whose key is gone anyway. Raises the client's
        errors; :meth:`run` is the caller that tolerates them.
        """
        now = time.time() * 1000
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.key, _json.dumpb(status), px=max(1, int(self.ttl * 1000)))
            pipe.zadd(self.keys.processes, {self.process_id: now})
            pipe.zremrangebyscore(self.keys.processes, "-inf", now - _FORGET_MS)
            await pipe.execute()

    async def run(self, get_status: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Beat every ``interval`` seconds until cancelled; never raises anything else.

        A lost connection or a failing ``get_status`` is logged (once per outage, then
        quietly until a beat succeeds again) and the loop carries on: the registry is an
        observer and must not take the service down with it. A beat that hangs is given
        up after ``ttl`` seconds, when its value would have expired anyway.
        """
        failing = False
        while True:
            try:
                async with asyncio.timeout(self.ttl):
                    await self.beat(await get_status())
            except (RedisError, OSError, TimeoutError) as exc:
                if not failing:
                    log.warning("process registry: heartbeat failed, retrying: %s", exc)
                failing = True
            except Exception:
                if not failing:
                    log.exception("process registry: could not build the status")
                failing = True
            else:
                if failing:
                    log.info("process registry: heartbeat restored")
                failing = False
            await idle(self.interval)

    async def remove(self) -> None:
        """Delete this process's key on graceful shutdown.

        Tolerates a lost connection: then the key simply expires after ``ttl``.
        """
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(self.key)
                pipe.zrem(self.keys.processes, self.process_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning(
                "process registry: could not remove %s (it expires in %ss): %s",
                self.key,
                self.ttl,
                exc,
            )


async def list_processes(redis: aioredis.Redis, keys: StreamKeys) -> list[dict[str, Any]]:
    """Every registered process's status, sorted by process id.

    Reads the process index (no SCAN: the keyspace may be large), then the keys, a
    batch at a time. A process whose key expired (it stopped beating) is skipped, as is
    a value that is not a JSON object. Each status gains ``process_id`` when it lacks one.
    """
    members = await redis.zrange(keys.processes, 0, -1)
    found = sorted({m.decode() if isinstance(m, bytes) else str(m) for m in members})
    processes: list[dict[str, Any]] = []
    for start in range(0, len(found), _BATCH):
        batch = found[start : start + _BATCH]
        # One GET per key in a pipeline, not MGET: on a cluster the keys are in many
        # slots (the pipeline sends each node its own). A key of another type answers
        # WRONGTYPE where MGET answered nil: skipped the same (not a status).
        async with redis.pipeline(transaction=False) as pipe:
            for process_id in batch:
                pipe.get(keys.process(process_id))
            values = await pipe.execute(raise_on_error=False)
        for process_id, raw in zip(batch, values, strict=True):
            status = _decode(raw)
            if status is not None:
                status.setdefault("process_id", process_id)
                processes.append(status)
    return processes


def _decode(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, str | bytes):
        return None
    try:
        value = _json.loads(raw)
    except _json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
