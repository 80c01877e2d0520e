"""A run's budget as the server holds it, read (what the fields mean and who writes them:
:mod:`printery.rules.budgets`, the commit and the budget guard), and the limits the workers
enforce, as they recorded them at their start (``StreamKeys.budget_limits``).

A budget may depend on the workers' environment (``Budget(usd=float(os.environ[...]))``):
what a reader's own import of the app says may not be what the workers check, so every
process serving the pipeline records its limits when it starts (the last to start wins:
processes of one pipeline are expected to run one configuration), and the readers
(``printery cost``, ``GET /v1/runs/{id}``) show a run's spent against those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from printery.base import _json
from printery.transport.connection import Redis
from printery.wire.keys import StreamKeys

__all__ = ["LimitRow", "budget_hashes", "record_budget_limits", "recorded_budget_limits"]

#: One limit: ``step`` ("" for the run's budget), ``unit``, ``limit`` (in units, before
#: any raise) and ``soft`` (the warning's fraction of the limit).
LimitRow = Mapping[str, Any]


async def budget_hashes(client: Redis, keys: StreamKeys,
                        run_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """The run's budget hash (what it spent, limits raised by approvals) and its
    reservations hash (what entries not committed yet hold), one round trip."""
    part = keys.of(run_id)
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(part.budget(run_id))
        pipe.hgetall(part.reserved(run_id))
        held, reserved = await pipe.execute()
    return dict(held), dict(reserved)


async def record_budget_limits(client: Redis, keys: StreamKeys, rows: Sequence[LimitRow]) -> None:
    """Record the limits this process enforces (none: the pipeline has no budget)."""
    await client.set(keys.budget_limits, _json.dumps({"limits": [dict(row) for row in rows]}))


async def recorded_budget_limits(client: Redis, keys: StreamKeys) -> list[dict[str, Any]] | None:
    """The limits the workers recorded, None when none did (or the record is not one:
    a reader then falls back to its own import of the app)."""
    raw = await client.get(keys.budget_limits)
    if raw is None:
        return None
    try:
        rows = _json.loads(raw).get("limits")
    except (_json.JSONDecodeError, ValueError, AttributeError):
        return None
    if not isinstance(rows, list):
        return None
    found = []
    for row in rows:
        if not isinstance(row, dict):
            return None
        step, unit, limit, soft = (row.get(k) for k in ("step", "unit", "limit", "soft"))
        if not (isinstance(step, str) and isinstance(unit, str)
                and isinstance(limit, int | float) and isinstance(soft, int | float)
                and not isinstance(limit, bool) and not isinstance(soft, bool)):
            return None
        found.append({"step": step, "unit": unit, "limit": float(limit), "soft": float(soft)})
    return found
