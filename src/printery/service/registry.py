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

from printery.base import _json
from printery.base._util import idle
from printery.base.errors import ConfigError
from printery.store import Redis, ServerError
from printery.store.processes import forget_beat, read_beats, write_beat
from printery.wire.keys import StreamKeys

log = logging.getLogger(__name__)

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
        redis: Redis,
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
        await write_beat(self.redis, self.keys, self.process_id, _json.dumpb(status),
                         ttl_ms=int(self.ttl * 1000), now_ms=time.time() * 1000,
                         forget_ms=_FORGET_MS)

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
            except (ServerError, OSError, TimeoutError) as exc:
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
            await forget_beat(self.redis, self.keys, self.process_id)
        except (ServerError, OSError) as exc:
            log.warning(
                "process registry: could not remove %s (it expires in %ss): %s",
                self.key,
                self.ttl,
                exc,
            )


async def list_processes(redis: Redis, keys: StreamKeys) -> list[dict[str, Any]]:
    """Every registered process's status, sorted by process id.

    Read from the process index (:func:`~printery.store.processes.read_beats`: no SCAN).
    A process whose key expired (it stopped beating) is skipped, as is a value that is
    not a JSON object (a key of another type too). Each status gains ``process_id`` when
    it lacks one.
    """
    processes: list[dict[str, Any]] = []
    for process_id, raw in await read_beats(redis, keys):
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
