"""The run index read without touching the streams (docs/reference.md, The web console:
the console's overview and runs pages answer from it; nothing on a request path may SCAN
the keyspace or read every stream), and the sweep that forgets ended runs. What the keys
hold and who writes them: :mod:`printery.runtime.run_index`.

Who forgets: the service's retention sweep (:meth:`RunIndexReader.forget_ended`) removes
a run whose outcome is older than ``transport.retention``, as its history goes from the
streams; a run still running stays, however old.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from printery.keys import StreamKeys
from printery.runtime.run_index import RUNNING, now_ms
from printery.store import Redis
from printery.transport.scripts import Scripts, script

__all__ = ["FORGET_BATCH", "RunIndexReader"]

#: Runs forgotten per script call at most, so a sweep never holds the server long.
FORGET_BATCH = 500

#: Forgets the runs whose outcome is older than the retention (``forget.lua``).
FORGET = script("forget")


class RunIndexReader:
    """Reads of the run index under ``keys``: with several partitions (docs/reference.md,
    Partitions) each partition keeps the index of its own runs, and the reads merge
    every partition."""

    def __init__(self, keys: StreamKeys) -> None:
        self.keys = keys

    async def forget_ended(self, client: Redis, retention_s: float,
                           scripts: Scripts | None = None) -> int:
        """Forget the runs whose outcome is older than ``retention_s`` (server clock), in
        every partition, a bounded batch per script call; how many went. Running runs
        stay: they have no outcome to age from."""
        runner = scripts or Scripts(client)
        forgotten = 0
        for keys in self.keys.whole.each():
            statuses = sorted(str(s) for s in await client.smembers(keys.run_statuses))  # type: ignore[misc]
            ended = [keys.run_index(status) for status in statuses if status != RUNNING]
            if not ended:
                continue
            while True:
                went, looked_at = await runner.call(
                    FORGET, [keys.run_index(), *ended],
                    [int(retention_s * 1000), FORGET_BATCH, keys.run_info("")])
                forgotten += int(went)
                if int(looked_at) < FORGET_BATCH:
                    break
        return forgotten

    async def page(self, client: Redis, *, status: str = "", offset: int = 0,
                   count: int = 50) -> tuple[list[dict[str, Any]], int]:
        """Runs newest first (``status``: of that status only) from ``offset``, and how
        many there are: two round trips whatever the size of the index (each partition
        gives its newest ``offset + count``, merged here)."""
        parts = list(self.keys.whole.each())
        async with client.pipeline(transaction=False) as pipe:
            for keys in parts:
                pipe.zrevrange(keys.run_index(status), 0, offset + count - 1, withscores=True)
                pipe.zcard(keys.run_index(status))
            replies = await pipe.execute()
        members = sorted((member for n in range(len(parts)) for member in replies[2 * n]),
                         key=lambda member: -float(member[1]))[offset : offset + count]
        total = sum(int(replies[2 * n + 1]) for n in range(len(parts)))
        return await self.rows(client, [str(m) for m, _ in members]), total

    async def rows(self, client: Redis, run_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Each run's ``run_id``, ``status``, ``started`` and ``ended`` (ms, 0: not yet):
        one round trip for the lot."""
        if not run_ids:
            return []
        whole = self.keys.whole
        async with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                keys = whole.of(run_id)
                pipe.zscore(keys.run_index(), run_id)
                pipe.hmget(keys.run_info(run_id), ["status", "ended"])
            replies = await pipe.execute()
        rows = []
        for n, run_id in enumerate(run_ids):
            started, (status, ended) = replies[2 * n], replies[2 * n + 1]
            rows.append({"run_id": run_id, "status": str(status) if status else RUNNING,
                         "started": int(started or 0), "ended": int(ended or 0)})
        return rows

    async def find(self, client: Redis, run_id: str) -> list[dict[str, Any]]:
        """The run of exactly this id, when it is indexed (search by id)."""
        score = await client.zscore(self.keys.whole.of(run_id).run_index(), run_id)
        return [] if score is None else await self.rows(client, [run_id])

    async def summary(self, client: Redis) -> dict[str, Any]:
        """``runs`` (all indexed), ``running``, and the status names seen."""
        parts = list(self.keys.whole.each())
        async with client.pipeline(transaction=False) as pipe:
            for keys in parts:
                pipe.zcard(keys.run_index())
                pipe.zcard(keys.run_index(RUNNING))
                pipe.smembers(keys.run_statuses)
            replies = await pipe.execute()
        statuses = {str(s) for n in range(len(parts)) for s in replies[3 * n + 2]}
        return {"runs": sum(int(replies[3 * n]) for n in range(len(parts))),
                "running": sum(int(replies[3 * n + 1]) for n in range(len(parts))),
                "statuses": sorted({RUNNING, *statuses})}

    async def cost_last_hour(self, client: Redis, at_ms: int | None = None) -> (
        dict[str, float]
    ):
        """What the steps reported spending in the last 60 minutes, per unit."""
        minute = (now_ms() if at_ms is None else at_ms) // 60_000
        async with client.pipeline(transaction=False) as pipe:
            for keys in self.keys.whole.each():
                for m in range(minute - 59, minute + 1):
                    pipe.hgetall(keys.cost_minute(m))
            buckets = await pipe.execute()
        total: dict[str, float] = {}
        for bucket in buckets:
            for unit, amount in bucket.items():
                total[str(unit)] = total.get(str(unit), 0.0) + float(amount)
        return total

