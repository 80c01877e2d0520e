"""The one failure model of an entry (reference: failures): what a failure becomes.

An entry's handling ends in one of: **done** (its outputs commit), **retry** (after a
backoff, or the handler's ``Retry(delay=...)``, as a counted delivery), **dead letter**
(with a reason code: its ``dlq`` entry and its run's ``run:failed``, a commit of its
kind: :class:`~printery.transport.commit.EntryCommit` ``letter``), or **held** (a limit,
a budget, a review:
:mod:`printery.runtime.limit_gate`, :mod:`printery.runtime.budget_guard`). Whatever decides
that an entry failed (the decode, a limit's key function, the handler, its timeout, the
encoding of its outputs, the loop's and the gate's checks by raising
:class:`~printery.Reject`) hands the failure here; nothing else decides what a failure
is, and :func:`kind_of` is the one classification that the runtime, a ``Loop`` and
``escalate`` decide by. The last error of an entry that will be retried is kept in the server, so a dead
letter says why even after the process that saw it died.
"""

from __future__ import annotations

import asyncio

import structlog

from printery.base import _json
from printery.base._util import where
from printery.base.backoff import compute_backoff
from printery.base.errors import (
    PrinteryError,
    ProviderDown,
    QuotaExhausted,
    Reject,
    Retry,
    StepTimeout,
    WorkerCrashed,
    bounded_traceback,
    describe,
)
from printery.base.worker import WorkerStats
from printery.runtime.accounting import Decided
from printery.runtime.consumer import ConsumerSettings, Delivery
from printery.runtime.handler import Message
from printery.runtime.observe import Observer
from printery.runtime.run_index import RunIndex
from printery.runtime.writes import Writes
from printery.store.outage import Outage
from printery.store.records import read_record, write_record
from printery.transport.commit import FENCED
from printery.transport.dead_letter import letter_commit
from printery.transport.streams import Leases
from printery.wire.keys import StreamKeys

__all__ = ["CRASH", "DOWN", "ERROR", "QUOTA", "REJECTED", "STOP", "TIMEOUT_KIND", "CallFailed",
           "Failures", "kind_of"]

log = structlog.get_logger("printery.worker")

#: The reason code of an entry whose handler kept failing (its last error says how).
EXHAUSTED = "max_deliveries_exceeded"
#: The reason code of a handler call cancelled at its step's timeout.
TIMEOUT = "timeout"

#: What a failure is: the one classification the runtime, a ``Loop`` and ``escalate``
#: decide by (:func:`kind_of`).
CRASH = "crash"  # WorkerCrashed: the worker crashes on purpose
QUOTA = "quota"  # QuotaExhausted: asking again will not help (a Reject: dead-lettered)
REJECTED = "rejected"  # Reject: dead-lettered at once, deliberately
DOWN = "down"  # ProviderDown: a breaker is open (a Retry: retried, or the fallback now)
TIMEOUT_KIND = "timeout"  # StepTimeout: the call ran past its step's timeout
ERROR = "error"  # anything else user code raises, SystemExit included: retried
STOP = "stop"  # a cancellation (the worker stops) or GeneratorExit: no failure of the entry


def kind_of(failure: BaseException) -> str:
    """What ``failure`` is (reference: failures), most specific first: a
    ``QuotaExhausted`` is a ``Reject`` and a ``ProviderDown`` a ``Retry``."""
    if isinstance(failure, WorkerCrashed):
        return CRASH
    if isinstance(failure, QuotaExhausted):
        return QUOTA
    if isinstance(failure, Reject):
        return REJECTED
    if isinstance(failure, ProviderDown):
        return DOWN
    if isinstance(failure, StepTimeout):
        return TIMEOUT_KIND
    if isinstance(failure, Exception | SystemExit | KeyboardInterrupt):
        return ERROR
    return STOP


class CallFailed(PrinteryError):
    """Raised by a policy's hook before a call (user code it runs failed, the
    ``__cause__``): the call fails as if its handler had raised, retried or dead-lettered
    as any failure."""


class Failures:
    """What the failures of one step's entries become."""

    def __init__(
        self, worker: str, *, keys: StreamKeys, writes: Writes, leases: Leases,
        settings: ConsumerSettings, observer: Observer, stats: WorkerStats,
        connectivity: Outage, index: RunIndex | None,
    ) -> None:
        self.worker = worker
        self.keys = keys
        self.writes = writes
        self.leases = leases
        self.settings = settings
        self.observer = observer
        self.stats = stats
        self.connectivity = connectivity
        self.index = index

    def dead_letter(
        self, delivery: Delivery, fields: dict[str, str], reason_code: str, error: str, *,
        deliveries: int | None = None, traceback: str = "",
    ) -> Decided:
        """The decision that moves an entry to ``dlq`` with its original fields and why,
        ends its run (``run:failed``) and acks it (no idempotency record: a fixed
        producer may send the same key again); written by :meth:`write`."""
        letter = self.writes.dead_letter(
            delivery.stream, delivery.entry_id, delivery.consumer.name, fields,
            reason_code=reason_code, error=error,
            deliveries=delivery.deliveries if deliveries is None else deliveries,
            traceback=traceback, index=self.index)
        return Decided(delivery, letter_commit(letter), "dead_lettered", reason_code=reason_code,
                       error=error, traceback=traceback, letter=letter)

    @staticmethod
    def letter_result(result: object) -> object:
        """A dead letter's commit result as its entry's (2: its dlq entry and its outcome;
        :data:`FENCED`: the entry is no longer ours; an error as it is)."""
        if isinstance(result, Exception):
            return result
        return FENCED if result == FENCED or result is None else 2

    async def over_delivered(self, delivery: Delivery, fields: dict[str, str]) -> Decided:
        """The dead letter of an entry delivered more than ``max_deliveries`` times: with
        the last error its handler raised when one was kept, else what is known (the
        process that handled it died each time)."""
        limit = self.settings.max_deliveries
        key = self.keys.last_error(self.worker, delivery.stream, delivery.entry_id)
        raw = await self.connectivity.retrying(lambda: read_record(self.leases.scripts.client, key))
        said = f"delivered {delivery.deliveries} times, over its limit of {limit}"
        if raw:
            try:
                last = _json.loads(raw)
                return self.dead_letter(
                    delivery, fields, last.get("reason_code") or EXHAUSTED,
                    f"{last['error']} ({said})", traceback=last.get("traceback") or "")
            except (ValueError, KeyError, TypeError, AttributeError):
                pass  # a record of another shape: said as if there were none
        return self.dead_letter(delivery, fields, EXHAUSTED,
                                f"{said}; no handler error was recorded: the process "
                                "handling it died or was killed each time it ran alone in it "
                                "(a death among several calls counts against none)")

    async def failed(
        self, delivery: Delivery, message: Message, failure: BaseException,
    ) -> Decided | Message | None:
        """A handler call of ``message`` failed: its dead letter when that was its last
        delivery, else (after the backoff) the message of its next delivery, or None
        when the entry was lost to another consumer meanwhile."""
        self._log(message, failure)
        timed_out = kind_of(failure) == TIMEOUT_KIND
        if message.deliveries >= self.settings.max_deliveries:
            return self.dead_letter(
                delivery, message.fields, TIMEOUT if timed_out else EXHAUSTED,
                describe(failure), deliveries=message.deliveries,
                traceback="" if timed_out else bounded_traceback(failure))
        await self._remember(delivery, failure, TIMEOUT if timed_out else "")
        again = await self._again(delivery, message, failure)
        return None if again.deliveries < 0 else again

    async def abandoned(self, delivery: Delivery, failure: StepTimeout) -> None:
        """A call given up on at its timeout (``EntryPipeline.abandon``): logged, and kept
        as the entry's last error, so the dead letter of a later delivery says why."""
        log.error("handler ignored its cancellation at its timeout: abandoned",
                  worker=self.worker, stream=delivery.stream, entry_id=delivery.entry_id,
                  deliveries=delivery.deliveries,
                  at=where(delivery.task) if delivery.task is not None else "")
        self.stats.errors += 1
        await self._remember(delivery, failure, TIMEOUT)

    @staticmethod
    def timed_out(delivery: Delivery) -> bool:
        """Whether a cancellation of this entry's call was its timeout (then taken back:
        its task goes on with the next delivery) rather than a stop."""
        if not delivery.timed_out:
            return False
        delivery.timed_out = False
        task = asyncio.current_task()
        return task is None or task.uncancel() == 0

    def _log(self, message: Message, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = describe(exc)
        self.observer.processed(self.worker, "error", 0.0)
        log.error(
            "handler failed", worker=self.worker, consumer=message.consumer,
            entry_id=message.entry_id, event_id=message.envelope.event_id,
            deliveries=message.deliveries, error=describe(exc), exc_info=exc,
        )

    async def _remember(self, delivery: Delivery, failure: BaseException, reason_code: str) -> None:
        """Keep the entry's last error in the server (for its record ttl), so its dead
        letter says why even when a later delivery of it only finds it delivered once
        too often (a process that died meanwhile)."""
        record = _json.dumps({"error": describe(failure), "reason_code": reason_code,
                              "traceback": "" if reason_code else bounded_traceback(failure)})
        key = self.keys.last_error(self.worker, delivery.stream, delivery.entry_id)
        ttl = int(self.settings.record_ttl * 1000)
        await self.connectivity.retrying(
            lambda: write_record(self.leases.scripts.client, key, record, ttl_ms=ttl))

    async def _again(self, delivery: Delivery, message: Message, exc: BaseException) -> Message:
        """Wait the backoff (or the handler's ``Retry(delay=...)``) without holding a slot,
        then take the entry again as a counted delivery (``deliveries`` -1: lost); the
        caller takes a slot again."""
        self.observer.retried(self.worker)
        delivery.give_slot()
        delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else compute_backoff(
            message.deliveries, base_ms=self.settings.retry_backoff_ms,
            cap_ms=self.settings.retry_backoff_cap_ms,
        )
        await asyncio.sleep(delay)
        deliveries = await self.connectivity.retrying(
            lambda: self.leases.redeliver(delivery.stream, delivery.consumer.name, delivery.entry_id)
        )
        return Message(
            envelope=message.envelope, stream=message.stream, entry_id=message.entry_id,
            deliveries=deliveries, worker=self.worker, consumer=message.consumer,
            fields=message.fields, max_deliveries=message.max_deliveries,
        )
