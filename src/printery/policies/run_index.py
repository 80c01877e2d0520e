"""The run index (docs/reference.md, Runs): a commit that starts or ends its run, or
carries its handler's costs, tells the index so, written by the same script run as the
outputs (:meth:`~printery.runtime.run_index.RunIndex.mark`).

Its namesake in other layers (the same job there): :mod:`printery.store.run_index`."""

from __future__ import annotations

from printery.policies.base import Policy
from printery.runtime.handler import Message
from printery.runtime.run_index import RunIndex
from printery.transport.commit import EntryCommit

__all__ = ["IndexRuns"]


class IndexRuns(Policy):
    name = "run_index"

    def __init__(self, index: RunIndex) -> None:
        self.index = index

    def on_commit(self, message: Message, commit: EntryCommit, outcome: str) -> EntryCommit:
        mark = self.index.mark(message.stream, message.correlation_id, commit.appends,
                               message.costs)
        return commit if mark is None else commit._replace(mark=mark)
