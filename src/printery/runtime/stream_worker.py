"""The stream worker: consumer-group reads, handler calls, atomic commits, claims, leases.

Life of an entry (CONTRACT §4):

1. read with XREADGROUP (or claimed with XAUTOCLAIM once idle past the visibility timeout);
2. decoded once; an undecodable entry is dead-lettered at once;
3. an entry whose idempotency key has a record is acked without calling the handler;
4. the handler runs while a lease loop keeps the entry's idle time low, so no one
   else claims a live entry however long it runs;
5. outputs + XACK + idempotency record commit in one script call, fenced on ownership:
   an entry reclaimed from us meanwhile is not committed by us;
6. a failure leaves the entry pending; it is redelivered (a counted delivery) after a
   backoff, and after ``max_deliveries`` goes to ``dlq`` with the error.

The hot path works per read batch, not per entry (:mod:`printery.runtime.batch`;
docs/performance.md has the numbers). Entries that find no free handler slot, retries,
and handlers that are still running when their batch commits take the per-entry path,
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from printery import _json
from printery._util import consumer_name, now_rfc3339
from printery.backoff import compute_backoff
from printery.errors import MessageError, Reject
from printery.keys import StreamKeys
from printery.message import Codec, Envelope
from printery.runtime.batch import BatchPath, Commit
from printery.runtime.committer import Call, GroupCommitter
from printery.runtime.handler import Handler, HandlerResult, Message, Output, outputs_of
from printery.runtime.inline import describe
from printery.runtime.observe import NullObserver, Observer
from printery.runtime.outputs import extra_fields, output_fields
from printery.runtime.payloads import PayloadStore
from printery.transport.streams import (
    DUPLICATE,
    FENCED,
    LEASE_LUA,
    REDELIVER_LUA,
    DirectChannel,
    PendingOutput,
    RecordLookup,
    Scripts,
    commit_args,
    commit_run,
    delivery_counts,
    ensure_group,
)
from printery.worker import RunContext, WorkerStats

log = structlog.get_logger("printery.worker")

CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Tunables of one stream worker; every one has a safe default.

    ``concurrency`` is the number of consumers (each its own name and blocking read);
    ``prefetch`` bounds the entries one consumer holds (read, not yet committed);
    ``parallel`` bounds the handlers one consumer runs at once (``None``: ``prefetch``);
    entries read past ``parallel`` wait, and are handed back at once on shutdown.
    """

    concurrency: int = 1
    prefetch: int = 16
    parallel: int | None = None
    block_ms: int = 1000
    max_deliveries: int = 5
    visibility_timeout: float = 60.0
    claim_interval: float | None = None
    retry_backoff_ms: float = 200.0
    retry_backoff_cap_ms: float = 10_000.0
    marker_ttl: float = 7 * 86400.0
    handler_timeout: float | None = None
    stall_timeout: float = 30.0

    @property
    def effective_parallel(self) -> int:
        return self.parallel or self.prefetch

    @property
    def effective_claim_interval(self) -> float:
        if self.claim_interval is not None:
            return self.claim_interval
        return max(0.05, min(self.visibility_timeout / 4, 5.0))


class Held:
    """One entry a consumer holds, from read to commit (or hand-back)."""

    __slots__ = ("consumer", "entry_id", "started", "stream", "task")

    def __init__(self, consumer: _Consumer, stream: str, entry_id: str) -> None:
        self.consumer = consumer
        self.stream = stream
        self.entry_id = entry_id
        self.started: float | None = None
        self.task: asyncio.Task[None] | None = None


class _Consumer:
    """One consumer name with its read loop, the entries it holds and its handler slots.

    Slots are a counter rather than a semaphore so the read path can take one without
    awaiting: entries that get a slot at once are processed together in their read
    batch's task; the rest wait in a task of their own.
    """

    def __init__(self, worker: StreamWorker, index: int) -> None:
        self.worker = worker
        self.name = consumer_name(worker.name, index)
        self.held: dict[tuple[str, str], Held] = {}
        self.parallel = worker.settings.effective_parallel
        self.running = 0
        self.slot_freed = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    @property
    def free(self) -> int:
        return max(0, self.worker.settings.prefetch - len(self.held))

    def try_take(self) -> bool:
        if self.running < self.parallel:
            self.running += 1
            return True
        return False

    async def take(self) -> None:
        while not self.try_take():
            self.slot_freed.clear()
            await self.slot_freed.wait()

    def give(self) -> None:
        self.running -= 1
        self.slot_freed.set()

    def release(self, held: Held) -> None:
        self.held.pop((held.stream, held.entry_id), None)
        self.room.set()


class StreamWorker:
    """A :class:`~printery.Worker` that consumes event types through one consumer group.

    The group is named after the worker. ``handler`` receives a :class:`Message` and returns
    outputs; raising :class:`~printery.Retry` or any exception means "try again later",
    :class:`~printery.Reject` means "dead-letter now".
    """

    def __init__(
        self,
        name: str,
        *,
        client: aioredis.Redis,
        keys: StreamKeys,
        consumes: Sequence[str],
        handler: Handler,
        codec: Codec | None = None,
        settings: ConsumerSettings | None = None,
        observer: Observer | None = None,
        payloads: PayloadStore | None = None,
        companions: Sequence[Callable[[StreamWorker], Awaitable[None]]] = (),
    ) -> None:
        self._name = name
        self.client = client
        self.keys = keys
        self.streams = [keys.stream(t) for t in consumes]
        self.handler = handler
        self.codec = codec or Codec()
        self.settings = settings or ConsumerSettings()
        self.observer: Observer = observer or NullObserver()
        self.payloads = payloads or PayloadStore(client, keys, limit=self.codec.payload_limit)
        self.scripts = Scripts(client)
        kwargs: Any = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        self._text_replies = bool(kwargs.get("decode_responses"))
        self._marker_ttl_ms = int(self.settings.marker_ttl * 1000)
        self.idempotency_index = keys.idempotency_index(name)
        #: The lookup before handlers run, over a connection of its own (closed after each
        #: run; it reconnects when used again).
        self.records = RecordLookup(DirectChannel(client), self.idempotency_index)
        self._stats = WorkerStats(consumers=self.settings.concurrency)
        self._consumers: list[_Consumer] = []
        self._ctx: RunContext | None = None
        self.companions = list(companions)
        self.connected = True

    # -- Worker protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def healthy(self) -> bool:
        """False when the read loop stopped making progress or a handler is hung."""
        if self._ctx is None:
            return False
        if self._ctx.beat_age() > self.settings.stall_timeout:
            return False
        limit = self.settings.handler_timeout
        if limit is not None:
            now = time.monotonic()
            for consumer in self._consumers:
                for held in consumer.held.values():
                    if held.started is not None and now - held.started > limit:
                        return False
        return True

    def stats(self) -> WorkerStats:
        self._stats.in_flight = sum(len(c.held) for c in self._consumers)
        return self._stats

    async def prepare(self) -> None:
        for stream in self.streams:
            await ensure_group(self.client, stream, self.name)

    async def run(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._consumers = [_Consumer(self, i) for i in range(self.settings.concurrency)]
        committer = GroupCommitter(
            self.scripts, index_key=self.idempotency_index, group=self.name,
            ttl_ms=self._marker_ttl_ms,
        )
        self._committer = committer
        self._batches = BatchPath(self)
        await self._with_reconnect(self.prepare)
        background = [
            asyncio.create_task(committer.run(), name=f"{self.name}:commit"),
            asyncio.create_task(self._lease_loop(), name=f"{self.name}:lease"),
            asyncio.create_task(self._claim_loop(), name=f"{self.name}:claim"),
            *(asyncio.ensure_future(companion(self)) for companion in self.companions),
        ]
        readers = [
            asyncio.create_task(self._read_loop(c), name=f"{c.name}:read") for c in self._consumers
        ]
        ctx.started()
        try:
            stop = asyncio.create_task(ctx.stopping.wait())
            watched: set[asyncio.Future[Any]] = {stop, *readers, *background}
            while not stop.done():
                done, watched = await asyncio.wait(watched, return_when="FIRST_COMPLETED")
                for task in done:
                    if task is not stop and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            await asyncio.gather(*readers, return_exceptions=True)
            await self._drain(ctx.drain_timeout)
        finally:
            stop.cancel()
            for task in [*readers, *background]:
                task.cancel()
            await asyncio.gather(*readers, *background, return_exceptions=True)
            committer.fail_pending(asyncio.CancelledError())
            await self.records.channel.close()
            for consumer in self._consumers:
                for held in list(consumer.held.values()):
                    if held.task:
                        held.task.cancel()

    async def emit(self, outputs: Sequence[Output], *, correlation_id: str) -> int:
        """Write outputs that no input entry caused (timers, sweepers), atomically and with
        their ``once`` guards; returns how many were written."""
        origin = Message(
            envelope=self.codec.new("emit", None, correlation_id=correlation_id, producer=self.name),
            stream="", entry_id="", deliveries=1, worker=self.name, consumer="", fields={},
        )
        pending = await self._pending_outputs(origin, list(outputs), 0.0)
        call = commit_args(
            stream="", consumer="", entry_id="", idempotency_key=None, outputs=pending
        )
        run = commit_run(self.idempotency_index, self.name, self._marker_ttl_ms, [call])
        (result,) = await self.scripts.commit(run)
        if isinstance(result, Exception):
            raise result
        return max(0, int(result) - 1)

    # -- reading ---------------------------------------------------------------------------

    async def _read_loop(self, consumer: _Consumer) -> None:
        assert self._ctx is not None
        ctx = self._ctx
        failures = 0
        while not ctx.stopping.is_set():
            ctx.beat()
            if consumer.free == 0:
                consumer.room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(consumer.room.wait(), self.settings.block_ms / 1000)
                continue
            try:
                reply = await self.client.xreadgroup(
                    self.name,
                    consumer.name,
                    dict.fromkeys(self.streams, ">"),
                    # At most half the prefetch per read: the next read then overlaps
                    # the processing and commit of this one, instead of waiting for it.
                    count=min(consumer.free, max(1, self.settings.prefetch // 2)),
                    block=self.settings.block_ms,
                )
                failures = 0
                self.connected = True
            except CONNECTION_ERRORS as exc:
                failures += 1
                await self._connection_trouble(exc, failures)
                continue
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._with_reconnect(self.prepare)
                continue
            for stream, entries in reply or []:
                if ctx.stopping.is_set():
                    # Read after the stop signal: never started, hand back at once.
                    await self._hand_back(consumer, stream, [eid for eid, _ in entries])
                    continue
                self._accept(consumer, stream, [(eid, fields, 1) for eid, fields in entries])

    def _accept(
        self, consumer: _Consumer, stream: str, entries: list[tuple[str, dict[str, str] | None, int]]
    ) -> None:
        """Hold a read (or claimed) batch. Entries that get a handler slot at once are
        processed together by one task; the others each wait for a slot in their own."""
        now = time.monotonic()
        batch: list[tuple[Held, dict[str, str], int]] = []
        for entry_id, fields, deliveries in entries:
            held = Held(consumer, stream, entry_id)
            consumer.held[(stream, entry_id)] = held
            if consumer.try_take():
                held.started = now
                batch.append((held, fields or {}, deliveries))
            else:
                held.task = asyncio.create_task(self._process(held, fields or {}, deliveries))
        if batch:
            task = asyncio.create_task(self._batches.process(stream, batch))
            for held, _, _ in batch:
                held.task = task

    async def _connection_trouble(self, exc: BaseException, failures: int) -> None:
        if self.connected:
            log.warning("server unreachable, backing off", worker=self.name, error=str(exc))
        self.connected = False
        assert self._ctx is not None
        delay = compute_backoff(failures, base_ms=100, cap_ms=2000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ctx.stopping.wait(), delay)

    async def _with_reconnect(self, action: Any) -> Any:
        failures = 0
        while True:
            try:
                result = await action()
                self.connected = True
                return result
            except CONNECTION_ERRORS as exc:
                failures += 1
                await self._connection_trouble(exc, failures)
                if self._ctx is not None and self._ctx.stopping.is_set():
                    raise

    # -- processing ------------------------------------------------------------------------

    def _finish(self, held: Held) -> None:
        """The entry is done with (committed, or left pending): free its slot and room."""
        held.consumer.give()
        held.consumer.release(held)

    def _decode(self, fields: dict[str, str], stream_type: str) -> Envelope:
        """``codec.decode``, minus its conversion of every field to text when the client
        already returns text; anything unusual (too large, not JSON) takes the full
        decode, which raises the right error."""
        raw = fields.get("data")
        if self._text_replies and type(raw) is str and len(raw) <= self.codec.payload_limit:
            try:
                data = _json.loads(raw)
            except ValueError:
                return self.codec.decode(fields, stream_type)
            return self.codec.envelope_from(fields, data, stream_type)
        return self.codec.decode(fields, stream_type)

    def _message(
        self, held: Held, fields: dict[str, str], deliveries: int, envelope: Envelope
    ) -> Message:
        return Message(
            envelope=envelope, stream=held.stream, entry_id=held.entry_id,
            deliveries=deliveries, worker=self.name, consumer=held.consumer.name,
            fields=fields,
        )

    async def _own(self, held: Held, work: Awaitable[None]) -> None:
        """Run one entry's slow path; whatever happens, free its slot afterwards."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the runtime itself: keep the entry pending
            self._record_error(exc)
            log.exception("entry processing failed", worker=self.name, entry_id=held.entry_id)
        finally:
            self._finish(held)

    async def _process(self, held: Held, fields: dict[str, str], deliveries: int) -> None:
        """The slow path of an entry that found no free slot: wait for one, then process."""
        try:
            await held.consumer.take()
        except BaseException:
            held.consumer.release(held)
            raise
        held.started = time.monotonic()
        await self._own(held, self._process_started(held, fields, deliveries))

    async def _process_started(self, held: Held, fields: dict[str, str], deliveries: int) -> None:
        begun = time.perf_counter()
        stream_type = self.keys.event_type(held.stream)
        try:
            fields = await self.payloads.resolve_fields(fields)
            envelope = self._decode(fields, stream_type)
        except MessageError as exc:
            await self._dead_letter(held, fields, deliveries, exc.reason_code, str(exc))
            return
        if deliveries > self.settings.max_deliveries:
            await self._dead_letter(
                held, fields, deliveries, "max_deliveries_exceeded",
                f"delivered {deliveries} times (limit {self.settings.max_deliveries})",
            )
            return
        marker = envelope.idempotency_key
        (seen,) = await self._with_reconnect(lambda: self.records.recorded([marker]))
        if seen:
            await self._commit(held, marker, [])
            self.observer.processed(self.name, "duplicate", time.perf_counter() - begun)
            return
        message = self._message(held, fields, deliveries, envelope)
        await self._handle(held, message, marker, begun, self.handler(message))

    async def _handle(
        self, held: Held, message: Message, marker: str, begun: float,
        result: Awaitable[HandlerResult],
    ) -> None:
        """Finish a handler call (``result``) and commit, or retry with backoff (each retry
        a counted delivery) until it succeeds or goes to the dead-letter stream."""
        deliveries = message.deliveries
        while True:
            try:
                outputs = outputs_of(await result)
            except Reject as exc:
                await self._dead_letter(held, message.fields, deliveries, exc.reason_code, str(exc))
                return
            except Exception as exc:
                self._record_error(exc)
                self.observer.processed(self.name, "error", time.perf_counter() - begun)
                if deliveries >= self.settings.max_deliveries:
                    await self._dead_letter(
                        held, message.fields, deliveries, "max_deliveries_exceeded", describe(exc)
                    )
                    return
                log.warning(
                    "handler failed, will retry", worker=self.name, consumer=held.consumer.name,
                    event_id=message.envelope.event_id, attempt=deliveries, error=describe(exc),
                )
                deliveries = await self._redeliver(held, deliveries)
                if deliveries < 0:
                    return
                message = self._message(held, message.fields, deliveries, message.envelope)
                result = self.handler(message)
                continue
            pending = await self._pending_outputs(message, outputs, time.perf_counter() - begun)
            outcome = await self._commit(held, marker, pending)
            self._handled(message, outcome, begun)
            return

    def _handled(self, message: Message, outcome: str, begun: float) -> None:
        self._stats.processed += 1
        self.observer.processed(self.name, outcome, time.perf_counter() - begun)
        for unit, amount in message.costs.items():
            self.observer.cost(self.name, unit, amount)

    async def _pending_outputs(
        self, message: Message, outputs: list[Output], seconds: float
    ) -> list[PendingOutput]:
        extra = extra_fields(message, seconds)
        pending = []
        for out in outputs:
            fields = output_fields(
                out, out.correlation_id or message.correlation_id, extra,
                correlation_field=self.codec.correlation_field, producer=self.name,
            )
            if len(fields["data"]) > self.payloads.inline_limit:
                fields["data"] = await self.payloads.store_if_large(fields["data"])
            pending.append(
                PendingOutput(
                    stream=self.keys.stream(out.type), fields=fields,
                    once_key=self.keys.once(out.once) if out.once else "",
                )
            )
        return pending

    def _commit_call(self, held: Held, marker: str | None, outputs: list[PendingOutput]) -> Call:
        return commit_args(
            stream=held.stream, consumer=held.consumer.name, entry_id=held.entry_id,
            idempotency_key=marker, outputs=outputs,
        )

    async def _commit_results(self, calls: list[Call]) -> list[Any]:
        """Commit until the round trip succeeds (the script is idempotent and fenced, so a
        retry after a lost reply cannot write twice); each entry's result or error."""
        failures = 0
        while True:
            try:
                future = self._committer.submit(calls)
                await self._committer.lead()
                return await asyncio.shield(future)
            except CONNECTION_ERRORS as exc:
                failures += 1
                await self._connection_trouble(exc, failures)

    def _outcome(self, held: Held, marker: str | None, result: Any) -> str:
        if isinstance(result, Exception):
            raise result
        if int(result) == FENCED:
            log.warning("entry was reclaimed by another consumer; not committing",
                        worker=self.name, entry_id=held.entry_id)
            return "fenced"
        return "duplicate" if int(result) == DUPLICATE and marker is not None else "ok"

    async def _commit(self, held: Held, marker: str, outputs: list[PendingOutput]) -> str:
        """Commit one entry until it is done or we are fenced out; the outcome label."""
        (result,) = await self._commit_results([self._commit_call(held, marker, outputs)])
        return self._outcome(held, marker, result)

    async def _redeliver(self, held: Held, deliveries: int) -> int:
        """Wait the backoff, then take the entry again as a counted delivery (-1: lost)."""
        self.observer.retried(self.name)
        delay = compute_backoff(
            deliveries, base_ms=self.settings.retry_backoff_ms,
            cap_ms=self.settings.retry_backoff_cap_ms,
        )
        await asyncio.sleep(delay)
        count = await self._with_reconnect(
            lambda: self.scripts.call(
                REDELIVER_LUA, [held.stream], [self.name, held.consumer.name, held.entry_id]
            )
        )
        return int(count)

    def _dead_letter_commit(
        self, held: Held, fields: dict[str, str], deliveries: int, reason_code: str, error: str
    ) -> Commit:
        """The commit that moves an entry to the dead-letter stream, with the original
        fields and why, and acks it (no marker: a fixed producer may send it again)."""
        entry = {
            **{k: v for k, v in fields.items()},
            "error": error[:2000],
            "reason_code": reason_code,
            "worker": self.name,
            "deliveries": str(deliveries),
            "failed_at": now_rfc3339(),
            "source_stream": held.stream,
            "source_id": held.entry_id,
        }
        entry.setdefault("type", self.keys.event_type(held.stream))
        outputs = [PendingOutput(stream=self.keys.dlq, fields=entry)]
        return Commit(
            held, None, self._commit_call(held, None, outputs), "dead_lettered",
            reason_code=reason_code, error=error, deliveries=deliveries,
        )

    async def _dead_letter(
        self, held: Held, fields: dict[str, str], deliveries: int, reason_code: str, error: str
    ) -> None:
        commit = self._dead_letter_commit(held, fields, deliveries, reason_code, error)
        (result,) = await self._commit_results([commit.call])
        self._outcome(held, None, result)
        self._dead_lettered(commit)

    def _dead_lettered(self, commit: Commit) -> None:
        self.observer.dead_lettered(self.name, commit.reason_code)
        self.observer.processed(self.name, "dead_lettered", 0.0)
        log.error("entry dead-lettered", worker=self.name, entry_id=commit.held.entry_id,
                  reason_code=commit.reason_code, deliveries=commit.deliveries,
                  error=commit.error[:500])

    def _record_error(self, exc: BaseException) -> None:
        self._stats.errors += 1
        self._stats.last_error = describe(exc)

    # -- leases, claims, hand-back, drain --------------------------------------------------

    def _held_by_stream(self, consumer: _Consumer, started_only: bool | None = None) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for held in consumer.held.values():
            if started_only is None or (held.started is not None) == started_only:
                grouped.setdefault(held.stream, []).append(held.entry_id)
        return grouped

    async def _lease_loop(self) -> None:
        interval = max(0.05, self.settings.visibility_timeout / 3)
        while True:
            await asyncio.sleep(interval)
            for consumer in self._consumers:
                for stream, ids in self._held_by_stream(consumer).items():
                    with contextlib.suppress(*CONNECTION_ERRORS):
                        await self.scripts.call(LEASE_LUA, [stream], [self.name, consumer.name, "0", *ids])

    async def _hand_back(self, consumer: _Consumer, stream: str, ids: list[str]) -> None:
        """Make entries we will not run claimable by others now, not after the timeout."""
        if not ids:
            return
        idle = str(int(self.settings.visibility_timeout * 1000) + 1000)
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self.scripts.call(LEASE_LUA, [stream], [self.name, consumer.name, idle, *ids])

    async def _claim_loop(self) -> None:
        assert self._ctx is not None
        min_idle = int(self.settings.visibility_timeout * 1000)
        while not self._ctx.stopping.is_set():
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._claim_once(min_idle)
                await self._refresh_pending()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._ctx.stopping.wait(), self.settings.effective_claim_interval
                )

    async def _claim_once(self, min_idle: int) -> None:
        for stream in self.streams:
            for consumer in self._consumers:
                if consumer.free == 0 or (self._ctx and self._ctx.stopping.is_set()):
                    continue
                reply = await self.client.xautoclaim(
                    stream, self.name, consumer.name, min_idle, "0-0", count=consumer.free
                )
                claimed = [(eid, fields) for eid, fields in reply[1] if fields is not None]
                if not claimed:
                    break
                counts = await delivery_counts(self.client, stream, self.name, [e for e, _ in claimed])
                log.info("claimed idle entries", worker=self.name, consumer=consumer.name,
                         count=len(claimed))
                self._accept(
                    consumer, stream, [(eid, f, counts.get(eid, 1)) for eid, f in claimed]
                )

    async def _refresh_pending(self) -> None:
        total = 0
        for stream in self.streams:
            summary = await self.client.xpending(stream, self.name)
            total += int(summary["pending"])
        self._stats.pending = total

    async def _drain(self, timeout: float) -> None:
        """Stop-time: hand back unstarted entries, let started ones finish up to ``timeout``,
        then cancel and hand back the rest (pending, claimable by another consumer now)."""
        for consumer in self._consumers:
            for stream, ids in self._held_by_stream(consumer, started_only=False).items():
                for entry_id in ids:
                    held = consumer.held.get((stream, entry_id))
                    if held and held.task:
                        held.task.cancel()
                await self._hand_back(consumer, stream, ids)
        tasks = [h.task for c in self._consumers for h in c.held.values() if h.task]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for consumer in self._consumers:
            leftover = self._held_by_stream(consumer)
            for held in list(consumer.held.values()):
                if held.task:
                    held.task.cancel()
            for stream, ids in leftover.items():
                await self._hand_back(consumer, stream, ids)
