"""A suspect's trial (reference: failures, a crash blames the crasher): an entry held by
a process that died while it ran beside others runs its next call alone in its process
(:class:`~printery.runtime.suspects.Trial`), once its call holds its slot."""

from __future__ import annotations

from printery.policies.base import Policy
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Message
from printery.runtime.suspects import Suspects

__all__ = ["Trials"]


class Trials(Policy):
    name = "trial"

    def __init__(self, suspects: Suspects) -> None:
        self.suspects = suspects

    async def before_call(self, delivery: Delivery, message: Message) -> None:
        trials = self.suspects.trials
        if trials and (trial := trials.pop(delivery, None)) is not None:
            await trial.begin(message)  # one trial: its retries run as any entry's
