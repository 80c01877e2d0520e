"""The entry pipeline: **decode → chain → call → commit → account**, for every entry a
consumer takes (docs/engine.md, The chain of policies).

Decode parses each entry once (a ``$ref`` payload resolved first; an undecodable entry
is dead-lettered). The step's chain (:mod:`printery.policies`) admits the batch, lets each
call start and wraps it; the call runs once it holds a handler slot and a place among the
worker's running calls (:mod:`printery.runtime.run_handlers` runs them), and whatever it
raises, or a call past the step's ``timeout``, fails that entry only
(:mod:`printery.runtime.failures`: retried after a backoff, or dead-lettered; only
:class:`WorkerCrashed` crashes the worker). The entries decided by one turn of the event
loop commit together, each atomically (outputs, ack, idempotency record and what the
chain adds; a dead letter is a commit of its kind), then are accounted for. A read batch
and a single entry take the same path: one entry is a batch of one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from printery.base.errors import MessageError, PayloadTooLarge, Reject, StepTimeout, describe
from printery.base.worker import WorkerStats
from printery.policies.base import Call, Entry
from printery.policies.chain import Chain
from printery.policies.drafts import unshown
from printery.runtime import partials
from printery.runtime.accounting import Accounting, Decided
from printery.runtime.consumer import ConsumerSettings, Delivery
from printery.runtime.failures import CRASH, QUOTA, REJECTED, CallFailed, Failures, kind_of
from printery.runtime.handler import Handler, Message, Output, outputs_of
from printery.runtime.observe import Observer
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_handlers import HandlerRunner
from printery.runtime.run_index import RunIndex
from printery.runtime.spans import bind_spans
from printery.runtime.writes import Writes
from printery.store.outage import Outage
from printery.transport.channel import Command
from printery.transport.commit import Committer, EntryCommit
from printery.transport.records import RecordLookup
from printery.transport.streams import Leases, public_api


class EntryPipeline:
    """Takes the entries of one consumer group's partition through decode, ``chain`` and
    commit (one per worker run and partition; ``writes`` has its codec and keys).
    ``named``: what an entry's fields become before they are decoded (placement's run
    id); ``index``: the run index that what :meth:`emit` writes tells."""

    def __init__(
        self, worker: str, *, handler: Handler, chain: Chain, writes: Writes,
        failures: Failures, records: RecordLookup, committer: Committer, leases: Leases,
        settings: ConsumerSettings, connectivity: Outage, observer: Observer,
        stats: WorkerStats, named: Callable[[Mapping[str, str]], dict[str, str]] | None = None,
        index: RunIndex | None = None,
    ) -> None:
        self.worker = worker
        self.handler = handler
        self.chain = chain
        self.writes = writes
        self.failures = failures
        self.records = records
        self.committer = committer
        self.leases = leases
        self.settings = settings
        self.connectivity = connectivity
        self.named = named
        self.index = index
        #: Each stream's event type (the default of an entry that names none).
        self._types: dict[str, str] = {}
        account = Accounting(worker, observer, stats).account
        self.spans, handle, self._settle = bind_spans(worker, self._run, account)
        self.handlers = HandlerRunner(handle, self._commit, connectivity)

    async def process(self, batch: Sequence[Delivery], none_over: bool = False) -> None:
        """Take a batch through the pipeline (``none_over``: no run was at a hard limit of
        its budget as it was read). Raises :class:`WorkerCrashed` when a handler raised
        a ``BaseException``. Every entry is released at the end (one not committed stays
        pending and is delivered again), unless the batch failed or was cancelled: the
        entries then stay held, and the worker hands them back as it stops."""
        begun = time.perf_counter()
        decided: list[Decided] = []
        admitted = await self._decode(batch, decided)
        if admitted:
            admitted = await self.chain.admit(admitted, decided, look_up=self._look_up,
                                              written=self._written, none_over=none_over)
        if self.connectivity.stopped():
            await self._commit(decided, begun)  # what was admitted never starts
            return
        left_held = await self.handlers.run(admitted, decided, begun, read=len(batch))
        if not left_held:
            for delivery in batch:
                delivery.release()

    async def _decode(self, batch: Sequence[Delivery], decided: list[Decided]) -> list[Entry]:
        """Each entry's message; an undecodable entry's dead letter goes to ``decided``."""
        admitted: list[Entry] = []
        limit = self.settings.max_deliveries
        now = time.monotonic()
        types, named = self._types, self.named
        for delivery in batch:
            fields = delivery.fields
            try:
                if PayloadStore.reference_of(fields.get("data", "")) is not None:
                    fields = await self.writes.payloads.resolve_fields(fields)
                if named is not None:
                    fields = named(fields)
                stream_type = types.get(delivery.stream)
                if stream_type is None:
                    stream_type = types[delivery.stream] = self.writes.keys.event_type(delivery.stream)
                envelope = self.writes.codec.decode(fields, stream_type)
            except MessageError as exc:
                decided.append(self.failures.dead_letter(delivery, fields, exc.reason_code, str(exc)))
                continue
            admitted.append((delivery, Message(
                envelope=envelope, stream=delivery.stream, entry_id=delivery.entry_id,
                deliveries=delivery.deliveries, worker=self.worker, consumer=delivery.consumer.name,
                fields=fields, started=now, max_deliveries=limit,
            )))
        return admitted

    async def _look_up(self, keys: Sequence[str], reads: Sequence[Command]) -> tuple[list[bool], list[Any]]:
        """The batch's one lookup round trip: records, and the policies' reads."""
        return await self.connectivity.retrying(lambda: self.records.recorded_and_read(keys, reads))

    def _written(self, delivery: Delivery, message: Message, outputs: Sequence[Output],
                 outcome: str) -> Decided:
        """The decision of an entry that writes ``outputs`` without a call (held)."""
        return self._decision(delivery, message, self.writes.appends(outputs, message, 0.0), outcome)

    def _decision(self, delivery: Delivery, message: Message, appends: Sequence[Any],
                  outcome: str) -> Decided:
        commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id,
                             message.envelope.idempotency_key, appends)
        if self.chain.committing:
            commit = self.chain.on_commit(message, commit, outcome)
        return Decided(delivery, commit, outcome, message)

    async def _run(self, delivery: Delivery, message: Message, tp: str = "") -> Decided | None:
        """Call the handler until it succeeds, is rejected, or runs out of deliveries; the
        entry's decision, or None when the entry was lost to another consumer meanwhile.
        The slot taken here is given back once the entry is committed; a place among the
        worker's running calls (``in_flight``) only for the call itself. Outputs carry
        traceparent ``tp``."""
        chain = self.chain
        in_flight = delivery.consumer.in_flight
        while True:
            outcome: Decided | BaseException | None
            try:
                if chain.attempting:
                    await chain.attempt(delivery, message)
            except CallFailed as exc:  # user code a policy ran: it fails its entry only
                outcome = exc
            else:
                if not delivery.slot and not delivery.try_take_slot():
                    await delivery.take_slot()
                if in_flight.running < in_flight.limit:
                    in_flight.running += 1
                else:
                    await in_flight.enter()
                if chain.before:
                    await chain.before_call(delivery, message)
                outcome = await self._call(delivery, message, chain.wrapped, tp)
                if not isinstance(outcome, BaseException):
                    return outcome
            next_try = await self.failures.failed(delivery, message, outcome)
            if not isinstance(next_try, Message):
                return next_try  # its dead letter, or None: lost to another consumer
            message = next_try

    async def _call(
        self, delivery: Delivery, message: Message, call: Call | None, tp: str,
    ) -> Decided | BaseException | None:
        """One call of the handler (through the chain's ``wrap`` hooks): the entry's
        decision, the failure to retry, or None (given up on at its timeout: settled
        there). A call past the step's timeout is cancelled
        (:meth:`~printery.runtime.holding.Holdings.watch_timeouts`) and fails with
        ``timeout``; one that never let the loop cancel it fails the same way."""
        begun = time.perf_counter()
        delivery.began = time.monotonic()
        try:
            try:
                result = await (self.handler(message) if call is None else call(delivery, message))
            except BaseException:
                if not delivery.abandoned:
                    raise
                return None  # given up on at its timeout (abandon): settled there
            finally:
                delivery.began = 0.0
                if not delivery.abandoned:  # else given back as it was abandoned
                    delivery.consumer.in_flight.leave()
            if delivery.abandoned:
                return None
            if delivery.timed_out:  # it swallowed its cancellation and returned
                raise asyncio.CancelledError
            if (ran := time.perf_counter() - begun) > self.settings.timeout:
                late = StepTimeout(
                    f"{self.worker} ran {ran:.1f} s, past its timeout of "
                    f"{self.settings.timeout:g} s, without giving the event loop a turn "
                    "to cancel it (a blocking call): its result is not used")
                if message.streamed:  # it returned, so nothing retracted what it showed
                    await partials.retract(message, late)
                return late
            outputs = outputs_of(result)
        except asyncio.CancelledError as exc:
            return self._timeout(delivery, exc)
        except BaseException as exc:  # user code: it fails its entry only (reference: failures)
            kind = kind_of(exc)
            if kind == CRASH:
                raise
            if kind in (REJECTED, QUOTA):
                assert isinstance(exc, Reject)
                return self.failures.dead_letter(delivery, message.fields, exc.reason_code,
                                                 str(exc), deliveries=message.deliveries)
            return exc
        return await self._outputs(delivery, message, outputs, time.perf_counter() - begun, tp)

    async def _outputs(self, delivery: Delivery, message: Message, outputs: list[Output],
                       seconds: float, tp: str) -> Decided:
        """The decision of a call that returned ``outputs``: their commit, or the entry's
        dead letter when they cannot be written."""
        try:
            appends = self.writes.appends(outputs, message, seconds, traceparent=tp)
        except Exception as exc:  # the handler's data, not the runtime
            error = f"{self.worker}'s output cannot be encoded as JSON: {describe(exc)}"
            await unshown(message, outputs, "output_not_serializable", error)
            return self.failures.dead_letter(delivery, message.fields, "output_not_serializable",
                                             error, deliveries=message.deliveries)
        if self.writes.has_large(appends):
            try:
                appends = await self.writes.store_large(appends)
            except PayloadTooLarge as exc:
                await unshown(message, outputs, exc.reason_code, str(exc))
                return self.failures.dead_letter(delivery, message.fields, exc.reason_code,
                                                 str(exc), deliveries=message.deliveries)
        if message.streamed:  # its partials and verdict before what it commits
            await partials.passed(message)
        return self._decision(delivery, message, appends, "ok")

    async def abandon(self, delivery: Delivery) -> None:
        """Give up on a handler call that was cancelled at its timeout and still runs
        (it swallows its cancellation): asyncio cannot end it, so what it holds is given
        back (its place among the running calls, what the chain's policies hold for it,
        its handler slot), the attempt counts as failed with ``timeout``, and the entry is
        handed back to be delivered again, or dead-lettered once past ``max_deliveries``.
        Its task is left to run; whatever it does later is not committed (:meth:`_call`)."""
        delivery.abandoned = True
        delivery.consumer.in_flight.leave()
        self.chain.abandoned(delivery)
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

    async def _commit(self, decided: list[Decided], begun: float) -> None:
        if not decided:
            return
        # Dead letters are commits of their kind, in the same round trip as the rest.
        written = await self.connectivity.retrying(
            lambda: self.committer.commit([item.commit for item in decided]))
        results: list[Any] = [result if item.letter is None else self.failures.letter_result(result)
                              for item, result in zip(decided, written, strict=True)]
        for item, result in zip(decided, results, strict=True):
            try:
                self._settle(item, result, time.perf_counter() - begun)
            finally:
                item.delivery.release()
        if self.chain.after:
            await self.chain.after_commit(decided, results)

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

