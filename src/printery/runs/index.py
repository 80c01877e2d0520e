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

from printery.runtime.run_index import RUNNING, now_ms
from printery.store import Redis
from printery.store.run_index import (
    cost_of_minutes,
    counts,
    forget_ended,
    is_indexed,
    newest,
    run_rows,
)
from printery.transport.scripts import Scripts
from printery.wire.keys import StreamKeys

__all__ = ["RunIndexReader"]


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
        return await forget_ended(client, self.keys, retention_s, running=RUNNING, scripts=scripts)

    async def page(self, client: Redis, *, status: str = "", offset: int = 0,
                   count: int = 50) -> tuple[list[dict[str, Any]], int]:
        """Runs newest first (``status``: of that status only) from ``offset``, and how
        many there are: two round trips whatever the size of the index."""
        run_ids, total = await newest(client, self.keys, status, offset, count)
        return await self.rows(client, run_ids), total

    async def rows(self, client: Redis, run_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Each run's ``run_id``, ``status``, ``started`` and ``ended`` (ms, 0: not yet):
        one round trip for the lot."""
        return [{"run_id": run_id, "status": status or RUNNING, "started": started,
                 "ended": ended}
                for run_id, (started, status, ended)
                in zip(run_ids, await run_rows(client, self.keys, run_ids), strict=True)]

    async def find(self, client: Redis, run_id: str) -> list[dict[str, Any]]:
        """The run of exactly this id, when it is indexed (search by id)."""
        return await self.rows(client, [run_id]) if await is_indexed(client, self.keys, run_id) \
            else []

    async def summary(self, client: Redis) -> dict[str, Any]:
        """``runs`` (all indexed), ``running``, and the status names seen."""
        runs, running, statuses = await counts(client, self.keys, RUNNING)
        return {"runs": runs, "running": running, "statuses": sorted({RUNNING, *statuses})}

    async def cost_last_hour(self, client: Redis, at_ms: int | None = None) -> (
        dict[str, float]
    ):
        """What the steps reported spending in the last 60 minutes, per unit."""
        minute = (now_ms() if at_ms is None else at_ms) // 60_000
        return await cost_of_minutes(client, self.keys, minute - 59, minute)
