"""Drafts (docs/reference.md, Streaming through the gate): the draft of a loop's attempt
whose entry did not commit here (another delivery took the entry meanwhile, or committed
it first) is retracted: its attempt is never judged, so its verdict would never come;
the other delivery's stands."""

from __future__ import annotations

import dataclasses

from printery.fields import STREAMED
from printery.policies.base import Policy
from printery.runtime import partials
from printery.runtime.accounting import Decided
from printery.transport.commit import DUPLICATE, FENCED

__all__ = ["Drafts"]


class Drafts(Policy):
    name = "drafts"

    async def after_commit(self, item: Decided, result: object) -> None:
        message = item.message
        if message is None or result not in (FENCED, DUPLICATE):
            return
        for append in item.commit.appends:
            attempt = append.fields.get(STREAMED)
            if attempt and attempt.isdigit():
                await partials.withdraw(dataclasses.replace(message, attempt=int(attempt)), [{
                    "code": "redelivered", "field": "",
                    "message": "another delivery of the entry took its place"}])
