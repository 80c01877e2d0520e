"""Drafts: a lost entry's streamed attempt is retracted; a committed one is not."""

from typing import Any

from tests.support.policy_fakes import entries

from printery.policies.drafts import Drafts
from printery.runtime import partials
from printery.runtime.accounting import Decided
from printery.transport.commit import DUPLICATE, FENCED, Append, EntryCommit
from printery.wire.fields import STREAMED


class Writer:
    def __init__(self) -> None:
        self.verdicts: list[tuple[int, bool, str]] = []

    def verdict(self, message: Any, *, passed: bool, reasons: Any = ()) -> None:
        self.verdicts.append((message.attempt, passed, reasons[0]["code"]))

    async def flush(self) -> None:
        return None


async def test_a_fenced_or_duplicate_commit_retracts_its_attempts_draft() -> None:
    writer = Writer()
    token = partials.using(writer)  # type: ignore[arg-type]
    try:
        (delivery, message), = entries(1)
        commit = EntryCommit("s", "c", "1-0", "k", (Append("loop:attempt", {STREAMED: "2"}),))
        item = Decided(delivery, commit, "ok", message)
        policy = Drafts()
        await policy.after_commit([item], [1])
        assert writer.verdicts == []
        await policy.after_commit([item, item], [FENCED, DUPLICATE])
        assert writer.verdicts == [(2, False, "redelivered"), (2, False, "redelivered")]
    finally:
        token.var.reset(token)
