"""The server side of runs (reference: the client and ``/v1/runs``): :class:`Runs`
submits and reads the runs of one pipeline over a connected client. :class:`Client`
wraps it for applications; the service's ``/v1`` API, the console and the operator
commands use it directly over their own connection.

A submit is validated against the ingress step's input before anything is written, and
is one round trip: a script checks the idempotency key and appends the complete entry
(every field of an entry) in one step, so the same key gives the same run id however many
processes submit it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from printery.base._util import fail_waiters, new_id
from printery.base.errors import InvalidInput, PayloadTooLarge, UnknownRun
from printery.base.reason import Reason
from printery.observe.logging import get_logger
from printery.observe.telemetry import valid_traceparent
from printery.pipeline.dag import Pipeline, run_id_problem
from printery.runs.cancel import SUPERSEDED, Cancelled, cancel_run
from printery.runs.history import id_order
from printery.runs.reader import RunReader
from printery.runtime.run_index import RUNNING
from printery.store import Redis
from printery.transport.channel import DirectChannel
from printery.transport.scripts import Scripts, script
from printery.wire.envelope import Codec
from printery.wire.fields import TRACEPARENT
from printery.wire.keys import StreamKeys, new_id_in, partition_of

__all__ = ["PRODUCER", "SUBMIT_WAIT", "Runs"]

SUBMIT_LUA = script("submit")
#: How long a submit's idempotency record is kept (the workers' records: 7 days).
SUBMIT_RECORD_TTL = 7 * 86400
#: Who wrote an entry submitted through the client (the ``producer`` field).
PRODUCER = "printery-client"
#: Seconds a submit waits for a replica by default (``[transport] submit_wait``).
SUBMIT_WAIT = 1.0

log = get_logger("printery.client")


class Runs:
    """Submitting and reading runs of ``pipeline`` over a connected client: what
    :class:`Client` and the HTTP API (``/v1/runs``) both do."""

    def __init__(
        self, redis: Redis, keys: StreamKeys, pipeline: Pipeline, *,
        payload_limit: int, producer: str = PRODUCER, replicated: float = SUBMIT_WAIT,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.pipeline = pipeline
        self.codec: Codec = pipeline.codec(payload_limit)
        self.producer = producer
        self.reader = RunReader(redis, keys, pipeline)
        self._submits = _SubmitBatcher(redis, replicated)
        self._scripts = Scripts(redis)

    def prepare(
        self, data: Any, *, event_type: str | None = None, run_id: str | None = None,
        idempotency_key: str | None = None, traceparent: str | None = None,
    ) -> tuple[str, str, str, dict[str, str]]:
        """Check ``data`` and build its entry: ``(event type, run id, idempotency key,
        fields)``. Raises :class:`InvalidInput` or :class:`PayloadTooLarge`. A producer's
        ``traceparent`` (W3C) goes on the entry, so the run joins the producer's trace.
        ``data`` must be a JSON object: every step's message is one (a string or a list
        was accepted, then failed every delivery)."""
        if not isinstance(data, dict):
            raise InvalidInput([Reason(
                code="invalid_field", field="data",
                message=f"the run's input must be a JSON object, not {_json_kind(data)}")])
        if traceparent is not None and not valid_traceparent(traceparent):
            raise InvalidInput([Reason(
                code="invalid_traceparent", field="traceparent",
                message="a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>")])
        if event_type is None:
            if len(self.pipeline.ingress) != 1:
                raise InvalidInput([Reason(
                    code="missing_field", field="event_type",
                    message=f"the pipeline has several ingress types: "
                            f"{', '.join(self.pipeline.ingress)}")])
            event_type = self.pipeline.ingress[0]
        reasons = self.pipeline.input_reasons(event_type, data)
        field = self.pipeline.correlation_field
        if run_id is not None and not reasons:
            named = data.get(field) if isinstance(data, dict) else None
            if isinstance(named, str) and named and named != run_id:
                reasons = [Reason(code="invalid_field", field="run_id",
                                  message=f"{run_id!r} is not data.{field} ({named!r})")]
            else:
                reasons = self.pipeline.run_id_reasons(event_type, data, run_id)
        if reasons:
            raise InvalidInput(reasons)
        if run_id is None and isinstance(data, dict) and isinstance(data.get(field), str):
            run_id = data[field] or None
            # The id the data names holds to the rule of every run id (the ingress step
            # checked what else it asks of the field).
            problem = None if run_id is None else run_id_problem(run_id)
            if problem is not None:
                raise InvalidInput([Reason(code="invalid_field", field=field, message=problem)])
        if run_id is None and idempotency_key is not None and self.keys.partitioned:
            # A new run's submit record must be found by the next submit of the key: the
            # run is put in the partition of the key (docs/reference.md, Partitions).
            run_id = new_id_in(partition_of(idempotency_key, self.keys.partitions),
                               self.keys.partitions, lambda: new_id(self.codec.id_prefix))
        run_id = run_id or new_id(self.codec.id_prefix)
        try:
            fields = self.codec.new_fields(
                event_type, data, correlation_id=run_id, producer=self.producer,
                idempotency_key=idempotency_key,
                more={TRACEPARENT: traceparent} if traceparent else None)
        except (TypeError, ValueError) as exc:  # not JSON (a set, NaN): nothing written
            raise InvalidInput([Reason(code="invalid_field", field="data",
                                       message=f"not JSON: {exc}")]) from None
        if len(fields["data"]) > self.codec.payload_limit:
            raise PayloadTooLarge(
                f"data is {len(fields['data'])} bytes, limit {self.codec.payload_limit}")
        return event_type, run_id, fields["idempotency_key"], fields

    async def submit(
        self, data: Any, *, event_type: str | None = None, run_id: str | None = None,
        idempotency_key: str | None = None, traceparent: str | None = None,
        deadline: float | None = None, supersede: str | None = None,
    ) -> tuple[str, str]:
        """Publish one ingress entry at most once per idempotency key: ``(run id, entry
        id)``, those of the first submit of the key. ``deadline``: seconds from now after
        which the run is cancelled if still running (the pipeline's ``run_timeout`` when
        shorter); ``supersede``: the running run last submitted with this key is
        cancelled first (reference: Cancelling a run)."""
        if deadline is not None and not (isinstance(deadline, int | float)
                                         and not isinstance(deadline, bool)
                                         and 0 < deadline < float("inf")):
            raise InvalidInput([Reason(code="invalid_field", field="deadline",
                                       message="a positive number of seconds")])
        if supersede is not None and (not isinstance(supersede, str) or not supersede
                                      or len(supersede) > 256 or not supersede.isprintable()):
            raise InvalidInput([Reason(code="invalid_field", field="supersede",
                                       message="1 to 256 printable characters")])
        event_type, run, key, fields = self.prepare(
            data, event_type=event_type, run_id=run_id, idempotency_key=idempotency_key,
            traceparent=traceparent)
        if supersede is not None:
            held = self.keys.of(supersede).supersede(supersede)
            previous = await self.redis.getset(held, run)
            await self.redis.expire(held, SUBMIT_RECORD_TTL)
            if previous and previous != run:
                with contextlib.suppress(UnknownRun):
                    await self.cancel(previous, reason=SUPERSEDED, by=run)
        args: list[Any] = [run, SUBMIT_RECORD_TTL]
        for name, value in fields.items():
            args += (name, value)
        keys = self.keys.of(run)  # one slot: the run's partition
        reply = await self._submits.call(
            [keys.submitted(key), keys.stream(event_type), keys.run_start(run),
             keys.run_index(), keys.run_index(RUNNING)],
            args)
        run, _, entry_id = str(reply[1]).partition("\n")
        limits = [t for t in (deadline, self.pipeline.run_timeout) if t is not None]
        if limits and int(reply[0]) == 1:  # the first submit of the key: its run's deadline
            due = id_order(entry_id)[0] + int(min(limits) * 1000)
            await self.redis.zadd(keys.deadlines, {run: due}, nx=True)
        return run, entry_id

    async def cancel(self, run_id: str, *, reason: str = "", by: str | None = None) -> Cancelled:
        """Cancel ``run_id`` (:func:`~printery.runs.cancel.cancel_run`). Raises
        :class:`UnknownRun` for a run with no entry and none submitted."""
        return await cancel_run(self.redis, self.keys, self.pipeline, run_id, reason=reason,
                                by=by, scripts=self._scripts)

    async def deadline(self, run_id: str) -> float | None:
        """When ``run_id``'s deadline passes (epoch seconds), None without one (or once
        it has ended)."""
        due = await self.redis.zscore(self.keys.of(run_id).deadlines, run_id)
        return None if due is None else due / 1000

    async def close(self) -> None:
        """Close the submit channel's connection and end the live reads of followed runs
        (the reader uses the pooled client)."""
        await self._submits.close()
        await self.reader.close()

    async def entries(self, run_id: str) -> list[dict[str, Any]]:
        """Every entry of the run so far (after its outcome too). Raises
        :class:`UnknownRun` when there is none."""
        found, _ = await self.reader.history(run_id)
        if not found:
            raise UnknownRun(f"no entries of {self.pipeline.correlation_field} {run_id!r}")
        return found


def _json_kind(value: Any) -> str:
    """What JSON calls ``value``'s type, for a refusal's message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


class _SubmitBatcher:
    """Runs the submit script for many callers: submits made while one is on the wire
    go together in the next write (an ``EVALSHA`` each, packed in C), so a hundred
    submits in flight cost a few round trips instead of a hundred. One write on the wire
    at a time (the lock is fair); a caller whose submit went with another's write just
    takes its reply."""

    def __init__(self, redis: Redis, replicated: float = SUBMIT_WAIT) -> None:
        self._channel = DirectChannel(redis)
        #: Seconds each write waits for a replica (``WAIT``) when its master has one.
        self._replicated = replicated
        self._queue: list[tuple[tuple[list[str], list[Any]], asyncio.Future[Any]]] = []
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self._channel.close()

    async def call(self, keys: list[str], args: list[Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(((keys, args), future))
        async with self._lock:
            if not future.done():
                batch, self._queue = self._queue, []
                await self._flush(batch)
        return future.result()

    async def _flush(self, batch: list[tuple[tuple[list[str], list[Any]], asyncio.Future[Any]]]) -> None:
        try:
            unconfirmed = self._channel.unreplicated
            replies = await self._channel.scripts(SUBMIT_LUA, [call for call, _ in batch],
                                                  replicated=self._replicated)
            if self._channel.unreplicated > unconfirmed:
                log.warning("submits not confirmed by a replica in time: acknowledged, "
                            "on the master only", count=len(batch), wait_s=self._replicated)
        except BaseException as exc:
            # Every caller of the batch learns of it through its future (this one's too).
            fail_waiters((future for _, future in batch), exc, "submit")
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
