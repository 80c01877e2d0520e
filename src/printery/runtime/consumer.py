"""A consumer's bookkeeping: its tunables, the entries it holds and its handler slots."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from printery.rules.limits import WINDOW_SECONDS
from printery.runtime import alone

#: The window of a consumer whose prefetch is unset: from (the start, kept while its
#: handlers wait on I/O), to (reached while they do not).
ADAPTIVE_PREFETCH = (16, 256)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Tunables of one stream worker; every one has a safe default.

    ``concurrency`` is the number of consumers (each its own name and blocking read);
    ``prefetch`` bounds the entries one consumer holds (read, not yet committed); unset,
    the consumer adapts it: it starts at 16 and doubles up to 256 while its handlers
    finish without waiting on I/O, halving again when they do not (see
    :meth:`Consumer.adapt`);
    ``parallel`` bounds the entries one consumer has between a handler's start and the
    commit (``None``: the window); entries read past ``parallel`` wait for a slot, and
    are handed back at once on shutdown. A slot is held until the entry's commit, so
    ``parallel=1`` means one entry at a time from read to commit (an aggregator relies
    on it). Whatever the window, at most ``concurrency`` handler calls of the worker run
    at once (reference: failures: prefetch reads ahead, never runs ahead; :class:`InFlight`).
    ``timeout``: seconds one handler call may run before it is cancelled. ``record_ttl`` is how long
    an idempotency record is kept at least (seconds); ``claim_interval`` unset means a
    quarter of the visibility timeout, at least 50 ms and at most 5 s.
    """

    concurrency: int = 1
    prefetch: int | None = None
    parallel: int | None = None
    block_ms: int = 1000
    max_deliveries: int = 5
    visibility_timeout: float = 60.0
    claim_interval: float | None = None
    retry_backoff_ms: float = 200.0
    retry_backoff_cap_ms: float = 10_000.0
    record_ttl: float = 7 * 86400.0
    handler_timeout: float | None = None
    stall_timeout: float = 30.0
    #: Seconds a handler call may run: then it is cancelled and the attempt fails with
    #: ``reason_code`` ``timeout`` (reference: failures).
    timeout: float = 300.0
    #: The most handler calls of the worker at once in this process; None: as many as
    #: ``concurrency`` (what a step's ``concurrency`` means, docs/reference.md). A worker built
    #: by hand may run more calls at once than it has consumers.
    in_flight: int | None = None
    #: Seconds a call cancelled at its timeout may take to end before it is given up on
    #: (docs/reference.md, Failures): its entry fails and the step goes on.
    abandon_after: float = 5.0
    #: Seconds of a limit's window (``starts_per_minute``, ``tokens_per_minute``): the
    #: contract's minute; shorter only where a test watches a window refill.
    limit_window: float = WINDOW_SECONDS


    @property
    def effective_claim_interval(self) -> float:
        if self.claim_interval is not None:
            return self.claim_interval
        return max(0.05, min(self.visibility_timeout / 4, 5.0))


class InFlight:
    """The handler calls of one worker running now, at most ``limit`` (its
    ``concurrency``): a call holds its place from its start to its return, not through
    a retry's backoff or the commit, so a step of fast handlers keeps its batches.
    A counter rather than a semaphore: taking a free place costs no coroutine. ``limit``
    is 0 while a call of the process runs alone (:mod:`printery.runtime.alone`)."""

    __slots__ = ("__weakref__", "_cap", "_freed", "limit", "running")

    def __init__(self, limit: int) -> None:
        self.limit = self._cap = limit
        self.running = 0
        self._freed = asyncio.Event()
        alone.register(self)

    async def enter(self) -> None:
        while self.running >= self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.running += 1

    def leave(self) -> None:
        self.running -= 1
        self._freed.set()

    def hold_off(self) -> None:
        """Start no call until :meth:`resume` (another call runs alone)."""
        self.limit = 0

    def resume(self) -> None:
        self.limit = self._cap
        self._freed.set()

    async def drained(self, to: int = 0) -> None:
        """Until at most ``to`` calls run."""
        while self.running > to:
            self._freed.clear()
            await self._freed.wait()


class Consumer:
    """One consumer name of a group: the entries it holds and its handler slots
    (``in_flight``: the worker's running handler calls, shared by its consumers)."""

    def __init__(self, name: str, settings: ConsumerSettings,
                 in_flight: InFlight | None = None) -> None:
        self.name = name
        self.in_flight = in_flight or InFlight(settings.in_flight or settings.concurrency)
        self.floor = settings.prefetch or ADAPTIVE_PREFETCH[0]
        self.limit = settings.prefetch or ADAPTIVE_PREFETCH[1]
        #: How many entries the consumer holds at most right now (see :meth:`adapt`).
        self.window = self.floor
        #: Whether its last batch's handlers all finished without waiting on I/O (then
        #: the next batch's run one after another in the batch's task: see
        #: :meth:`~printery.runtime.run_handlers.HandlerRunner.run`).
        self.fast = False
        self.held: dict[tuple[str, str], Delivery] = {}
        #: Handler slots as a counter rather than a semaphore: taking a free one costs no
        #: coroutine (the usual case, on every entry).
        self.parallel = settings.parallel
        self.running = 0
        self._slot_freed = asyncio.Event()
        #: Set whenever an entry is released, so a full consumer reads again at once.
        self.room = asyncio.Event()
        self.room.set()

    @property
    def free(self) -> int:
        return max(0, self.window - len(self.held))

    @property
    def read_count(self) -> int:
        """Entries per read: half the window, so the next read overlaps the processing
        and commit of this one instead of waiting for it."""
        return min(self.free, max(1, self.window // 2))

    def adapt(self, fast: bool) -> None:
        """Grow the window after a batch whose handlers all finished without waiting on
        I/O, shrink it after one whose handlers did not.

        Why: a batch's fixed costs (a read, a record lookup, a commit script) are paid
        per batch, so fast handlers go fastest in large batches; but a consumer of slow
        handlers holding hundreds of entries starves the other processes of its group,
        which is the classic prefetch trap (Celery's). Fast handlers earn the large window,
        slow ones keep the small one."""
        self.fast = fast
        if fast:
            self.window = min(self.limit, self.window * 2)
        else:
            self.window = max(self.floor, self.window // 2)

    def hold(self, stream: str, entry_id: str, fields: dict[str, str],
             deliveries: int) -> Delivery | None:
        """Hold an entry read or claimed; None when this consumer holds it already (its own
        claim took it back: its lease lapsed while its loop stalled, or its call ran past
        its timeout): the delivery it has goes on, and is never replaced by a second one
        whose release would let go of the first."""
        key = (stream, entry_id)
        if key in self.held:
            return None
        delivery = self.held[key] = Delivery(self, stream, entry_id, fields, deliveries)
        return delivery

    def has_slot(self) -> bool:
        """Whether a handler slot is free now (:meth:`try_take` would take it)."""
        return self.running < (self.parallel or self.window)

    def try_take(self) -> bool:
        if self.running < (self.parallel or self.window):
            self.running += 1
            return True
        return False

    async def take(self) -> None:
        while not self.try_take():
            self._slot_freed.clear()
            await self._slot_freed.wait()

    def give(self) -> None:
        self.running -= 1
        self._slot_freed.set()

    def running_longer_than(self, seconds: float) -> bool:
        """Whether a handler of this consumer has run longer than ``seconds``."""
        now = time.monotonic()
        return any(d.started is not None and now - d.started > seconds for d in self.held.values())

    def held_ids(self, *, started: bool | None = None,
                 overdue: float | None = None) -> dict[str, list[str]]:
        """Held entry ids by stream (``started``: only those whose handler did or did
        not start; ``overdue``: leaving out those whose handler call began before that
        monotonic time, past their timeout)."""
        grouped: dict[str, list[str]] = {}
        for delivery in self.held.values():
            if overdue is not None and 0.0 < delivery.began < overdue:
                continue
            if started is None or (delivery.started is not None) == started:
                grouped.setdefault(delivery.stream, []).append(delivery.entry_id)
        return grouped


class Delivery:
    """One entry a consumer holds, from read (or claim) to commit or hand-back."""

    #: ``__weakref__``: a policy keeps what it knows of an entry keyed by its delivery
    #: (:mod:`printery.policies`), for as long as the delivery lives.
    __slots__ = ("__weakref__", "abandoned", "began", "consumer", "deliveries", "entry_id",
                 "fields", "released", "slot", "started", "stream", "task", "timed_out")

    def __init__(
        self, consumer: Consumer, stream: str, entry_id: str, fields: dict[str, str], deliveries: int
    ) -> None:
        self.consumer = consumer
        self.stream = stream
        self.entry_id = entry_id
        self.fields = fields
        self.deliveries = deliveries
        #: When its handler first got a slot (monotonic), None before.
        self.started: float | None = None
        self.slot = False
        self.released = False
        self.task: asyncio.Task[object] | None = None
        #: When the handler call running now began (monotonic; 0.0: none runs), for its
        #: timeout (:meth:`~printery.runtime.holding.Holdings.watch_timeouts`).
        self.began = 0.0
        #: Set when that call was cancelled at its timeout (the cancellation is then
        #: the attempt's failure, not a stop).
        self.timed_out = False
        #: Set when that call went on regardless and was given up on
        #: (:meth:`~printery.runtime.consume.EntryPipeline.abandon`).
        self.abandoned = False

    def try_take_slot(self) -> bool:
        """Take a free handler slot of the consumer, if there is one (held until
        :meth:`give_slot`)."""
        if not self.consumer.try_take():
            return False
        self._took()
        return True

    async def take_slot(self) -> None:
        """Wait for a handler slot of the consumer."""
        await self.consumer.take()
        self._took()

    def _took(self) -> None:
        self.slot = True
        if self.started is None:
            self.started = time.monotonic()

    def give_slot(self) -> None:
        if self.slot:
            self.slot = False
            self.consumer.give()

    def release(self) -> None:
        """Done with (committed, lost, or left pending for redelivery); idempotent.
        Lets go of its task too: the task's result (the entry's decision) refers to this
        delivery, and a cycle per entry would leave every entry to the cyclic garbage
        collector (a quarter of a worker's CPU when it was so)."""
        if self.released:
            return  # its batch releases every entry again at the end
        self.released = True
        self.task = None
        self.give_slot()
        if self.consumer.held.pop((self.stream, self.entry_id), None) is not None:
            self.consumer.room.set()
