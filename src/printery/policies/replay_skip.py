"""Replay skip: a replay's copy meant for other steps of the stream it was written to
(its ``replay_for``, docs/reference.md, Replay) is acked here, not run."""

from __future__ import annotations

from printery.policies.base import Batch, Policy, acked
from printery.runtime.accounting import Decided
from printery.wire.fields import REPLAY_FOR

__all__ = ["ReplaySkip"]


class ReplaySkip(Policy):
    name = "replay_skip"

    def __init__(self, worker: str) -> None:
        self.worker = worker

    async def admit(self, batch: Batch) -> None:
        entries = batch.entries
        if all(REPLAY_FOR not in message.envelope.extra for _, message in entries):
            return
        kept = []
        for delivery, message in entries:
            targets = message.envelope.extra.get(REPLAY_FOR)
            if targets is not None and self.worker not in targets.split(","):
                batch.decide(Decided(delivery, acked(delivery), "skipped"))
            else:
                kept.append((delivery, message))
        batch.keep(kept)
