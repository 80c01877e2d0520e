"""The stream worker's fast path: a read batch whose entries all got a handler slot.

Per-entry work is only what the contract needs, and every round trip is shared: one
task per batch, one decode pass, one lookup of all idempotency records, handlers called
one after another in that task (:mod:`printery.runtime.inline`) for as long as none of
them awaits for real, and one group commit for every entry whose handler finished, each
entry still its own all-or-nothing, fenced unit inside the commit script.

A handler that fails (retries wait out a backoff) or is still running leaves the batch
and continues on the worker's per-entry path. :class:`BatchPath` is a part of
:class:`~printery.runtime.stream_worker.StreamWorker`, kept apart because it is a job of
its own; it uses the worker's per-entry steps (decode, dead letters, commit outcomes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from printery.errors import MessageError, Reject
from printery.message import Envelope
from printery.runtime.committer import Call
from printery.runtime.handler import HandlerResult, Message, Output, outputs_of
from printery.runtime.inline import PENDING, Done, Suspended, describe, raise_, start, step_inline
from printery.runtime.outputs import extra_fields, output_fields
from printery.runtime.payloads import PayloadStore
from printery.transport.streams import commit_args_of

if TYPE_CHECKING:
    from printery.runtime.stream_worker import Held, StreamWorker

log = structlog.get_logger("printery.worker")

#: A read (or claimed) entry: who holds it, its fields, its delivery count.
Item = tuple["Held", dict[str, str], int]


@dataclass(slots=True)
class Commit:
    """One entry's commit as a batch collects it, with what to account once it is done."""

    held: Held
    marker: str | None
    call: Call
    kind: str  # handled, duplicate, dead_lettered
    message: Message | None = None
    reason_code: str = ""
    error: str = ""
    deliveries: int = 0


class BatchPath:
    """Processes read batches for one worker (created in its ``run``)."""

    def __init__(self, worker: StreamWorker) -> None:
        self.worker = worker
        #: Handlers run one after another in their batch's task until one awaits for real.
        self.inline = True

    async def process(self, stream: str, items: list[Item]) -> None:
        """Process a batch; whatever happens, every entry's slot is freed at the end (an
        entry not committed stays pending and is redelivered)."""
        begun = time.perf_counter()
        owned = {id(held): held for held, _, _ in items}
        await self._guard(owned, self._body(stream, items, owned, begun))

    async def _guard(self, owned: dict[int, Held], work: Awaitable[None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the runtime itself: keep the entries pending
            self.worker._record_error(exc)
            log.exception("batch processing failed", worker=self.worker.name, entries=len(owned))
        finally:
            for held in owned.values():
                self.worker._finish(held)

    async def _body(
        self, stream: str, items: list[Item], owned: dict[int, Held], begun: float
    ) -> None:
        commits: list[Commit] = []
        to_run = await self._prepare(stream, items, commits)
        if self.inline:
            for index, (held, message, marker) in enumerate(to_run):
                step = step_inline(self.worker.handler, message)
                if isinstance(step, Suspended):
                    # This handler awaits for real: it goes on here, in the task that was
                    # current when it started (so asyncio.timeout and TaskGroup inside it
                    # are bound right), and the rest of the batch moves to a task of its
                    # own. From now on this worker gives every handler a task.
                    self.inline = False
                    rest = {key: h for key, h in owned.items() if h is not held}
                    owned.clear()
                    owned[id(held)] = held
                    tail = asyncio.create_task(self._guard(
                        rest, self._tail(to_run[index + 1 :], commits, rest, begun)))
                    for moved in rest.values():
                        moved.task = tail
                    await self.worker._handle(held, message, marker, begun, step)
                    return
                commit = await self._finished(held, message, marker, step, begun, owned)
                if commit is not None:
                    commits.append(commit)
            to_run = []
        await self._tail(to_run, commits, owned, begun)

    async def _prepare(
        self, stream: str, items: list[Item], commits: list[Commit]
    ) -> list[tuple[Held, Message, str]]:
        """Decode every entry (the undecodable and the over-delivered go to ``commits`` as
        dead letters), look up all idempotency records in one round trip (duplicates go to
        ``commits`` as acks); what is left is to be handled, with its idempotency key."""
        worker = self.worker
        stream_type = worker.keys.event_type(stream)
        limit = worker.settings.max_deliveries
        decoded: list[tuple[Held, dict[str, str], int, Envelope]] = []
        for held, fields, deliveries in items:
            try:
                if PayloadStore.reference_of(fields.get("data", "")) is not None:
                    fields = await worker.payloads.resolve_fields(fields)
                envelope = worker._decode(fields, stream_type)
            except MessageError as exc:
                commits.append(worker._dead_letter_commit(
                    held, fields, deliveries, exc.reason_code, str(exc)))
                continue
            if deliveries > limit:
                commits.append(worker._dead_letter_commit(
                    held, fields, deliveries, "max_deliveries_exceeded",
                    f"delivered {deliveries} times (limit {limit})",
                ))
                continue
            decoded.append((held, fields, deliveries, envelope))
        markers = [e.idempotency_key for *_, e in decoded]
        records = worker.records
        seen = (
            await worker._with_reconnect(lambda: records.recorded(markers)) if markers else []
        )
        to_run = []
        for (held, fields, deliveries, envelope), marker, exists in zip(
            decoded, markers, seen, strict=True
        ):
            if exists:
                commits.append(
                    Commit(held, marker, worker._commit_call(held, marker, []), "duplicate"))
            else:
                to_run.append((held, worker._message(held, fields, deliveries, envelope), marker))
        return to_run

    async def _tail(
        self, to_run: list[tuple[Held, Message, str]], commits: list[Commit],
        owned: dict[int, Held], begun: float,
    ) -> None:
        """Task mode: every handler gets a task; one turn of the loop lets each run up to
        its first real await, and those finished by then are committed with ``commits``."""
        handler = self.worker.handler
        started = [(held, message, marker, start(handler(message)))
                   for held, message, marker in to_run]
        try:
            if started:
                await asyncio.sleep(0)
            for held, message, marker, handler_task in started:
                commit = await self._finished(held, message, marker, handler_task, begun, owned)
                if commit is not None:
                    commits.append(commit)
        except asyncio.CancelledError:
            for held, _, _, handler_task in started:
                if id(held) in owned:
                    handler_task.cancel()
            raise
        await self._commit_all(commits, begun)

    async def _finished(
        self, held: Held, message: Message, marker: str,
        handler: asyncio.Future[HandlerResult] | Done, begun: float, owned: dict[int, Held],
    ) -> Commit | None:
        """The commit for a handler that finished; or None, when the entry moved to a task
        of its own (handler still running, or failed: retries wait out a backoff, which
        must not hold up the batch)."""
        worker = self.worker
        if isinstance(handler, Done):
            error, value = handler.error, handler.value
        elif handler.done() and not handler.cancelled():
            error = handler.exception()
            value = None if error else handler.result()
        else:
            error, value = PENDING, None
        if isinstance(error, Reject):
            return worker._dead_letter_commit(
                held, message.fields, message.deliveries, error.reason_code, str(error))
        result: Awaitable[HandlerResult]
        if error is None:
            try:
                outputs = outputs_of(value)
            except Exception as exc:
                result = raise_(exc)
            else:
                seconds = time.perf_counter() - begun
                call = self._output_call(held, marker, message, outputs, seconds)
                if call is None:  # a large payload goes to the blob store first
                    pending = await worker._pending_outputs(message, outputs, seconds)
                    call = worker._commit_call(held, marker, pending)
                return Commit(held, marker, call, "handled", message)
        elif error is PENDING:
            assert not isinstance(handler, Done)
            result = handler
        else:
            result = raise_(error)
        owned.pop(id(held), None)
        held.task = asyncio.create_task(
            worker._own(held, worker._handle(held, message, marker, begun, result))
        )
        return None

    def _output_call(
        self, held: Held, marker: str, message: Message, outputs: list[Output], seconds: float
    ) -> Call | None:
        """The commit call for handler outputs in one pass (what the worker's
        ``_pending_outputs`` and ``_commit_call`` give), or None when a payload must go to
        the blob store first."""
        worker = self.worker
        keys, limit = worker.keys, worker.payloads.inline_limit
        extra = extra_fields(message, seconds)
        correlation = message.envelope.correlation_id
        field, producer = worker.codec.correlation_field, worker.name
        triples = []
        for out in outputs:
            fields = output_fields(out, out.correlation_id or correlation, extra,
                                   correlation_field=field, producer=producer)
            if len(fields["data"]) > limit:
                return None
            once = keys.once(out.once) if out.once else ""
            triples.append((keys.stream(out.type), once, fields))
        return commit_args_of(held.stream, held.consumer.name, held.entry_id, marker, triples)

    async def _commit_all(self, commits: list[Commit], begun: float) -> None:
        """Commit a batch's finished entries in one group commit, then account for each."""
        if not commits:
            return
        worker = self.worker
        results = await worker._commit_results([c.call for c in commits])
        for commit, result in zip(commits, results, strict=True):
            try:
                outcome = worker._outcome(commit.held, commit.marker, result)
            except Exception as exc:  # this entry's commit failed: it stays pending
                worker._record_error(exc)
                log.error("commit failed", worker=worker.name, entry_id=commit.held.entry_id,
                          error=describe(exc))
                continue
            if commit.kind == "handled" and commit.message is not None:
                worker._handled(commit.message, outcome, begun)
            elif commit.kind == "duplicate":
                worker.observer.processed(worker.name, "duplicate", time.perf_counter() - begun)
            else:
                worker._dead_lettered(commit)
