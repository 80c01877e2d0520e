"""A stream worker's partitions (docs/reference.md, Partitions): one lane per partition,
each with the keys, the commit path and the idempotency records of its partition.

Every key one commit touches must be of one partition (one slot on a cluster), so each
partition has its own committer (its idempotency index is the partition's), its own
record lookup, budget guard, payload store and entry pipeline. An entry read from a
partition's stream goes through that partition's lane. With one partition there is one
lane whose keys are the unpartitioned ones: the path is the one of an unpartitioned worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from printery.policies.stops import Stops
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.consume import EntryPipeline
from printery.transport.channel import Command
from printery.transport.commit import Committer
from printery.transport.records import RecordLookup
from printery.wire.keys import StreamKeys, partition_of


@dataclass
class Lane:
    """One partition of a stream worker: its keys, the streams it reads, its commit path."""

    keys: StreamKeys
    streams: list[str]
    committer: Committer
    records: RecordLookup
    pipeline: EntryPipeline
    #: What its entries check and charge of their runs' budgets (None: no budget).
    budget: BudgetGuard | None = None
    #: The stopped runs it knows of, read on by a loop of the worker (None: not read).
    stops: Stops | None = None


class Lanes:
    """The lanes of one worker run, found by the stream an entry came from or by the
    correlation id of what it emits."""

    def __init__(self, keys: StreamKeys, make: Callable[[StreamKeys], Lane]) -> None:
        self.partitions = keys.partitions
        self.lanes = [make(partition) for partition in keys.each()]
        self._by_stream = {stream: lane for lane in self.lanes for stream in lane.streams}

    def __iter__(self) -> Iterator[Lane]:
        return iter(self.lanes)

    @property
    def streams(self) -> list[str]:
        return list(self._by_stream)

    def of_stream(self, stream: str) -> Lane:
        return self._by_stream[stream]

    def of_run(self, correlation_id: str) -> Lane:
        return self.lanes[partition_of(correlation_id, self.partitions)]

    def over_counts(self, streams: Sequence[str]) -> list[Command]:
        """What a read of ``streams`` also counts: the runs at a hard limit of their budget
        in each partition it reads (none without such a budget)."""
        counts: dict[Command, None] = {}
        for stream in streams:
            budget = self.of_stream(stream).budget
            count = budget.over_count() if budget is not None else None
            if count is not None:
                counts[count] = None
        return list(counts)

    def read_sets(self, one_slot_per_read: bool) -> list[Sequence[str]]:
        """The streams one ``XREADGROUP`` may name together: all of them on one server
        (one blocking read), one partition's on a cluster (a read may touch one slot)."""
        if one_slot_per_read and len(self.lanes) > 1:
            return [lane.streams for lane in self.lanes]
        return [self.streams]
