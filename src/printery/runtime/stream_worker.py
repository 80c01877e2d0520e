"""The stream worker: a consumer group's loops wired to the entry pipeline.

Each consumer reads batches with ``XREADGROUP`` and hands each batch to the entry
pipeline (:mod:`printery.runtime.consume`), which decodes, dedupes, handles, commits
and accounts. Around it three loops keep what docs/reference.md, Failures promises:

* **leases**: every entry a consumer holds has its idle time reset every third of the
  visibility timeout, so nobody claims a live entry however long its handler runs;
* **claims**: entries idle past the visibility timeout (their consumer died) are claimed
  with ``XAUTOCLAIM`` and go through the same pipeline, with Redis's delivery count;
* **drain**: on stop, entries whose handler has not started are handed back at once
  (claimable by another consumer now), started ones may finish within the drain
  timeout, and the rest are cancelled and handed back.

Reads and claims are :mod:`printery.runtime.intake`'s job, leases and the drain
:mod:`printery.runtime.holding`'s; this module wires them to one run and its lanes.

A batch that fails (a handler's ``BaseException``, a fault of the runtime) crashes the
worker: its supervisor restarts it or marks it failed (docs/reference.md, Running workers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial
from typing import Any

import structlog

from printery.base._util import consumer_name, log_failure, stop_tasks, where
from printery.base.worker import RunContext, WorkerStats
from printery.policies.middleware import Middleware
from printery.policies.order import step_chain
from printery.policies.placement import Placement
from printery.policies.stops import Stops
from printery.rules.budgets import BudgetPlan
from printery.rules.limits import Limit
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.consume import EntryPipeline
from printery.runtime.consumer import Consumer, ConsumerSettings, InFlight
from printery.runtime.failures import Failures
from printery.runtime.handler import Handler, Output
from printery.runtime.holding import Holdings
from printery.runtime.intake import Intake
from printery.runtime.lanes import Lane, Lanes
from printery.runtime.limit_gate import LimitGate
from printery.runtime.observe import NullObserver, Observer
from printery.runtime.partials import PartialWriter, using
from printery.runtime.payloads import PayloadStore
from printery.runtime.placement import Placer
from printery.runtime.run_index import RunIndex, committed
from printery.runtime.step_context import Companion, StepContext
from printery.runtime.suspects import HandBacks, Suspects
from printery.runtime.writes import Writes
from printery.store.outage import Outage
from printery.transport.channel import DirectChannel
from printery.transport.commit import Committer
from printery.transport.connection import Redis
from printery.transport.groups import Reader, place_groups
from printery.transport.limit_store import LimitStore
from printery.transport.records import RecordLookup
from printery.transport.streams import (
    CONNECTION_ERRORS,
    Leases,
    one_slot,
)
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

log = structlog.get_logger("printery.worker")

class StreamWorker:
    """A :class:`~printery.Worker` that consumes event types through one consumer group.

    The group is named after the worker. ``handler`` receives a :class:`Message` and returns
    outputs; raising :class:`~printery.Retry` or any exception means "try again later",
    :class:`~printery.Reject` means "dead-letter now". ``companions`` run beside the
    consumers for as long as the worker runs (an aggregator's deadline sweeper), each
    given the worker's :class:`~printery.runtime.step_context.StepContext`;
    ``budget`` what the step checks and charges of its runs' budgets (docs/reference.md,
    Budgets). ``limits`` are the step's flow-control limits (:class:`~printery.Limit`);
    ``index`` the run index its commits keep (:mod:`printery.runtime.run_index`; None:
    none). ``written_by``: the steps that write what it consumes; an entry one of them
    wrote (its ``producer``) is not looked up before its handler, only checked by its
    commit (a step writes one idempotency key once; docs/reference.md, Streams and entries).
    """

    def __init__(
        self,
        name: str,
        *,
        client: Redis,
        keys: StreamKeys,
        consumes: Sequence[str],
        handler: Handler,
        codec: Codec | None = None,
        settings: ConsumerSettings | None = None,
        observer: Observer | None = None,
        payloads: PayloadStore | None = None,
        companions: Sequence[Companion] = (),
        budget: BudgetPlan | None = None,
        limits: Sequence[Limit] = (),
        index: RunIndex | None = None,
        written_by: Collection[str] = (),
        place_groups: Callable[[], Awaitable[object]] | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self._name = name
        self.client = client
        self.keys = keys
        #: Every stream this worker reads: each consumed type in every partition.
        self.streams = [part.stream(t) for part in keys.each() for t in consumes]
        self._consumes = tuple(consumes)
        self.handler = handler
        self.codec = codec or Codec()
        self.settings = settings or ConsumerSettings()
        self.observer: Observer = observer or NullObserver()
        self.payloads = payloads or PayloadStore(client, keys, limit=self.codec.payload_limit)
        self.companions = list(companions)
        self.budget = budget
        self.limits = tuple(limits)
        self.index = index
        self.written_by = frozenset(written_by)
        #: The user's middleware of the step, outermost first (docs/reference.md).
        self.middleware = tuple(middleware)
        #: Places the groups of the whole pipeline as the worker starts
        #: (:mod:`printery.runtime.groups`: ``build_workers`` passes it); None: the
        #: worker's own, as a recovery (:meth:`prepare`).
        self.place_groups = place_groups
        #: What the step's companions get of this worker.
        self.context = StepContext(name, keys, self.settings, self.codec, client, index, self.emit)
        self._gate: LimitGate | None = None
        self._stats = WorkerStats(consumers=self.settings.concurrency)
        self._consumers: list[Consumer] = []
        self._batches: set[asyncio.Task[None]] = set()
        self._ctx: RunContext | None = None
        self._lanes: Lanes | None = None
        #: Who ran alone when a process died (reference: failures, a crash blames the crasher).
        self._suspects = Suspects(name, client=client, keys=keys, record_ttl=self.settings.record_ttl)
        self._leases: Leases = HandBacks(client, name, self._suspects)
        self._connectivity: Outage | None = None

    # -- Worker protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def healthy(self) -> bool:
        """False when the read loop stopped making progress or a handler is hung."""
        if self._ctx is None or self._ctx.beat_age() > self.settings.stall_timeout:
            return False
        limit = self.settings.handler_timeout
        return limit is None or not any(c.running_longer_than(limit) for c in self._consumers)

    @property
    def connected(self) -> bool:
        """Whether the server answered this worker's last command."""
        return self._connectivity is None or self._connectivity.connected

    def stats(self) -> WorkerStats:
        self._stats.in_flight = sum(len(c.held) for c in self._consumers)
        if self._gate is not None:
            self._stats.limits = self._gate.waits.status()
        return self._stats

    async def prepare(self) -> None:
        """The worker's groups, created if missing (a service placed them already):
        :func:`~printery.transport.groups.place_groups` ``recover``."""
        await place_groups(self.client, self.keys, [Reader(t, self.name) for t in self._consumes],
                           recover=True)

    async def _place(self) -> None:
        """At the start: the pipeline's groups where its start puts them (the first
        start: at 0; a group added since: at the end of its stream; a rename: in the
        old group's place), or, built alone, this worker's own (:meth:`prepare`)."""
        if self.place_groups is not None:
            await self.place_groups()
        else:
            await self.prepare()

    async def run(self, ctx: RunContext) -> None:
        self._ctx = ctx
        #: Set as this run ends, however it ends: a loop that lost its cancellation
        #: still stops at its next turn.
        self._closing = asyncio.Event()
        connectivity = self._connectivity = Outage(self.name, ctx.stopping)
        in_flight = InFlight(self.settings.in_flight or self.settings.concurrency)
        self._consumers = [Consumer(consumer_name(self.name, i), self.settings, in_flight)
                           for i in range(self.settings.concurrency)]
        if self.limits:
            store = LimitStore(self.client, window_ms=int(self.settings.limit_window * 1000),
                               lease_ms=int(self.settings.visibility_timeout * 1000))
            self._gate = LimitGate(store, self.keys, self.limits, worker=self.name,
                                   observer=self.observer)
        lanes = self._lanes = Lanes(self.keys, lambda keys: self._lane(keys, connectivity))
        holdings = Holdings(self._consumers, self._leases, self.settings, self._gate,
                            lambda delivery: lanes.of_stream(delivery.stream).pipeline.abandon(delivery))
        intake = Intake(self.name, client=self.client, consumers=self._consumers,
                        settings=self.settings, ctx=ctx, closing=self._closing,
                        connectivity=connectivity, prepare=self.prepare, accept=self._accept,
                        stats=self._stats)
        self._crash: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Every task made below (and so every handler) sees this worker's partials writer.
        writer = PartialWriter(self.client, self.keys)
        streaming = using(writer)
        try:
            await self._run(ctx, connectivity, lanes, holdings, intake)
        finally:
            await writer.close()
            streaming.var.reset(streaming)

    async def _run(self, ctx: RunContext, connectivity: Outage, lanes: Lanes,
                   holdings: Holdings, intake: Intake) -> None:
        await connectivity.retrying(self._place)
        readers = [asyncio.create_task(intake.read(c, streams, lanes.over_counts(streams)),
                                       name=f"{c.name}:read")
                   for c in self._consumers for streams in lanes.read_sets(one_slot(self.client))]
        loops = [
            *(asyncio.create_task(lane.committer.run(), name=f"{self.name}:commit")
              for lane in lanes),
            asyncio.create_task(holdings.keep(self._closing), name=f"{self.name}:lease"),
            asyncio.create_task(holdings.watch_timeouts(self._closing),
                                name=f"{self.name}:timeouts"),
            asyncio.create_task(intake.claim(self.streams), name=f"{self.name}:claim"),
            *(asyncio.create_task(lane.stops.watch(self._closing), name=f"{self.name}:stops")
              for lane in lanes if lane.stops is not None),
            *(asyncio.ensure_future(companion(self.context)) for companion in self.companions),
            *readers,
        ]
        ctx.started()
        stop = asyncio.ensure_future(ctx.stopping.wait())
        try:
            watched: set[asyncio.Future[Any]] = {stop, self._crash, *loops}
            while not stop.done():
                done, watched = await asyncio.wait(watched, return_when="FIRST_COMPLETED")
                for task in done:  # a loop that ends early ends quietly or raises here
                    if task is not stop and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            # A read cancelled mid-flight would leave what the server delivered to it
            # pending for a visibility timeout: each reader ends after its current read.
            await asyncio.wait(readers)
            await holdings.drain(self._batches, ctx.drain_timeout)
            if self._crash.done():
                self._crash.result()
        finally:
            stop.cancel()
            self._closing.set()
            # A cancellation redis-py lost is asked again (stop_tasks); a loop that lost
            # one also ends after its current command (it checks ``_closing``).
            tasks = [*loops, *self._batches]
            stuck = await stop_tasks(tasks, timeout=self.settings.block_ms / 1000 + 5)
            for task in stuck:
                log.error("worker task did not stop: left behind", worker=self.name,
                          task=task.get_name(), at=where(task))
            for task in tasks:  # a failure while stopping is logged, never lost
                task.add_done_callback(log_failure)
            await holdings.hand_back()
            holdings.release()
            if self._gate is not None:
                await self._gate.close()
            for lane in lanes:
                await lane.records.close()

    async def emit(self, outputs: Sequence[Output], *, correlation_id: str) -> int:
        """Write outputs that no input entry caused (timers, sweepers), atomically and with
        their ``once`` guards; returns how many were written. Only while the worker runs;
        raises :class:`~printery.TransportError` when the server cannot be reached."""
        if self._lanes is None:
            raise RuntimeError(f"worker {self.name} emits only while it runs")
        return await self._lanes.of_run(correlation_id).pipeline.emit(
            outputs, correlation_id=correlation_id)

    def _lane(self, keys: StreamKeys, connectivity: Outage) -> Lane:
        """The commit path of one partition (``keys``), for :class:`Lanes`."""
        index = keys.idempotency_index(self.name)
        run_index = None if self.index is None else self.index.within(keys)
        committer = Committer(self.client, index_key=index, group=self.name,
                              ttl_ms=int(self.settings.record_ttl * 1000),
                              index_writes=None if run_index is None else partial(committed, run_index))
        records = RecordLookup(DirectChannel(self.client), index)
        payloads = self.payloads.within(keys)
        writes = Writes(self.name, codec=self.codec, keys=keys, payloads=payloads)
        failures = Failures(self.name, keys=keys, writes=writes, leases=self._leases,
                            settings=self.settings, observer=self.observer, stats=self._stats,
                            connectivity=connectivity, index=run_index)
        budget = None if self.budget is None else BudgetGuard(
            self.budget, keys=keys, codec=self.codec, worker=self.name, client=self.client,
            reserve_ms=int((self.settings.timeout + self.settings.visibility_timeout) * 1000))
        placement = Placement(Placer(self.client, keys, self.codec, connectivity)) \
            if keys.partitioned else None
        stops = Stops(keys, self.client, connectivity)
        chain = step_chain(
            self.name, self.handler, failures=failures, connectivity=connectivity,
            max_deliveries=self.settings.max_deliveries, suspects=self._suspects,
            written_by=self.written_by, placement=placement, budget=budget, gate=self._gate,
            index=run_index, middleware=self.middleware, stops=stops)
        pipeline = EntryPipeline(
            self.name, handler=self.handler, chain=chain, writes=writes, failures=failures,
            records=records, committer=committer,
            leases=self._leases, settings=self.settings, connectivity=connectivity,
            observer=self.observer, stats=self._stats,
            named=None if placement is None else placement.named, index=run_index)
        streams = [stream for stream in self.streams if keys.partitions == 1
                   or keys.locate(stream)[0] == keys.partition]
        return Lane(keys, streams, committer, records, pipeline, budget, stops)

    # -- batches ---------------------------------------------------------------------------

    def _accept(
        self, consumer: Consumer, stream: str, entries: list[tuple[str, dict[str, str] | None, int]],
        none_over: bool,
    ) -> None:
        """Hold a read (or claimed) batch and start it through the pipeline (``none_over``:
        no run was at a hard limit of its budget as it was read)."""
        assert self._lanes is not None and self._ctx is not None
        held = [consumer.hold(stream, eid, fields or {}, deliveries)
                for eid, fields, deliveries in entries]
        batch = [delivery for delivery in held if delivery is not None]
        if self._ctx.stopping.is_set() or not batch:
            return  # read after the stop signal: never started, handed back by the drain
        pipeline = self._lanes.of_stream(stream).pipeline
        if any(delivery.deliveries > 1 for delivery in batch):  # claimed: screened first
            assert self._connectivity is not None
            work = self._suspects.first(batch, self._connectivity, pipeline.process)
        else:
            work = pipeline.process(batch, none_over)
        task = asyncio.create_task(work)
        self._batches.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        """A batch ended: a failure of one (a crash) stops the worker."""
        self._batches.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        assert self._ctx is not None
        if isinstance(exc, CONNECTION_ERRORS) and self._ctx.stopping.is_set():
            return  # the server went away while we stop: the entries stay pending
        if exc is not None and not self._crash.done():
            self._stats.errors += 1
            self._stats.last_error = f"{type(exc).__name__}: {exc}"
            log.error("worker crashed", worker=self.name, error=self._stats.last_error, exc_info=exc)
            self._crash.set_exception(exc)
