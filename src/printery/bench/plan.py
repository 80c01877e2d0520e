"""What one bench run is asked for: its sides, its constants, its options checked.

Apart from the driver so that the run of one side (:mod:`printery.bench.side`) and the
document (:mod:`printery.bench.document`) read the same plan and the same side names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from printery.base.errors import ConfigError
from printery.wire.keys import MAX_PARTITIONS

#: The sides, in the order they run: the same-entry ceiling, the minimal one, printery,
#: printery's handlers reporting costs (only with a budget), and printery with the
#: features asked for (only when some are).
SIDES = ("ceiling", "ceiling_minimal", "printery", "printery_without", "printery_with")
#: ``ceiling`` option: which ceilings run (printery always does).
CEILINGS: dict[str, tuple[str, ...]] = {
    "same": ("ceiling",),
    "minimal": ("ceiling_minimal",),
    "both": ("ceiling", "ceiling_minimal"),
}

#: Entries per read of the ceilings (their XREADGROUP count, the outside yardstick's).
#: printery reads what its own ``prefetch`` makes it read.
BATCH = 100
#: Blocking-read time of the ceilings and of the driver's client: short, so a stop is
#: quick; it costs nothing when busy. printery's is the library's default.
BLOCK_MS = 100
#: A side that delivers nothing new for this long has failed; the run goes on.
STALL_TIMEOUT = 30.0
#: Duration of the rate mode when none is given.
DEFAULT_DURATION = 20.0


@dataclass(frozen=True, slots=True)
class Plan:
    """A run's options once checked, with the run's id and its scratch folder: what every
    side of every round runs with."""

    events: int
    stages: int
    processes: int
    payload_bytes: int
    rate: float | None
    duration: float
    run_id: str
    work_dir: Path
    prefetch: int | None
    features: tuple[str, ...] = ()
    partitions: int = 1
    rounds: int = 1


def validate(
    events: int, stages: int, processes: int, payload_bytes: int, rate: float | None,
    duration: float | None, prefetch: int | None, ceiling: str, partitions: int = 1,
    rounds: int = 1,
) -> None:
    if rate is None and events < 1:
        raise ConfigError("events", events, "at least 1")
    if stages < 1:
        raise ConfigError("stages", stages, "at least 1")
    if processes < 1:
        raise ConfigError("processes", processes, "at least 1")
    if payload_bytes < 0:
        raise ConfigError("payload_bytes", payload_bytes, "0 or more")
    if rate is not None and rate <= 0:
        raise ConfigError("rate", rate, "events per second, more than 0")
    if duration is not None and duration <= 0:
        raise ConfigError("duration", duration, "seconds, more than 0")
    if rate is not None and round(rate * (duration or DEFAULT_DURATION)) < 1:
        raise ConfigError("rate", rate, "rate * duration must give at least one event")
    if prefetch is not None and prefetch < 1:
        raise ConfigError("prefetch", prefetch, "at least 1")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError("partitions", partitions, f"1 to {MAX_PARTITIONS}")
    if ceiling not in CEILINGS:
        raise ConfigError("ceiling", ceiling, f"one of {', '.join(CEILINGS)}")
    if rounds < 1:
        raise ConfigError("rounds", rounds, "at least 1")
