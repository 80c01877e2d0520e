"""Max deliveries: an entry delivered more than the step's ``max_deliveries`` times is
dead-lettered without a call, with the last error its handler raised when one was kept
(reference: failures)."""

from __future__ import annotations

from printery.policies.base import Batch, Policy
from printery.runtime.failures import Failures

__all__ = ["MaxDeliveries"]


class MaxDeliveries(Policy):
    name = "max_deliveries"

    def __init__(self, failures: Failures, limit: int) -> None:
        self.failures = failures
        self.limit = limit

    async def admit(self, batch: Batch) -> None:
        limit = self.limit
        if all(delivery.deliveries <= limit for delivery, _ in batch.entries):
            return
        kept = []
        for delivery, message in batch.entries:
            if delivery.deliveries > limit:
                batch.decide(await self.failures.over_delivered(delivery, message.fields))
            else:
                kept.append((delivery, message))
        batch.keep(kept)
