"""Names shared by the bench driver and its relay processes: one place, so the two
sides of a run can never disagree about which stream is which."""

from __future__ import annotations

from dataclasses import dataclass

from printery.keys import StreamKeys

#: Starts every line of the driver-to-relay protocol (see :mod:`printery.bench.worker_proc`).
PROTOCOL_PREFIX = "@bench "


@dataclass(frozen=True, slots=True)
class BenchLayout:
    """Stage ``i`` reads ``<prefix>:s<i>`` and writes ``<prefix>:s<i+1>``; the final
    stream ``s<stages>`` is where arrivals are counted. Event types equal the stream
    suffixes, so printery's :class:`StreamKeys` and the ceiling agree on every name."""

    prefix: str
    stages: int

    @property
    def keys(self) -> StreamKeys:
        return StreamKeys(self.prefix)

    @staticmethod
    def event_type(stage: int) -> str:
        return f"s{stage}"

    def stream(self, stage: int) -> str:
        return self.keys.stream(self.event_type(stage))

    @staticmethod
    def group(stage: int) -> str:
        """Consumer group (printery: the step name) of the stage that reads ``s<stage>``."""
        return f"stage{stage}"

    @property
    def final(self) -> str:
        return self.stream(self.stages)
