"""Dedupe: an entry whose idempotency key the step committed already is acked without a
call (the commit checks again, atomically). Looked up for the whole batch in its one
round trip, which the other policies' reads join (:meth:`~printery.policies.base.Batch.look_up`).

Only entries no step of the pipeline wrote are asked: a step writes one key once (its
commit checks the key's record atomically), so an entry a step wrote has no record yet
unless an outside writer copied it there, and that copy still commits nothing."""

from __future__ import annotations

from collections.abc import Collection

from printery.policies.base import Batch, Policy, acked
from printery.runtime.accounting import Decided

__all__ = ["Dedupe"]


class Dedupe(Policy):
    name = "dedupe"

    def __init__(self, written_by: Collection[str] = frozenset()) -> None:
        #: The steps that write what this step reads.
        self.written_by = frozenset(written_by)

    async def admit(self, batch: Batch) -> None:
        entries = batch.entries
        keys = [message.envelope.idempotency_key for _, message in entries]
        written_by = self.written_by
        ask = [n for n, (_, message) in enumerate(entries)
               if message.envelope.producer not in written_by]
        if len(ask) == len(keys):
            seen = await batch.look_up(keys)
        else:
            found = await batch.look_up([keys[n] for n in ask])
            seen = [False] * len(keys)
            for n, recorded in zip(ask, found, strict=True):
                seen[n] = recorded
        if not any(seen):
            return
        kept = []
        for entry, duplicate, key in zip(entries, seen, keys, strict=True):
            if duplicate:
                delivery = entry[0]
                batch.decide(Decided(delivery, acked(delivery, key), "duplicate"))
            else:
                kept.append(entry)
        batch.keep(kept)
