"""Placement (with several partitions): an entry outside its run's partition is moved
there and acked here, not run (docs/reference.md, Partitions). An entry naming no run
is given one of this partition as it is decoded (:meth:`Placement.named`).

Its namesake in other layers (the same job there): :mod:`printery.runtime.placement`."""

from __future__ import annotations

from collections.abc import Mapping

from printery.policies.base import Batch, Policy, acked
from printery.runtime.accounting import Decided
from printery.runtime.placement import Placer

__all__ = ["Placement"]


class Placement(Policy):
    name = "placement"

    def __init__(self, placer: Placer) -> None:
        self.placer = placer

    def named(self, fields: Mapping[str, str]) -> dict[str, str]:
        """An entry's fields before decoding, naming a run of this partition if none."""
        return dict(self.placer.named(fields))

    async def admit(self, batch: Batch) -> None:
        kept = []
        for delivery, message in batch.entries:
            if await self.placer.placed(delivery, message.fields, message.envelope):
                batch.decide(Decided(delivery, acked(delivery), "routed"))
            else:
                kept.append((delivery, message))
        batch.keep(kept)
