"""Drafts (docs/reference.md, Streaming through the gate): the draft of a loop's attempt
whose entry did not commit here (another delivery took the entry meanwhile, or committed
it first) is retracted: its attempt is never judged, so its verdict would never come;
the other delivery's stands. So is what a call showed whose outputs cannot be written
(:func:`unshown`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from printery.policies.base import Policy
from printery.runtime import partials
from printery.runtime.accounting import Decided
from printery.runtime.handler import Message, Output
from printery.transport.commit import DUPLICATE, FENCED
from printery.wire.fields import STREAMED

__all__ = ["Drafts", "unshown"]


class Drafts(Policy):
    name = "drafts"

    async def after_commit(self, decided: Sequence[Decided], results: Sequence[object]) -> None:
        for item, result in zip(decided, results, strict=True):
            if item.message is not None and result in (FENCED, DUPLICATE):
                await _lost(item.message, item)


async def _lost(message: Message, item: Decided) -> None:
    for append in item.commit.appends:
        attempt = append.fields.get(STREAMED)
        if attempt and attempt.isdigit():
            await partials.withdraw(dataclasses.replace(message, attempt=int(attempt)), [{
                "code": "redelivered", "field": "",
                "message": "another delivery of the entry took its place"}])


async def unshown(message: Message, outputs: Sequence[Output], code: str, error: str) -> None:
    """Retract what a call showed whose outputs cannot be written (its entry is
    dead-lettered at once): its own draft, and the draft of a loop's attempt it carries
    (an attempt that streamed is judged by the next call, which will never come), so that
    no follower is left with a draft that gets no verdict."""
    reasons = [{"code": code, "field": "", "message": error}]
    if message.streamed:
        await partials.withdraw(message, reasons)
    for out in outputs:
        attempt = out.data.get("attempt") if isinstance(out.data, dict) else None
        if out.extra.get(STREAMED) and isinstance(attempt, int):
            await partials.withdraw(dataclasses.replace(message, attempt=attempt), reasons)
