"""Reservations (docs/reference.md, Budgets): a step with an ``estimate=`` reserves it for
each entry about to run, in one round trip per batch; an entry its run's limits cannot
hold with the reservations of entries running is held as over its budget; one whose
estimate function failed is dead-lettered (``invalid_estimate``). The call's commit
removes its reservation (its charge says so: :class:`~printery.policies.budget.Budget`).

Its namesake in other layers (the same job there): :mod:`printery.runtime.reservations`."""

from __future__ import annotations

from printery.base.errors import PipelineError
from printery.policies.base import Batch, Entry, Policy
from printery.policies.budget import held
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.failures import Failures
from printery.runtime.reservations import INVALID_ESTIMATE, Reservations
from printery.store.outage import Outage

__all__ = ["Reserve"]


class Reserve(Policy):
    name = "reservations"

    def __init__(self, guard: BudgetGuard, reservations: Reservations, failures: Failures,
                 connectivity: Outage) -> None:
        self.guard = guard
        self.reservations = reservations
        self.failures = failures
        self.connectivity = connectivity

    async def admit(self, batch: Batch) -> None:
        reservations = self.reservations
        kept: list[Entry] = []
        amounts: list[tuple[str, ...] | None] = []
        for delivery, message in batch.entries:
            try:
                amounts.append(reservations.amounts(message))
            except PipelineError as exc:
                batch.decide(self.failures.dead_letter(delivery, message.fields,
                                                       INVALID_ESTIMATE, str(exc)))
                continue
            kept.append((delivery, message))
        messages = [message for _, message in kept]
        refused = await self.connectivity.retrying(
            lambda: reservations.reserve(messages, amounts)) if kept else {}
        for n, exceeded in refused.items():
            batch.decide(await held(self.guard, batch, *kept[n], exceeded))
        batch.keep([entry for n, entry in enumerate(kept) if n not in refused])
