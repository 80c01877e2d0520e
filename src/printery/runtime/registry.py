"""The process registry: which service processes run, on which hosts, doing what.

Each running service keeps one key, ``<prefix>:process:<process_id>``, holding its
status JSON with a TTL, and rewrites it every ``interval`` seconds (half a second). ``printery status``
lists the keys. There is no deregistration protocol to get wrong: a process that dies
stops beating and its key expires ``ttl`` seconds later; a graceful shutdown deletes it
at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from printery import _json
from printery.errors import ConfigError
from printery.keys import StreamKeys

log = logging.getLogger(__name__)

#: Keys fetched per SCAN step and per MGET: bounded work per round trip.
_SCAN_COUNT = 200


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

        One SET with PX: the value and its expiry change together. Raises the client's
        errors; :meth:`run` is the caller that tolerates them.
        """
        await self.redis.set(self.key, _json.dumpb(status), px=max(1, int(self.ttl * 1000)))

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
            await asyncio.sleep(self.interval)

    async def remove(self) -> None:
        """Delete this process's key on graceful shutdown.

        Tolerates a lost connection: then the key simply expires after ``ttl``.
        """
        try:
            await self.redis.delete(self.key)
        except (RedisError, OSError) as exc:
            log.warning(
                "process registry: could not remove %s (it expires in %ss): %s",
                self.key,
                self.ttl,
                exc,
            )


async def list_processes(redis: aioredis.Redis, keys: StreamKeys) -> list[dict[str, Any]]:
    """Every registered process's status, sorted by process id.

    Uses SCAN, never KEYS, so a large keyspace does not block the server. A key that
    expires between SCAN and GET is skipped, as is a value that is not a JSON object
    (someone else's key under our prefix). Each status gains ``process_id`` (from its
    key) when it lacks one.
    """
    prefix_len = len(keys.process(""))
    found: list[str] = []
    async for key in redis.scan_iter(match=keys.process_pattern, count=_SCAN_COUNT):
        found.append(key.decode() if isinstance(key, bytes) else str(key))
    found = sorted(set(found))  # SCAN may return a key more than once
    processes: list[dict[str, Any]] = []
    for start in range(0, len(found), _SCAN_COUNT):
        batch = found[start : start + _SCAN_COUNT]
        # One GET per key in a pipeline, not MGET: on a cluster the keys are in many
        # slots (the pipeline sends each node its own). A key of another type answers
        # WRONGTYPE where MGET answered nil: skipped the same (not a status).
        async with redis.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.get(key)
            values = await pipe.execute(raise_on_error=False)
        for key, raw in zip(batch, values, strict=True):
            status = _decode(raw)
            if status is not None:
                status.setdefault("process_id", key[prefix_len:])
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
