"""The entry pipeline: what happens to every entry a consumer takes, in order.

1. **decode** each entry once (a ``$ref`` payload resolved first); an undecodable entry,
   or one delivered more than ``max_deliveries`` times, is dead-lettered without a
   handler call;
2. **look up** the idempotency records of the batch in one round trip (of the entries no
   step of the pipeline wrote: a step writes one key once); a duplicate is
   acked without a handler call, as is a replay's copy meant for other steps (``replay_for``);
   with budgets, the same round trip reads the runs' spent, and an entry of a run at a
   hard limit writes what its budget says instead of running (:mod:`.budgets`);
3. **handle**: a step with flow-control limits first waits for them (the batch is
   admitted in one request; see :mod:`printery.runtime.limit_gate`); each entry's handler
   runs once it has a slot and a place among the worker's running calls (its
   ``concurrency``): one after another in the batch's task while the step's handlers
   neither wait on I/O nor set context variables, else each in a task of its own
   (:mod:`printery.runtime.run_handlers`); whatever the handler raises (``SystemExit``
   included) or a call past the step's ``timeout`` is retried after a backoff (each
   retry a counted delivery) until it succeeds or goes to the dead-letter stream with
   its error; :class:`Reject`, an output that cannot be encoded and a validator's error
   dead-letter at once; only :class:`WorkerCrashed` crashes the worker (reference: failures);
4. **commit**: the entries that are decided by the same turn of the event loop commit
   together (one group commit), each atomically: its outputs, ack and idempotency record;
   a dead letter with its run's ``run:failed`` by a script of its own
   (:mod:`printery.transport.dead_letter`);
5. **account**: metrics, counters, log lines (and a span, tracing on), once the commit says what happened.

A read batch and a single entry take the same path: one entry is a batch of one. The
entries of a batch whose handlers are still running after the first turn commit as they
finish, those finishing together again in one commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

from printery.budgets import Exceeded
from printery.envelope import Codec
from printery.errors import (
    MessageError,
    PayloadTooLarge,
    PipelineError,
    Reject,
    StepTimeout,
    WorkerCrashed,
    describe,
)
from printery.fields import REPLAY_FOR, STREAMED
from printery.keys import StreamKeys
from printery.runtime import partials
from printery.runtime.accounting import Accounting, Decided
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.consumer import ConsumerSettings, Delivery
from printery.runtime.failures import Failures
from printery.runtime.handler import Handler, Message, Output, outputs_of
from printery.runtime.limit_gate import FallsBackFailed, LimitGate, Ticket
from printery.runtime.observe import Observer
from printery.runtime.payloads import PayloadStore
from printery.runtime.placement import Placer
from printery.runtime.reservations import INVALID_ESTIMATE, Reservations
from printery.runtime.run_handlers import HandlerRunner
from printery.runtime.run_index import RunIndex, RunMark
from printery.runtime.spans import bind_spans
from printery.runtime.writes import Writes
from printery.store.outage import Outage
from printery.transport.commit import DUPLICATE, FENCED, Append, Committer, EntryCommit
from printery.transport.records import RecordLookup
from printery.transport.streams import Leases, public_api
from printery.worker import WorkerStats


class EntryPipeline:
    """Takes the entries of one consumer group through the pipeline (one per worker run)."""

    def __init__(
        self,
        worker: str,
        *,
        handler: Handler,
        codec: Codec,
        keys: StreamKeys,
        payloads: PayloadStore,
        records: RecordLookup,
        committer: Committer,
        leases: Leases,
        settings: ConsumerSettings,
        observer: Observer,
        stats: WorkerStats,
        connectivity: Outage,
        budget: BudgetGuard | None = None,
        gate: LimitGate | None = None,
        placer: Placer | None = None,
        index: RunIndex | None = None,
        written_by: frozenset[str] = frozenset(),
    ) -> None:
        self.worker = worker
        self.handler = handler
        self.codec = codec
        self.keys = keys
        self.payloads = payloads
        self.writes = Writes(worker, codec=codec, keys=keys, payloads=payloads)
        self.records = records
        self.committer = committer
        self.leases = leases
        self.settings = settings
        self.observer = observer
        self.stats = stats
        self.connectivity = connectivity
        self.budget = budget
        self.gate = gate
        #: Only with several partitions: places entries in their run's partition.
        self.placer = placer
        self.index = index
        #: The steps that write what this worker reads: their entries skip the record
        #: lookup before the handler (:meth:`_recorded`).
        self.written_by = written_by
        #: Each stream's event type (the default of an entry that names none).
        self._types: dict[str, str] = {}
        self.failures = Failures(worker, keys=keys, writes=self.writes, leases=leases,
                                 settings=settings, observer=observer, stats=stats,
                                 connectivity=connectivity, index=index)
        account = Accounting(worker, observer, stats).account
        self.spans, handle, self._settle = bind_spans(worker, self._run, account)
        self.handlers = HandlerRunner(handle, self._commit, connectivity)

    async def process(self, batch: Sequence[Delivery], none_over: bool = False) -> None:
        """Take a batch through the pipeline. Raises :class:`WorkerCrashed` when a handler
        raised a ``BaseException``. Every entry is released at the end (one not committed
        stays pending and is delivered again), unless the batch failed or was cancelled:
        the entries then stay held, and the worker hands them back (claimable at once)
        as it stops."""
        begun = time.perf_counter()
        decided: list[Decided] = []
        admitted = await self._admit(batch, decided, none_over)
        if self.connectivity.stopped():
            await self._commit(decided, begun)  # what was admitted never starts
            return
        tickets = await self._limit(admitted, decided) if self.gate is not None and admitted else None
        left_held = await self.handlers.run(admitted, decided, begun, tickets, read=len(batch))
        if not left_held:
            for delivery in batch:
                delivery.release()

    # -- decode and look up ------------------------------------------------------------------

    async def _admit(
        self, batch: Sequence[Delivery], decided: list[Decided], none_over: bool = False
    ) -> list[tuple[Delivery, Message]]:
        """Decode every entry and look up all idempotency records in one round trip; the
        undecodable, over-delivered and duplicate entries go to ``decided``. ``none_over``:
        no run was at a hard limit of its budget as the batch was read, so its runs'
        budgets need no check."""
        admitted: list[tuple[Delivery, Message]] = []
        limit = self.settings.max_deliveries
        now = time.monotonic()
        types = self._types
        for delivery in batch:
            fields = delivery.fields
            try:
                if PayloadStore.reference_of(fields.get("data", "")) is not None:
                    fields = await self.payloads.resolve_fields(fields)
                if self.placer is not None:
                    fields = dict(self.placer.named(fields))
                stream_type = types.get(delivery.stream)
                if stream_type is None:
                    stream_type = types[delivery.stream] = self.keys.event_type(delivery.stream)
                envelope = self.codec.decode(fields, stream_type)
            except MessageError as exc:
                decided.append(self.failures.dead_letter(delivery, fields, exc.reason_code, str(exc)))
                continue
            targets = envelope.extra.get(REPLAY_FOR)
            routed = self.placer is not None and await self.placer.placed(delivery, fields, envelope)
            if routed or (targets is not None and self.worker not in targets.split(",")):
                # Moved to its run's partition, or a replay's copy meant for other steps of
                # this stream: acked here, not run.
                commit = EntryCommit(delivery.stream, delivery.consumer.name,
                                     delivery.entry_id, "", ())
                decided.append(Decided(delivery, commit, "routed" if routed else "skipped"))
                continue
            if delivery.deliveries > limit:
                decided.append(await self.failures.over_delivered(delivery, fields))
                continue
            admitted.append((delivery, Message(
                envelope=envelope, stream=delivery.stream, entry_id=delivery.entry_id,
                deliveries=delivery.deliveries, worker=self.worker,
                consumer=delivery.consumer.name, fields=fields, started=now,
                max_deliveries=limit,
            )))
        if not admitted:  # every entry settled before any handler: nothing to look up
            return admitted
        keys = [message.envelope.idempotency_key for _, message in admitted]
        budget = self.budget
        seen, over = await self._checked(admitted, keys, none_over)
        to_run = []
        for n, ((delivery, message), duplicate) in enumerate(zip(admitted, seen, strict=True)):
            if duplicate:
                commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id,
                                     message.envelope.idempotency_key, ())
                decided.append(Decided(delivery, commit, "duplicate"))
            elif over and (exceeded := over.get(n)) is not None:
                assert budget is not None
                decided.append(await self._held(budget, delivery, message, exceeded))
            else:
                to_run.append((delivery, message))
        if budget is not None and budget.reservations is not None and to_run:
            return await self._reserve(budget, budget.reservations, to_run, decided)
        return to_run

    async def _checked(
        self, admitted: list[tuple[Delivery, Message]], keys: list[str], none_over: bool
    ) -> tuple[list[bool], dict[int, Exceeded]]:
        """Which entries are duplicates, and which are of a run at a hard limit of its
        budget (by position), in one round trip at most."""
        budget = self.budget
        if budget is None:
            seen, _ = await self._recorded(admitted, keys)
            return seen, {}
        runs = [message.envelope.correlation_id for _, message in admitted]
        reads = budget.reads(runs)
        seen, budgets = await self._recorded(admitted, keys, () if none_over else reads)
        if none_over:
            return seen, {}
        return seen, await self.connectivity.retrying(lambda: budget.over(runs, budgets))

    async def _recorded(
        self, admitted: list[tuple[Delivery, Message]], keys: list[str], reads: Sequence[Any] = ()
    ) -> tuple[list[bool], list[Any]]:
        """Which entries' keys have a record, asked only of entries no step of the
        pipeline wrote: a step writes one key once (its commit checks the key's record
        atomically), so an entry a step wrote has none yet unless an outside writer
        copied it there, and that copy still commits nothing (the commit checks again).
        With the replies of ``reads`` (the budgets' check), from the same round trip; a
        batch of only such entries and no reads makes none."""
        written_by = self.written_by
        ask = [n for n, (_, message) in enumerate(admitted)
               if message.envelope.producer not in written_by]
        if len(ask) == len(keys):
            return await self.connectivity.retrying(
                lambda: self.records.recorded_and_read(keys, reads))
        asked = [keys[n] for n in ask]
        found, replies = await self.connectivity.retrying(
            lambda: self.records.recorded_and_read(asked, reads))
        seen = [False] * len(keys)
        for n, recorded in zip(ask, found, strict=True):
            seen[n] = recorded
        return seen, replies

    async def _held(self, budget: BudgetGuard, delivery: Delivery, message: Message,
                    exceeded: Exceeded) -> Decided:
        """The commit of an entry its run's budget holds: what the budget says instead of
        running (reference: budgets). A loop's attempt that showed partials, held by a
        budget that stops the run, will never be judged: its draft is retracted first, so
        no follower is left with a draft that never gets a verdict."""
        if exceeded.on_exceeded == "stop" and message.fields.get(STREAMED):
            attempt = message.data.get("attempt") if isinstance(message.data, dict) else None
            await partials.withdraw(
                dataclasses.replace(message, attempt=attempt if isinstance(attempt, int)
                                    else message.attempt),
                [{"code": "budget_exceeded", "field": "",
                  "message": f"the run's budget of {exceeded.limit:g} {exceeded.unit} "
                             "stopped it before this attempt was judged"}])
        appends = self.writes.appends(outputs_of(budget.held(message, exceeded)), message, 0.0)
        commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id,
                             message.envelope.idempotency_key, appends,
                             mark=self._mark(message, appends))
        return Decided(delivery, commit, "budget_exceeded", message)

    async def _reserve(
        self, budget: BudgetGuard, reservations: Reservations,
        to_run: list[tuple[Delivery, Message]], decided: list[Decided],
    ) -> list[tuple[Delivery, Message]]:
        """Reserve the step's estimate for each entry about to run, in one round trip: one
        the run's limits cannot hold is held as over its budget; one whose estimate
        function failed is dead-lettered (``invalid_estimate``)."""
        kept: list[tuple[Delivery, Message]] = []
        amounts: list[tuple[str, ...] | None] = []
        for delivery, message in to_run:
            try:
                amounts.append(reservations.amounts(message))
            except PipelineError as exc:
                decided.append(self.failures.dead_letter(delivery, message.fields,
                                                         INVALID_ESTIMATE, str(exc)))
                continue
            kept.append((delivery, message))
        messages = [message for _, message in kept]
        refused = await self.connectivity.retrying(
            lambda: reservations.reserve(messages, amounts))
        if not refused:
            return kept
        for n, exceeded in refused.items():
            decided.append(await self._held(budget, *kept[n], exceeded))
        return [entry for n, entry in enumerate(kept) if n not in refused]

    # -- handle --------------------------------------------------------------------------------

    async def _limit(
        self, admitted: list[tuple[Delivery, Message]], decided: list[Decided]
    ) -> list[Ticket]:
        """Ask the step's limits for the whole batch in one request: entries admitted
        now start at once, the others wait in :meth:`_handle`. A key function that fails
        dead-letters its entry (it would fail again on every delivery)."""
        gate = self.gate
        assert gate is not None
        tickets, failed = gate.tickets(len(admitted), (message for _, message in admitted))
        if failed:
            for n, exc in failed.items():
                delivery, message = admitted[n]
                decided.append(self.failures.dead_letter(delivery, message.fields, "invalid_limit_key",
                                                 str(exc)))
            admitted[:] = [entry for n, entry in enumerate(admitted) if n not in failed]
        await self.connectivity.retrying(lambda: gate.try_admit(tickets))
        return tickets

    async def _run(  # noqa: C901 - the hot path: one coroutine per entry, not one per part
        self, delivery: Delivery, message: Message, ticket: Ticket | None = None, tp: str = "",
    ) -> Decided | None:
        """Run the handler until it succeeds, is rejected, or runs out of deliveries; the
        entry's commit, or None when the entry was lost to another consumer meanwhile.
        ``ticket``: the step's limits, waited for before each call (before the entry takes
        a slot, so a waiting entry has not started: the drain hands it back at once).
        The slot taken here is given back once the entry is committed; a place among the
        worker's running calls (``in_flight``) only for the call itself. Outputs carry
        traceparent ``tp``.

        Whatever user code raises fails this entry only (reference: failures), ``SystemExit``
        and ``KeyboardInterrupt`` included; :class:`WorkerCrashed` is the one way it
        crashes the worker on purpose. A call past the step's timeout is cancelled
        (:meth:`~printery.runtime.holding.Holdings.watch_timeouts`) and fails with
        ``timeout``."""
        gate = self.gate
        in_flight = delivery.consumer.in_flight
        while True:
            if ticket is not None and not ticket.admitted:
                assert gate is not None
                try:
                    await self.connectivity.retrying(functools.partial(gate.admit, ticket, message))
                except FallsBackFailed as exc:  # user code: it fails its entry only
                    next_try = await self.failures.failed(delivery, message, exc)
                    if not isinstance(next_try, Message):
                        return next_try
                    message = next_try
                    continue
            if not delivery.slot and not delivery.try_take_slot():
                await delivery.take_slot()
            if in_flight.running < in_flight.limit:
                in_flight.running += 1
            else:
                await in_flight.enter()
            if delivery.trial is not None:  # a suspect of a process's death runs alone
                await delivery.trial.begin(message)
            begun = time.perf_counter()
            delivery.began = time.monotonic()
            failure: BaseException
            if ticket is not None:
                delivery.ticket = ticket
            try:
                try:
                    result = await self.handler(message)
                except BaseException:
                    if not delivery.abandoned:
                        raise
                    return None  # given up on at its timeout (abandon): settled there
                finally:
                    delivery.began = 0.0
                    if not delivery.abandoned:  # else given back as it was abandoned
                        in_flight.leave()
                        if gate is not None and ticket is not None:  # then a retry's claim
                            gate.release(ticket, message.costs)
                if delivery.abandoned:
                    return None
                if delivery.timed_out:  # it swallowed its cancellation and returned
                    raise asyncio.CancelledError
                if (ran := time.perf_counter() - begun) > self.settings.timeout:
                    # It never let the loop cancel it (a blocking call): past its deadline
                    # all the same, and its result is not taken.
                    raise StepTimeout(
                        f"{self.worker} ran {ran:.1f} s, past its timeout of "
                        f"{self.settings.timeout:g} s, without giving the event loop a turn "
                        "to cancel it (a blocking call): its result is not used")
                outputs = outputs_of(result)
            except WorkerCrashed:
                raise
            except asyncio.CancelledError as exc:
                failure = self._timeout(delivery, exc)
            except Reject as exc:
                return self.failures.dead_letter(delivery, message.fields, exc.reason_code,
                                                 str(exc), deliveries=message.deliveries)
            except BaseException as exc:  # user code: it fails its entry only (reference: failures)
                failure = exc
            else:
                try:
                    appends = self.writes.appends(outputs, message, time.perf_counter() - begun,
                                                  traceparent=tp)
                except Exception as exc:  # the handler's data, not the runtime
                    error = f"{self.worker}'s output cannot be encoded as JSON: {describe(exc)}"
                    await _unshown(message, outputs, "output_not_serializable", error)
                    return self.failures.dead_letter(
                        delivery, message.fields, "output_not_serializable", error,
                        deliveries=message.deliveries)
                if self.writes.has_large(appends):
                    try:
                        appends = await self.writes.store_large(appends)
                    except PayloadTooLarge as exc:
                        await _unshown(message, outputs, exc.reason_code, str(exc))
                        return self.failures.dead_letter(
                            delivery, message.fields, exc.reason_code, str(exc),
                            deliveries=message.deliveries)
                if message.streamed:  # its partials and verdict before what it commits
                    await partials.passed(message)
                return self._handled(delivery, message, appends)
            next_try = await self.failures.failed(delivery, message, failure)
            if not isinstance(next_try, Message):
                return next_try  # its dead letter, or None: lost to another consumer
            message = next_try

    async def abandon(self, delivery: Delivery) -> None:
        """Give up on a handler call that was cancelled at its timeout and still runs
        (it swallows its cancellation): asyncio cannot end it, so what it holds is given
        back (its place among the running calls, its limit slots, its handler slot), the
        attempt counts as failed with ``timeout``, and the entry is handed back to be
        delivered again, or dead-lettered once past ``max_deliveries``. Its task is left
        to run; whatever it does later is not committed (:meth:`_run`)."""
        delivery.abandoned = True
        delivery.consumer.in_flight.leave()
        if self.gate is not None and delivery.ticket is not None:
            self.gate.release(delivery.ticket, {})
        failure = StepTimeout(
            f"{self.worker} ran past its timeout of {self.settings.timeout:g} s and ignored "
            "its cancellation: the call was abandoned (its task left running)")
        await self.failures.abandoned(delivery, failure)
        await self.connectivity.retrying(lambda: self.leases.hand_back(
            delivery.stream, delivery.consumer.name, [delivery.entry_id],
            int(self.settings.visibility_timeout * 1000) + 1000))
        delivery.release()

    def _timeout(self, delivery: Delivery, cancelled: asyncio.CancelledError) -> StepTimeout:
        """The failure of a call cancelled at its timeout; a cancellation that is a stop
        is raised on."""
        if not self.failures.timed_out(delivery):
            raise cancelled
        timeout = StepTimeout(f"{self.worker} ran past its timeout of "
                              f"{self.settings.timeout:g} s and was cancelled")
        timeout.__cause__ = cancelled
        return timeout

    # -- build the commit ----------------------------------------------------------------------

    def _handled(
        self, delivery: Delivery, message: Message, appends: list[Append]
    ) -> Decided:
        charge = self.budget.charge(message) if self.budget is not None else None
        commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id,
                             message.envelope.idempotency_key, appends, charge,
                             mark=self._mark(message, appends))
        return Decided(delivery, commit, "ok", message)

    def _mark(self, message: Message, appends: list[Append]) -> RunMark | None:
        """What this commit tells the run index (its run's start or end, its handler's
        costs), if the index is kept (the committer writes the marks of a script run's
        entries together: ``RunIndex.writes``)."""
        index = self.index
        return None if index is None else index.mark(
            message.stream, message.correlation_id, appends, message.costs)

    # -- commit and account --------------------------------------------------------------------

    async def _commit(self, decided: list[Decided], begun: float) -> None:
        if not decided:
            return
        # Dead letters are commits of their kind, in the same round trip as the rest.
        written = await self.connectivity.retrying(
            lambda: self.committer.commit([item.commit for item in decided]))
        results: list[Any] = [result if item.letter is None else self.failures.letter_result(result)
                              for item, result in zip(decided, written, strict=True)]
        lost = []
        for item, result in zip(decided, results, strict=True):
            try:
                self._settle(item, result, time.perf_counter() - begun)
            finally:
                item.delivery.release()
            if result in (FENCED, DUPLICATE) and item.message is not None:
                lost.append(item)
        for item in lost:
            await _lost_drafts(item)

    @public_api
    async def emit(self, outputs: Sequence[Output], *, correlation_id: str) -> int:
        """Write outputs no entry caused (timers, sweepers) as one atomic commit with their
        ``once`` guards; how many were written. Raises :class:`TransportError` when the
        server cannot be reached."""
        appends = await self.writes.store_large(self.writes.appends(outputs, None, 0.0, correlation_id))
        # Its run's index learns an outcome written here (a join decided at its deadline),
        # so that a dead letter after it ends nothing.
        mark = None if self.index is None else self.index.mark("", correlation_id, appends)
        (result,) = await self.committer.commit([EntryCommit("", "", "", "", appends, mark=mark)])
        if isinstance(result, Exception):
            raise result
        return max(0, int(result) - 1)


async def _lost_drafts(item: Decided) -> None:
    """Retract the draft of a loop's attempt whose entry did not commit here (another
    delivery took the entry meanwhile, or committed it first): its attempt is never
    judged, so its verdict would never come; the other delivery's stands."""
    message = item.message
    assert message is not None
    for append in item.commit.appends:
        attempt = append.fields.get(STREAMED)
        if attempt and attempt.isdigit():
            await partials.withdraw(dataclasses.replace(message, attempt=int(attempt)), [{
                "code": "redelivered", "field": "",
                "message": "another delivery of the entry took its place"}])


async def _unshown(message: Message, outputs: Sequence[Output], code: str, error: str) -> None:
    """Retract what a call showed whose outputs cannot be written (its entry is
    dead-lettered at once): its own draft, and the draft of a loop's attempt it carries
    (an attempt that streamed is judged by the next call, which will never come), so that
    no follower is left with a draft that gets no verdict."""
    reasons = [{"code": code, "field": "", "message": error}]
    if message.streamed:
        await partials.withdraw(message, reasons)
    for out in outputs:
        attempt = out.data.get("attempt") if isinstance(out.data, dict) else None
        if out.extra.get(STREAMED) and isinstance(attempt, int):
            await partials.withdraw(dataclasses.replace(message, attempt=attempt), reasons)
