"""A run's budget as the server holds it, read (what the fields mean and who writes them:
:mod:`printery.budgets`, the commit and the budget guard)."""

from __future__ import annotations

from printery.keys import StreamKeys
from printery.transport.connection import Redis

__all__ = ["budget_hashes"]


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
