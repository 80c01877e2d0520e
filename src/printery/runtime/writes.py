"""What a step writes: the entries for a handler call's outputs (in the one wire format,
:meth:`~printery.wire.envelope.Codec.new_fields`), large ``data`` moved to blobs, and the
dead letter of an entry that cannot be handled (its ``dlq`` entry and its run's
``run:failed``). The entry pipeline
(:mod:`printery.runtime.consume`) decides when; this module says what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from printery.base import _json
from printery.base.errors import PayloadTooLarge
from printery.runtime.handler import Message, Output
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_index import RunIndex, committed
from printery.transport.commit import Append
from printery.transport.dead_letter import DeadLetterWrite
from printery.wire.envelope import Codec, correlation_of, run_id_problem
from printery.wire.fields import (
    CALL_OF,
    COMPENSATES,
    ITEM,
    ITEM_FAILED,
    ITEM_FIELDS,
    MAP,
    ON_ITEM_FAILURE,
    TRACEPARENT,
    dlq_fields,
    item_key,
)
from printery.wire.keys import RUN_CANCELLED, RUN_FAILED, StreamKeys, result_type


class Writes:
    """The entries one step (``worker``) writes."""

    def __init__(self, worker: str, *, codec: Codec, keys: StreamKeys, payloads: PayloadStore) -> None:
        self.worker = worker
        self.codec = codec
        self.keys = keys
        self.payloads = payloads
        #: Each output type's stream key, made once (every handler call writes some).
        self._streams: dict[str, str] = {}

    def appends(
        self, outputs: Sequence[Output], message: Message | None, seconds: float,
        correlation_id: str = "", *, traceparent: str | None = None,
    ) -> list[Append]:
        """The entries to write for ``outputs`` of a handler call (``message`` None: of
        no entry), each carrying the call's duration, cost and ``replay_of``, and a
        ``traceparent``: the one given (the call's span, :mod:`printery.runtime.spans`;
        "" for none), else the input's, so what an entry writes without a handler call
        (a budget's hold) stays in its run's trace. A ``data`` over the inline limit still
        needs :meth:`store_large` before the commit."""
        extra = {"duration_ms": f"{seconds * 1000:.3f}"}
        if traceparent is None and message is not None:
            traceparent = message.envelope.extra.get(TRACEPARENT)
        if traceparent:
            extra[TRACEPARENT] = traceparent
        if message is not None:
            correlation_id = message.correlation_id
            if message.costs:
                extra["cost"] = _json.dumps(message.costs)
            replay_of = message.envelope.extra.get("replay_of")
            if replay_of:
                extra["replay_of"] = replay_of
            if is_compensation(message):
                extra[COMPENSATES] = correlation_id
        appends: list[Append] = []
        for out in outputs:
            fields = self.codec.new_fields(
                out.type, out.data, correlation_id=out.correlation_id or correlation_id,
                producer=self.worker, idempotency_key=out.idempotency_key, extra=extra,
                more=out.extra,
            )
            if not appends and len(outputs) > 1:  # the later outputs name the first
                extra = {**extra, CALL_OF: fields["event_id"]}
            once = self.keys.once(out.once) if out.once else ""
            stream = self._streams.get(out.type)
            if stream is None:
                stream = self._streams[out.type] = self.keys.stream(out.type)
            appends.append(Append(stream, fields, once))
        return appends

    def has_large(self, appends: list[Append]) -> bool:
        limit = self.payloads.inline_limit
        for append in appends:  # noqa: SIM110 - a loop, not any(): once per handler call
            if len(append.fields["data"]) > limit:
                return True
        return False

    async def store_large(self, appends: list[Append]) -> list[Append]:
        """``appends`` with every ``data`` over the inline limit moved to a blob
        (docs/reference.md, Streams and entries) and replaced by its reference. Raises
        :class:`PayloadTooLarge` for a ``data`` over the payload limit: every step reading
        it would dead-letter it, so the step that made it fails instead."""
        stored = []
        for append in appends:
            data = append.fields["data"]
            if len(data) > self.payloads.limit:
                raise PayloadTooLarge(f"{self.worker}'s output {append.fields.get('type', '')} "
                                      f"is {len(data)} bytes, over the payload limit of "
                                      f"{self.payloads.limit}")
            if len(data) > self.payloads.inline_limit:
                append = append._replace(fields={**append.fields, "data": await self.payloads.store(data)})
            stored.append(append)
        return stored

    def dead_letter(
        self, stream: str, entry_id: str, consumer: str, fields: Mapping[str, str], *,
        reason_code: str, error: str, deliveries: int, traceback: str = "",
        index: RunIndex | None = None,
    ) -> DeadLetterWrite:
        """What dead-lettering an entry of ``stream`` held by ``consumer`` writes."""
        return dead_letter_write(
            self.keys, self.codec, group=self.worker, stream=stream, entry_id=entry_id,
            consumer=consumer, fields=fields, reason_code=reason_code, error=error,
            deliveries=deliveries, traceback=traceback, index=index)


def dead_letter_write(
    keys: StreamKeys, codec: Codec, *, group: str, stream: str, entry_id: str, consumer: str,
    fields: Mapping[str, str], reason_code: str, error: str, deliveries: int,
    traceback: str = "", index: RunIndex | None = None,
) -> DeadLetterWrite:
    """What dead-lettering the entry ``entry_id`` of ``stream`` (under ``keys``, its
    partition's), held by ``consumer`` of ``group`` ("": by whoever holds it), writes:
    the ``dlq`` entry (its original fields and why) and, when the entry names a run (an
    id that breaks the rule of run ids names none: ``invalid_run_id``), that run's
    ``run:failed`` outcome (reference: failures) with the run index's writes for it
    (``index``; None: no index is kept). Written by
    :func:`~printery.transport.dead_letter.write_dead_letter`."""
    entry = {**fields, **dlq_fields(
        error=error, reason_code=reason_code, worker=group, deliveries=deliveries,
        source_stream=stream, source_id=entry_id, traceback=traceback,
    )}
    entry.setdefault("type", keys.event_type(stream))
    last_error = keys.last_error(group, stream, entry_id)
    run = correlation_of(fields, codec.correlation_field)
    if not run or run_id_problem(run) is not None:  # no run id (``invalid_run_id``): no run
        return DeadLetterWrite(stream, group, consumer, entry_id, keys.dlq, entry,
                               last_error=last_error)
    # What the entry reserved of its run's budget (a step's estimate=), if anything.
    reserved, reservation = keys.reserved(run), fields.get("idempotency_key", "")
    said: dict[str, object] = {"status": "failed", "step": group, "reason_code": reason_code,
                               "error": error[:2000]}
    item = _item_of(fields)
    if item is not None:
        said["item"] = item
    body = _json.dumps(said)
    before, after = body[:-1] + ',"dlq_id":"', '"}'
    extra = {}
    if TRACEPARENT in fields:
        extra[TRACEPARENT] = fields[TRACEPARENT]
    if fields.get("replay_of"):
        extra["replay_of"] = fields["replay_of"]
    if item is not None and fields.get(ON_ITEM_FAILURE) == "skip":
        # A skipped item ends nothing: its Map's collector learns of it from a result
        # written in the dead letter's own script (atomic with it), counted as failed.
        result = result_type(fields[MAP])
        marker = codec.new_fields(
            result, None, correlation_id=run, producer=group,
            idempotency_key=item_key(result, run, fields),
            extra={**extra, **{k: fields[k] for k in ITEM_FIELDS if k in fields},
                   ITEM_FAILED: reason_code})
        return DeadLetterWrite(
            stream, group, consumer, entry_id, keys.dlq, entry, outcome=keys.stream(result),
            outcome_fields={**marker, "data": ""}, data_before=before, data_after=after,
            run_info=keys.run_info(run), last_error=last_error, ends_run=False,
            reserved=reserved, reservation=reservation)
    outcome = codec.new_fields(RUN_FAILED, None, correlation_id=run, producer=group,
                               idempotency_key=f"{RUN_FAILED}:{run}:{group}:{stream}:{entry_id}",
                               extra=extra)
    outcome_stream = keys.stream(RUN_FAILED)
    writes = None
    if index is not None:
        mark = index.mark(stream, run, [(outcome_stream, {**outcome, "data": before + after})])
        writes = committed(index, [mark._replace(dead_letter=True)]) if mark is not None else None
    return DeadLetterWrite(
        stream, group, consumer, entry_id, keys.dlq, entry, outcome=outcome_stream,
        outcome_fields={**outcome, "data": ""}, data_before=before, data_after=after,
        run_info=keys.run_info(run), index=writes, last_error=last_error, reserved=reserved,
        reservation=reservation)


def _item_of(fields: Mapping[str, str]) -> int | None:
    """The index of the Map item whose handling an entry is (reference: fan-out), or None:
    also for the item's result, whose failure is the collector's (a merge that raises),
    not the item's."""
    name = fields.get(MAP)
    if not name or fields.get("type") == result_type(name):
        return None
    try:
        return int(fields.get(ITEM, ""))
    except ValueError:
        return None


def is_compensation(message: Message) -> bool:
    """Whether ``message`` is compensation of its run, which a stop of the run does not
    stop: its ``run:cancelled`` or ``run:failed``, or what was written from one."""
    return (message.envelope.type in (RUN_CANCELLED, RUN_FAILED)
            or COMPENSATES in message.envelope.extra)
