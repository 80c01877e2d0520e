"""Names shared by the bench driver and its relay processes: one place, so the two
sides of a run can never disagree about which stream is which."""

from __future__ import annotations

from dataclasses import dataclass

from printery.wire.keys import StreamKeys, partition_of

#: Starts every line of the driver-to-relay protocol (see :mod:`printery.bench.worker_proc`).
PROTOCOL_PREFIX = "@bench "


@dataclass(frozen=True, slots=True)
class BenchLayout:
    """Stage ``i`` reads ``<prefix>:s<i>`` and, but for the last, writes
    ``<prefix>:s<i+1>``; the last stage (``stages - 1``) is the sink, which notes arrivals
    (:mod:`printery.bench.arrivals`). Event types equal the stream suffixes, so printery's
    :class:`StreamKeys` and the ceiling agree on every name.

    With ``partitions`` > 1 (docs/reference.md, Partitions) each stream is one per
    partition; event ``n`` is the run ``b<n>`` and stays in that run's partition through
    every stage."""

    prefix: str
    stages: int
    partitions: int = 1

    @property
    def keys(self) -> StreamKeys:
        return StreamKeys(self.prefix, self.partitions)

    def partition(self, n: int) -> int:
        """The partition of event ``n`` (its run id is ``b<n>``: :meth:`run_id`)."""
        return partition_of(self.run_id(n), self.partitions)

    @staticmethod
    def run_id(n: int) -> str:
        return f"b{n}"

    @staticmethod
    def event_type(stage: int) -> str:
        return f"s{stage}"

    def stream(self, stage: int, partition: int = 0) -> str:
        return self.keys.at(partition).stream(self.event_type(stage))

    @staticmethod
    def group(stage: int) -> str:
        """Consumer group (printery: the step name) of the stage that reads ``s<stage>``."""
        return f"stage{stage}"

    def is_sink(self, stage: int) -> bool:
        """Whether ``stage`` is the last one, which notes arrivals instead of relaying."""
        return stage == self.stages - 1

    @property
    def arrivals(self) -> str:
        """The stream of the sinks' notes (one entry per batch of arrivals)."""
        return f"{self.prefix}:arrivals"

    @property
    def arrived(self) -> str:
        """The count of arrivals noted, which the driver polls."""
        return f"{self.prefix}:arrived"
