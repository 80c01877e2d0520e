"""WorkerManager: starts workers in dependency order, checks their health, restarts them
with backoff (supervised mode) or fails fast (standalone mode), and drains them on stop.

Its restart policy is the project's one restart-with-backoff policy: the service's
workers and the child processes of ``--processes`` (each a
:class:`~printery.supervisor.child.ChildProcess` worker) are supervised by it alike."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from printery.base._util import stop_tasks, wait_event, where
from printery.base.backoff import compute_backoff
from printery.base.errors import SupervisorError, WorkerFailed
from printery.base.worker import Observable, RunContext, Worker, WorkerState
from printery.supervisor.levels import topological_levels

log = structlog.get_logger("printery.manager")

#: Seconds a worker cancelled after its drain overran gets to end: its hand-back and
#: close run as it unwinds, so it is cancelled again only after :data:`CANCEL_AGAIN_AFTER`
#: (a cancellation redis-py lost, see :func:`printery.base._util.check_cancelled`).
CANCEL_TIMEOUT = 15.0
CANCEL_AGAIN_AFTER = 5.0


@dataclass(slots=True)
class _Slot:
    worker: Worker
    depends_on: tuple[str, ...]
    state: WorkerState = WorkerState.STOPPED
    ctx: RunContext | None = None
    task: asyncio.Task[None] | None = None
    started_at: float | None = None
    restarts: int = 0
    #: Restarts since the worker last ran for ``stable_after`` seconds (all of them
    #: without ``stable_after``): what ``max_restarts`` and the backoff count.
    streak: int = 0
    fatal: bool = False
    crashes: int = 0
    last_error: str | None = None
    restarting: bool = False
    history: list[float] = field(default_factory=list)


class WorkerManager:
    """Owns the workers of one process.

    Supervised mode restarts a crashed or unhealthy worker after
    ``compute_backoff(attempt, base_ms=backoff_ms)`` up to ``max_restarts`` times (None:
    without end), then marks it ``failed`` and logs an alert while the others go on.
    With ``stable_after``, a worker that ran that many seconds before failing starts its
    count (and its backoff) again. Standalone mode marks the first failure ``failed`` at
    once, as does a worker raising :class:`~printery.WorkerFailed` from ``run`` in either
    mode (it knows a restart cannot help). Either way :attr:`failed` is set, so the
    process can exit 1 (standalone, or ``exit_on_failure``) and let systemd or
    Kubernetes act.
    """

    def __init__(
        self,
        *,
        supervised: bool = False,
        max_restarts: int | None = 3,
        backoff_ms: float = 1000,
        backoff_cap_ms: float = 60_000,
        stable_after: float | None = None,
        health_check_interval: float = 30.0,
        ready_timeout: float = 60.0,
        drain_timeout: float = 30.0,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.supervised = supervised
        self.max_restarts = max_restarts
        self.backoff_ms = backoff_ms
        self.backoff_cap_ms = backoff_cap_ms
        self.stable_after = stable_after
        self.health_check_interval = health_check_interval
        self.ready_timeout = ready_timeout
        self.drain_timeout = drain_timeout
        self.on_restart = on_restart
        self.failed = asyncio.Event()
        self.failures: list[WorkerFailed] = []
        self._slots: dict[str, _Slot] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._restarts_in_flight: set[asyncio.Task[None]] = set()

    # -- registration and start -------------------------------------------------------------

    def register(self, worker: Worker, depends_on: Sequence[str] = ()) -> None:
        if worker.name in self._slots:
            raise SupervisorError(f"worker {worker.name!r} registered twice")
        self._slots[worker.name] = _Slot(worker, tuple(depends_on))

    @property
    def workers(self) -> dict[str, Worker]:
        return {name: slot.worker for name, slot in self._slots.items()}

    def start_order(self) -> list[list[str]]:
        """The levels :meth:`start_all` uses; raises DependencyCycle before anything runs."""
        return topological_levels({n: s.depends_on for n, s in self._slots.items()})

    async def start_all(self) -> None:
        """Prepare every worker (consumer groups exist before anyone reads), then start level
        by level: a level's workers start in parallel once the previous level is ready."""
        levels = self.start_order()
        await asyncio.gather(
            *(s.worker.prepare() for s in self._slots.values() if isinstance(s.worker, Observable))
        )
        for level in levels:
            await asyncio.gather(*(self._start(name) for name in level))
        self._supervisor = asyncio.create_task(self._supervise(), name="printery:supervisor")

    async def _start(self, name: str) -> None:
        slot = self._slots[name]
        slot.ctx = RunContext()
        slot.ctx.drain_timeout = self.drain_timeout
        slot.state = WorkerState.STARTING
        slot.started_at = None  # set once ready: how long this run lasted counts from there
        slot.task = asyncio.create_task(self._run(slot, slot.ctx), name=f"worker:{name}")
        ready = asyncio.create_task(slot.ctx.ready.wait())
        done, _ = await asyncio.wait(
            [ready, slot.task], timeout=self.ready_timeout, return_when="FIRST_COMPLETED"
        )
        ready.cancel()
        if slot.ctx.ready.is_set():
            slot.state = WorkerState.RUNNING
            slot.started_at = time.monotonic()
            log.info("worker started", worker=name, restarts=slot.restarts)
        elif not done:
            slot.last_error = f"not ready within {self.ready_timeout}s"
            self._wake.set()

    async def _run(self, slot: _Slot, ctx: RunContext) -> None:
        try:
            await slot.worker.run(ctx)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            slot.fatal = isinstance(exc, WorkerFailed)
            slot.crashes += 1
            slot.last_error = f"{type(exc).__name__}: {exc}"
            log.error("worker crashed", worker=slot.worker.name, error=slot.last_error)
        finally:
            self._wake.set()

    # -- health and supervision -------------------------------------------------------------

    def _is_healthy(self, slot: _Slot) -> bool:
        if slot.task is None or slot.task.done() or slot.ctx is None:
            return False
        try:
            return bool(slot.worker.healthy())
        except Exception as exc:
            slot.last_error = f"healthy() raised {type(exc).__name__}: {exc}"
            return False

    async def health_check(self) -> dict[str, bool]:
        """Each worker's health: task alive, ``healthy()`` true, loop still beating."""
        result = {}
        for name, slot in self._slots.items():
            ok = self._is_healthy(slot)
            if slot.state in (WorkerState.RUNNING, WorkerState.UNHEALTHY) and not slot.restarting:
                slot.state = WorkerState.RUNNING if ok else WorkerState.UNHEALTHY
            result[name] = ok
        return result

    async def _supervise(self) -> None:
        while not self._stopping:
            await wait_event(self._wake, self.health_check_interval)
            self._wake.clear()
            if self._stopping:
                return
            health = await self.health_check()
            for name, ok in health.items():
                slot = self._slots[name]
                if ok or slot.restarting or slot.state in (WorkerState.FAILED, WorkerState.STOPPED,
                                                             WorkerState.STOPPING):
                    continue
                if slot.state == WorkerState.STARTING and slot.task and not slot.task.done():
                    continue
                reason = slot.last_error or "unhealthy"
                if slot.task and not slot.task.done():
                    reason = "health check failed" + (f" ({slot.last_error})" if slot.last_error else "")
                await self._handle_failure(slot, reason)

    async def _handle_failure(self, slot: _Slot, reason: str) -> None:
        name = slot.worker.name
        ran = time.monotonic() - slot.started_at if slot.started_at is not None else 0.0
        if self.stable_after is not None and ran >= self.stable_after:
            slot.streak = 0
        exhausted = self.max_restarts is not None and slot.streak >= self.max_restarts
        if not self.supervised or exhausted or slot.fatal:
            await self._stop_slot(slot, timeout=min(self.drain_timeout, 5.0))
            slot.state = WorkerState.FAILED
            failure = WorkerFailed(name, reason)
            self.failures.append(failure)
            log.critical("ALERT worker failed", worker=name, reason=reason,
                         restarts=slot.restarts, supervised=self.supervised)
            self.failed.set()
            return
        slot.restarting = True
        slot.state = WorkerState.RESTARTING
        delay = compute_backoff(slot.streak + 1, base_ms=self.backoff_ms, cap_ms=self.backoff_cap_ms)
        log.warning("restarting worker", worker=name, reason=reason, attempt=slot.streak + 1,
                    delay_s=round(delay, 3))
        task = asyncio.create_task(self._restart_later(slot, delay))
        self._restarts_in_flight.add(task)
        task.add_done_callback(self._restarts_in_flight.discard)

    async def _restart_later(self, slot: _Slot, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            if self._stopping:
                return
            await self._stop_slot(slot, timeout=min(self.drain_timeout, 5.0))
            slot.restarts += 1
            slot.streak += 1
            if self.on_restart:
                self.on_restart(slot.worker.name)
            await self._start(slot.worker.name)
        finally:
            slot.restarting = False
            self._wake.set()

    async def restart(self, name: str) -> None:
        """Stop ``name`` gracefully and start it again (counts as a restart)."""
        slot = self._slots[name]
        slot.state = WorkerState.RESTARTING
        await self._stop_slot(slot, timeout=self.drain_timeout)
        slot.restarts += 1
        slot.streak += 1
        if self.on_restart:
            self.on_restart(name)
        await self._start(name)

    # -- stop ---------------------------------------------------------------------------------

    async def _stop_slot(self, slot: _Slot, timeout: float) -> None:
        if slot.task is None:
            return
        if slot.ctx is not None:
            slot.ctx.drain_timeout = timeout
            slot.ctx.stopping.set()
        if not slot.task.done():
            # The worker drains within ``timeout``; the margin covers its hand-back and close.
            done, _ = await asyncio.wait([slot.task], timeout=timeout + 2.0)
            if not done:  # its drain overran: cancelled (its failures are its _run's)
                for task in await stop_tasks([slot.task], timeout=CANCEL_TIMEOUT,
                                             again_after=CANCEL_AGAIN_AFTER):
                    log.error("worker did not stop: left behind", worker=slot.worker.name,
                              at=where(task))
        slot.task = None

    async def stop_all(self, timeout: float | None = None) -> None:
        """Stop reading everywhere, drain in-flight work up to ``timeout`` seconds (finished
        entries are acked; the rest stay pending and are handed to other consumers)."""
        self._stopping = True
        self._wake.set()
        for task in list(self._restarts_in_flight):
            task.cancel()
        if self._supervisor:
            self._supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self._supervisor
        limit = self.drain_timeout if timeout is None else timeout
        active = [s for s in self._slots.values() if s.task is not None]
        for slot in active:
            if slot.state != WorkerState.FAILED:
                slot.state = WorkerState.STOPPING
        await asyncio.gather(*(self._stop_slot(s, limit) for s in active))
        for slot in self._slots.values():
            if slot.state != WorkerState.FAILED:
                slot.state = WorkerState.STOPPED
        log.info("all workers stopped")

    # -- status ---------------------------------------------------------------------------------

    def get_status(self) -> dict[str, dict[str, Any]]:
        status: dict[str, dict[str, Any]] = {}
        now = time.monotonic()
        for name, slot in self._slots.items():
            stats = slot.worker.stats() if isinstance(slot.worker, Observable) else None
            running = slot.state in (WorkerState.RUNNING, WorkerState.UNHEALTHY)
            status[name] = {
                "state": str(slot.state),
                "healthy": running and self._is_healthy(slot),
                "uptime_s": round(now - slot.started_at, 3) if running and slot.started_at else 0.0,
                "restarts": slot.restarts,
                "errors": (stats.errors if stats else 0) + slot.crashes,
                "processed": stats.processed if stats else 0,
                "consumers": stats.consumers if stats else 1,
                "pending": stats.pending if stats else 0,
                "last_error": slot.last_error or (stats.last_error if stats else None),
            }
            if stats is not None and stats.limits:
                status[name]["limits"] = stats.limits
        return status
