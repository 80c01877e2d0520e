"""The service's periodic sweeps, each a loop of its own that the service supervises:
the per-worker gauges, consumers left by processes that died, stream retention, and
review deadlines. A sweep that fails logs why and tries again at its next interval; none
of them is ever given up, whatever it raised (on a cluster in a failover redis-py's
cluster client also raises errors that are not ``RedisError``s: issue 31). A sweep that
finds the server unreachable (:data:`printery.store.UNREACHABLE`) logs a warning; anything
else it raised is logged as an error with its traceback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from printery.base._util import idle
from printery.base.errors import describe
from printery.inbox.reviews import expire_reviews, sweep_interval
from printery.observe.logging import get_logger
from printery.observe.metrics import Metrics
from printery.pipeline.dag import Pipeline
from printery.runs.cancel import cancel_due
from printery.runs.index import RunIndexReader
from printery.runtime.breaker import breaker_states
from printery.service.departed import live_owners, remove_departed
from printery.service.registry import ProcessRegistry, list_processes
from printery.service.retention import trim_pipeline_streams
from printery.settings.config import Settings
from printery.store import UNREACHABLE, Redis, read_overview, waiting
from printery.store.servers import server_ms
from printery.supervisor.manager import WorkerManager
from printery.transport.scripts import Scripts
from printery.wire.keys import WITHHELD, StreamKeys

__all__ = ["DEPARTED_INTERVAL", "GAUGE_INTERVAL", "LAG_INTERVAL", "Housekeeping", "remove_consumers"]

log = get_logger("printery.service")

T = TypeVar("T")

#: Seconds between refreshes of the per-worker gauges (up, uptime, pending).
GAUGE_INTERVAL = 1.0
#: Seconds between refreshes of the queue lag gauge (a bounded read per stream, see
#: :mod:`printery.store.overview`).
LAG_INTERVAL = 2.0
#: Seconds between sweeps for consumers of processes that died (their own graceful stop
#: removes them at once).
DEPARTED_INTERVAL = 60.0
#: Seconds between deadline sweeps: a run is cancelled at most about this late.
DEADLINE_SWEEP_S = 0.25


async def remove_consumers(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, gone: Callable[[str], bool],
    *, min_idle: float,
) -> None:
    """Remove the consumers, of every group of the pipeline, whose owner is ``gone``;
    never one that still owns entries (see :mod:`printery.service.departed`)."""
    readers = [(part.stream(event_type), group) for part in keys.each()
               for event_type, groups in pipeline.groups().items() for group in groups]
    removed = await _swept("removing stopped consumers",
                           lambda: remove_departed(client, readers, gone, min_idle=min_idle))
    if removed:
        log.info("removed consumers of stopped processes", count=len(removed),
                 consumers=sorted({name for _, _, name in removed}))


class Housekeeping:
    """The sweeps of one service process (``owner``: its consumers' owner name)."""

    def __init__(
        self, client: Redis, keys: StreamKeys, pipeline: Pipeline, settings: Settings,
        metrics: Metrics, registry: ProcessRegistry, owner: str,
    ) -> None:
        self.client = client
        self.keys = keys
        self.pipeline = pipeline
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self.owner = owner

    def sweeps(
        self, manager: Callable[[], WorkerManager | None]
    ) -> list[Coroutine[Any, Any, None]]:
        """The loops this process runs (retention and review deadlines only when set)."""
        loops = [self.update_gauges(manager), self.update_backlog(), self.sweep_departed(),
                 self.cancel_due()]
        if self.settings.transport.retention > 0:
            loops.append(self.retain())
        if self.settings.review_timeouts():
            loops.append(self.expire_reviews())
        return loops

    async def update_gauges(self, manager: Callable[[], WorkerManager | None]) -> None:
        while True:
            current = manager()
            if current is not None:
                for name, st in current.get_status().items():
                    self.metrics.set_worker(
                        name, up=bool(st["healthy"]), uptime_s=float(st["uptime_s"]),
                        pending=int(st["pending"]),
                    )
            await idle(GAUGE_INTERVAL)

    async def update_backlog(self) -> None:
        """Every :data:`LAG_INTERVAL`, the lag in seconds of each group this process runs
        (``printery_queue_lag_seconds{stream,group}``, the stream by its event type), how
        many reviews and dead letters wait (:func:`~printery.store.waiting`), and whether
        each model's circuit breaker is open (``printery_breaker_open{model}``)."""
        mine = set(self.settings.selected_workers(list(self.pipeline.steps)))
        read = [event_type for event_type, groups in self.pipeline.groups().items()
                if mine.intersection(groups)]
        while True:
            counts = await _swept("backlog sweep", lambda: waiting(self.client, self.keys))
            if counts is not None:
                self.metrics.reviews_open.set(counts.reviews)
                self.metrics.dlq_entries.set(counts.dead_letters)
            breakers = await _swept("breaker sweep",
                                    lambda: breaker_states(self.client, self.keys))
            for model, state in (breakers or {}).items():
                self.metrics.breaker_open.labels(model).set(state["state"] != "closed")
            overview = await _swept(
                "lag sweep", lambda: read_overview(self.client, self.keys, read, mine))
            if overview is not None:
                for event_type in read:
                    for group, seconds in overview.lags(event_type).items():
                        self.metrics.queue_lag.labels(event_type, group).set(seconds)
            await idle(LAG_INTERVAL)

    async def sweep_departed(self) -> None:
        """Every :data:`DEPARTED_INTERVAL`, remove the consumers of processes that died
        without removing their own; idle at least the registry's TTL, the time a dead
        process takes to leave the registry."""
        while True:
            await idle(DEPARTED_INTERVAL)
            processes = await _swept("consumer sweep", lambda: list_processes(self.client, self.keys))
            if processes is None:
                continue
            live = live_owners(processes)
            live.add(self.owner)
            await remove_consumers(self.client, self.keys, self.pipeline,
                                   _not_in(frozenset(live)), min_idle=self.registry.ttl)

    async def retain(self) -> None:
        """Sweep every stream of the pipeline each ``retention_interval``: entries older
        than ``retention`` that every group has acknowledged go (a stream no group reads,
        such as ``notification:sent``, is trimmed by age alone), and the run index
        forgets the runs whose outcome is as old. Every process sweeps; both are
        idempotent, so more processes only repeat a cheap no-op."""
        transport = self.settings.transport
        event_types = [*self.pipeline.event_types(), WITHHELD]  # (withheld: no group reads it)
        index, scripts = RunIndexReader(self.keys), Scripts(self.client)  # loaded once, not per sweep

        async def sweep() -> tuple[dict[str, int], int]:
            trimmed = await trim_pipeline_streams(
                self.client, self.keys, event_types, transport.retention,
                trim_without_groups=True,
            )
            return trimmed, await index.forget_ended(self.client, transport.retention, scripts)

        while True:
            swept = await _swept("retention sweep", sweep)
            if swept is not None:
                trimmed, forgotten = swept
                removed = {event_type: n for event_type, n in trimmed.items() if n}
                for event_type, n in removed.items():
                    self.metrics.stream_trimmed.labels(event_type).inc(n)
                if removed or forgotten:
                    log.info("retention sweep", trimmed=removed, runs_forgotten=forgotten)
            await idle(transport.retention_interval)

    async def expire_reviews(self) -> None:
        """Reject, by ``timeout``, each review left undecided past its kind's deadline.
        Every process sweeps; a decision is made once whoever tries (:mod:`printery.
        reviews`), so more processes only repeat a cheap range read."""
        timeouts = self.settings.review_timeouts()
        while True:
            # What an application's reject hook raises is logged and retried as well.
            made = await _swept("review deadline sweep", lambda: expire_reviews(
                self.client, self.keys, self.pipeline, timeouts))
            for record in made or ():
                    log.info("review rejected at its deadline", review_id=record["review_id"],
                             kind=record["kind"], outputs=record["outputs"])
            await idle(sweep_interval(timeouts))


    async def cancel_due(self) -> None:
        """Cancel each run whose deadline passed (``reason`` ``deadline_exceeded``), every
        :data:`DEADLINE_SWEEP_S`: every process sweeps, and a run is cancelled once
        whoever gets there first (:mod:`printery.runs.cancel`)."""
        scripts = Scripts(self.client)

        async def sweep() -> list[str]:
            now = await server_ms(self.client)
            ended = []
            for part in self.keys.each():
                ended += await cancel_due(self.client, part, self.pipeline, now, scripts)
            return ended

        while True:
            for run_id in await _swept("deadline sweep", sweep) or ():
                log.info("run cancelled at its deadline", run_id=run_id)
            await idle(DEADLINE_SWEEP_S)


async def _swept(what: str, action: Callable[[], Awaitable[T]]) -> T | None:
    """``action()``'s result, or None when it failed: the server unreachable
    (:data:`~printery.store.UNREACHABLE`) is logged as a warning, anything else as an
    error with its traceback; either way the sweep tries again at its next interval."""
    try:
        return await action()
    except UNREACHABLE as exc:
        log.warning(f"{what} failed: retrying next interval", error=describe(exc))
    except Exception as exc:
        log.error(f"{what} failed: retrying next interval", error=describe(exc), exc_info=exc)
    return None


def _not_in(live: frozenset[str]) -> Callable[[str], bool]:
    return lambda who: who not in live
