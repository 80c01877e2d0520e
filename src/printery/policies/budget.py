"""Budgets (docs/reference.md, Budgets): an entry of a run at a hard limit of its budget
writes what its budget says instead of running (:meth:`BudgetGuard.held`); a call's
commit charges what it spent to its run, atomically with its outputs.

The runs at a limit are read in the batch's lookup round trip (``reads``); a batch read
while no run was at one (``none_over``) reads nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from printery.policies.base import Batch, Policy
from printery.rules.budgets import Exceeded
from printery.runtime import partials
from printery.runtime.accounting import Decided
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Message
from printery.store.outage import Outage
from printery.transport.channel import Command
from printery.transport.commit import EntryCommit
from printery.wire.fields import STREAMED

__all__ = ["Budget", "held"]

#: The outcome of an entry its run's budget holds.
HELD = "budget_exceeded"


class Budget(Policy):
    name = "budget"

    def __init__(self, guard: BudgetGuard, connectivity: Outage) -> None:
        self.guard = guard
        self.connectivity = connectivity

    def reads(self, batch: Batch) -> Sequence[Command]:
        # Asked even when nothing is to be read: it renews what the step's charges write.
        reads = self.guard.reads([message.correlation_id for _, message in batch.entries])
        return () if batch.none_over else reads

    async def admit(self, batch: Batch) -> None:
        if batch.none_over:
            return
        replies, read_for = await batch.replies(self)
        runs = [message.correlation_id for _, message in read_for]
        guard = self.guard
        over = await self.connectivity.retrying(lambda: guard.over(runs, replies))
        if not over:
            return
        at_limit = {id(read_for[n][0]): exceeded for n, exceeded in over.items()}
        kept = []
        for delivery, message in batch.entries:
            exceeded = at_limit.get(id(delivery))
            if exceeded is None:
                kept.append((delivery, message))
            else:
                batch.decide(await held(guard, batch, delivery, message, exceeded))
        batch.keep(kept)

    def on_commit(self, message: Message, commit: EntryCommit, outcome: str) -> EntryCommit:
        if outcome != "ok":
            return commit
        charge = self.guard.charge(message)
        return commit if charge is None else commit._replace(budget=charge)


async def held(guard: BudgetGuard, batch: Batch, delivery: Delivery, message: Message,
               exceeded: Exceeded) -> Decided:
    """The decision of an entry its run's budget holds: what the budget says instead of
    running (reference: budgets). A loop's attempt that showed partials, held by a
    budget that stops the run, will never be judged: its draft is retracted first, so no
    follower is left with a draft that never gets a verdict."""
    if exceeded.on_exceeded == "stop" and message.fields.get(STREAMED):
        attempt = message.data.get("attempt") if isinstance(message.data, dict) else None
        await partials.withdraw(
            dataclasses.replace(message, attempt=attempt if isinstance(attempt, int)
                                else message.attempt),
            [{"code": "budget_exceeded", "field": "",
              "message": f"the run's budget of {exceeded.limit:g} {exceeded.unit} "
                         "stopped it before this attempt was judged"}])
    return batch.written(delivery, message, guard.held(message, exceeded), HELD)
