"""The worker protocol every supervised unit implements, and its observable state."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class WorkerState(enum.StrEnum):
    """Lifecycle states, as `/status` reports them (docs/reference.md, HTTP)."""

    STARTING = "starting"
    RUNNING = "running"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"


class RunContext:
    """What the manager hands a worker's `run`: the readiness handshake and the stop signal.

    A worker calls :meth:`started` once it is ready to do work (its dependents start only
    then), calls :meth:`beat` whenever its main loop makes progress (a hang stops the beats
    and the health check notices), and returns from `run` soon after :attr:`stopping` is
    set, having drained what it had in flight within :attr:`drain_timeout` seconds.
    """

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.drain_timeout: float = 30.0
        self.last_beat = time.monotonic()

    def started(self) -> None:
        self.last_beat = time.monotonic()
        self.ready.set()

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def beat_age(self) -> float:
        return time.monotonic() - self.last_beat


@runtime_checkable
class Worker(Protocol):
    """A unit of work the :class:`~printery.WorkerManager` starts, checks and restarts.

    ``run`` returns only when asked to stop (``ctx.stopping``) or raises when it crashes;
    ``healthy`` is cheap and synchronous: the manager calls it on every health check.
    """

    @property
    def name(self) -> str: ...

    async def run(self, ctx: RunContext) -> None: ...

    def healthy(self) -> bool: ...


@dataclass(slots=True)
class WorkerStats:
    """Counters a worker keeps about itself; the manager adds state, uptime and restarts."""

    processed: int = 0
    errors: int = 0
    consumers: int = 0
    pending: int = 0
    last_error: str | None = None
    in_flight: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    #: Per flow-control limit of the step: entries ``waiting`` now, ``waited_s`` in all.
    limits: dict[str, dict[str, float]] = field(default_factory=dict)


@runtime_checkable
class Observable(Protocol):
    """Optional: workers that report counters and need set-up before any worker reads."""

    def stats(self) -> WorkerStats: ...

    async def prepare(self) -> None:
        """Idempotent set-up (e.g. consumer groups); the manager calls it for every worker
        before the first one starts, so no entry is published into a missing group."""
