"""The review inbox of any pipeline (docs/reference.md, Escalation kinds; Review inbox):
list, show and decide escalations.

These are the functions behind ``printery review``, the HTTP API's ``/v1/reviews`` and
the service's review deadlines: each takes a connected client, the :class:`StreamKeys`
and the :class:`Pipeline`, returns JSON-able dicts and raises a
:class:`~printery.base.errors.ReviewError` subclass the caller maps to its own answer.

A decision writes its outputs (what the kind's hook returns: by default the review's
``resume_type`` or ``reject_type`` entry), the ``review:decided`` record and the deletion
of the ``review`` entry in one MULTI/EXEC under WATCH of the review stream: a review is
decided once, and two reviewers (or a reviewer and a deadline, or several service
processes) deciding at once cannot both win. Under WATCH of the run's index entry too
when the decision writes anything: a run that has ended gets nothing more (a run gets
one outcome), the decision is recorded as having changed nothing and the caller told
(:class:`~printery.base.errors.ReviewRunEnded`). An entry of ``review`` that is no review
request (:func:`is_review_request`: junk ``XADD``ed there) is neither listed nor decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from printery.base import _json
from printery.base._util import now_rfc3339, stream_id_ms
from printery.base.errors import (
    BlobMissing,
    ReviewError,
    ReviewInvalid,
    ReviewNotFound,
    ReviewRunEnded,
)
from printery.observe.logging import get_logger
from printery.pipeline.dag import Pipeline, run_id_problem
from printery.pipeline.review_kinds import APPROVED, REJECTED, ReviewCase, ReviewKind
from printery.pipeline.step import validation_reasons
from printery.runs.history import id_order
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_index import RunIndex
from printery.store import Redis, WatchConflict
from printery.store.inbox import decide_review
from printery.store.scan import read_entry, read_page, scan_stream
from printery.store.servers import server_ms
from printery.wire.envelope import correlation_of
from printery.wire.fields import (
    BY,
    DECIDED_AT,
    DECISION,
    KIND,
    NOTE,
    REASON,
    REASON_CODE,
    REJECT_TYPE,
    RESUME_TYPE,
    REVIEW_ID,
    SOURCE_ID,
    SOURCE_STREAM,
    STEP,
    TRACEPARENT,
)
from printery.wire.keys import REVIEW_DECIDED, StreamKeys

__all__ = [
    "DEFAULT_PRODUCER",
    "REVIEW_PAGE",
    "RUN_ENDED",
    "TIMEOUT_BY",
    "approve",
    "decide",
    "expire_reviews",
    "get_review",
    "is_review_request",
    "list_reviews",
    "reject",
    "sweep_interval",
]

log = get_logger("printery.reviews")

#: The ``producer`` of what a decision writes, unless the caller names itself.
DEFAULT_PRODUCER = "printery-review"
#: The ``by`` of a rejection made by a kind's deadline (``[review.<kind>] timeout``).
TIMEOUT_BY = "timeout"
_CHUNK = 200
#: Reviews a listing returns unless told otherwise: a page, never the whole stream.
REVIEW_PAGE = 500
#: The ``reason_code`` of a decision that changed nothing: its run had ended.
RUN_ENDED = "run_ended"


# -- reading ----------------------------------------------------------------------------------


async def list_reviews(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, *,
    limit: int | None = REVIEW_PAGE, after: str = "",
) -> list[dict[str, Any]]:
    """Open reviews of every partition, oldest first, as :func:`get_review` shows them
    (ids ``<id>@p<k>`` with several partitions): at most ``limit`` (None: every one),
    those after the review ``after`` (an id as listed; "" from the oldest). A page's
    last id is where the next starts: each partition's stream is read from there, at
    most ``limit`` entries, never whole. Raises :class:`ReviewInvalid` for an ``after``
    that is no review id."""
    if limit is not None and limit < 1:
        raise ReviewInvalid(f"limit must be at least 1, not {limit}")
    start, start_part = _cursor(keys, after)
    found = []
    for k, part in enumerate(keys.each()):
        low = "-" if not after else start if k > start_part else f"({start}"
        read = await _requests(client, part.review, low, limit, pipeline.correlation_field)
        found += [(id_order(entry_id), k, part, entry_id, fields) for entry_id, fields in read]
    found.sort(key=lambda row: row[:2])
    return [await _view(client, part, pipeline, part.entry_ref(entry_id), fields)
            for _, _, part, entry_id, fields in found[:limit]]


def is_review_request(fields: Mapping[str, str], correlation_field: str) -> bool:
    """Whether an entry of ``review`` asks for a decision: it names its ``kind`` and its
    run (by the rule of every run id). Anything else written there (a raw ``XADD`` of
    junk) is no review: never listed, never decided."""
    kind = fields.get(KIND, "")
    run_id = correlation_of(fields, correlation_field) or ""
    return bool(kind.strip()) and kind.isprintable() and run_id_problem(run_id) is None


async def _requests(
    client: Redis, stream: str, low: str, limit: int | None, correlation_field: str
) -> list[tuple[str, dict[str, str]]]:
    """At most ``limit`` review requests of ``stream`` from ``low`` (what is no review
    request skipped: read on, a page at a time, so a page is full when more follow)."""
    found: list[tuple[str, dict[str, str]]] = []
    while True:
        read = await read_page(client, stream, low, limit)
        found += [(entry_id, fields) for entry_id, fields in read
                  if is_review_request(fields, correlation_field)]
        if limit is None or len(read) < limit or len(found) >= limit:
            return found[:limit]
        low = f"({read[-1][0]}"


def _cursor(keys: StreamKeys, after: str) -> tuple[str, int]:
    """Where a page after review ``after`` starts: its stream entry id and partition
    (a bare id with several partitions: after that id in every one)."""
    if not after:
        return "", keys.partitions
    parts, entry_id = keys.resolve_ref(after)
    if id_order(entry_id) == (0, 0) or max(id_order(entry_id)) >= 1 << 64:  # no entry id
        raise ReviewInvalid(f"after must be a review id as listed, not {after!r}")
    return entry_id, (parts[0].partition or 0) if len(parts) == 1 else keys.partitions


async def _locate(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str
) -> tuple[StreamKeys, str, dict[str, str]]:
    """The partition of the open review ``review_id`` (as listed), its stream entry id
    and fields; raises :class:`ReviewNotFound` (for an entry that is no review request
    too)."""
    parts, entry_id = keys.resolve_ref(review_id)
    for part in parts:
        fields = await read_entry(client, part.review, entry_id)
        if fields is not None and is_review_request(fields, pipeline.correlation_field):
            return part, entry_id, fields
    raise ReviewNotFound(review_id)


async def get_review(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str
) -> dict[str, Any]:
    """One open review: ``id``, ``kind``, ``step``, the correlation field, ``reason``,
    ``resume_type``, ``reject_type``, ``source_stream``, ``source_id``, ``produced_at``,
    ``accepts_data`` and the escalated ``data``. Raises :class:`ReviewNotFound`."""
    part, entry_id, fields = await _locate(client, keys, pipeline, review_id)
    return await _view(client, part, pipeline, part.entry_ref(entry_id), fields)


async def _view(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str,
    fields: Mapping[str, str],
) -> dict[str, Any]:
    kind = fields.get(KIND, "")
    return {
        "id": review_id, KIND: kind, STEP: fields.get(STEP, ""),
        pipeline.correlation_field: correlation_of(fields, pipeline.correlation_field) or "",
        REASON: fields.get(REASON, ""), RESUME_TYPE: fields.get(RESUME_TYPE, ""),
        REJECT_TYPE: fields.get(REJECT_TYPE, ""), SOURCE_STREAM: fields.get(SOURCE_STREAM, ""),
        SOURCE_ID: fields.get(SOURCE_ID, ""), "produced_at": fields.get("produced_at", ""),
        "accepts_data": pipeline.kind_of_review(kind).accepts_data,
        "data": await _data(client, keys, fields),
    }


async def _data(client: Redis, keys: StreamKeys, fields: Mapping[str, str]) -> Any:
    """The escalated data, resolved when it travelled by reference; as stored when it
    cannot be decoded (a decision must still be possible)."""
    raw = fields.get("data", "null")
    try:
        return await PayloadStore(client, keys).resolved(_json.loads(raw))
    except (ValueError, BlobMissing):
        return raw


# -- deciding ---------------------------------------------------------------------------------


async def approve(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str, *,
    by: str, note: str = "", data: Any = None, producer: str = DEFAULT_PRODUCER,
) -> dict[str, Any]:
    """Approve: by default the review's ``resume_type`` is written with ``data`` (None:
    the escalated data) and the run goes on from there. See :func:`decide`."""
    return await decide(client, keys, pipeline, review_id, APPROVED, by=by, note=note,
                        data=data, producer=producer)


async def reject(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str, *,
    by: str, note: str = "", producer: str = DEFAULT_PRODUCER,
) -> dict[str, Any]:
    """Reject: by default the review's ``reject_type`` is written, status ``rejected``
    with reason ``rejected_by_reviewer``. See :func:`decide`."""
    return await decide(client, keys, pipeline, review_id, REJECTED, by=by, note=note,
                        producer=producer)


async def decide(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, review_id: str,
    decision: str, *, by: str, note: str = "", data: Any = None,
    producer: str = DEFAULT_PRODUCER,
) -> dict[str, Any]:
    """Make one decision (``approved`` or ``rejected``) and return its record:
    ``review_id``, ``kind``, the correlation field, ``decision``, ``by``, ``note``,
    ``decided_at``, ``outputs`` (the event types written), ``detail`` and what the kind's
    hook adds.

    Raises :class:`ReviewNotFound` (unknown or already decided, also when another
    decision won meanwhile, or an entry of ``review`` that is no review request),
    :class:`~printery.base.errors.ReviewRunEnded` (the run had ended, so a decision that
    writes anything changes nothing: it is recorded without outputs, the review closed),
    :class:`ReviewInvalid` (an empty ``by``; ``data`` on a rejection, on a kind that
    takes none, or refused by the resumed step's input model),
    :class:`~printery.base.errors.ReviewRefused` (this ``by`` may not decide it),
    :class:`~printery.base.errors.ReviewActionFailed` (the kind's action failed; the review
    stays open), :class:`ReviewError` (too much concurrent change). Nothing is written
    when any is raised (but the record of a :class:`~printery.base.errors.ReviewRunEnded`).
    """
    if decision not in (APPROVED, REJECTED):
        raise ValueError(f"decision must be {APPROVED!r} or {REJECTED!r}, not {decision!r}")
    if not by.strip():
        raise ReviewInvalid("a decision needs a reviewer (`by`)")
    # The review's partition is its run's: the decision's writes stay in it (one slot).
    keys, entry_id, fields = await _locate(client, keys, pipeline, review_id)
    review_id = keys.entry_ref(entry_id)
    kind = pipeline.kind_of_review(fields.get(KIND, ""))
    field = pipeline.correlation_field
    cid = correlation_of(fields, field) or ""
    if data is not None:
        _check_edited(pipeline, kind, decision, fields.get(RESUME_TYPE, ""), data)
    case = ReviewCase(
        review_id=review_id, kind=kind.name, decision=decision, by=by, note=note,
        correlation_field=field, correlation_id=cid, data=await _data(client, keys, fields),
        edited=data, resume_type=fields.get(RESUME_TYPE, ""),
        reject_type=fields.get(REJECT_TYPE, ""), fields=fields, keys=keys,
    )
    outcome = await kind.hook(decision)(case)
    codec = pipeline.codec()
    # What resumes keeps the run's replay mark and its trace (the escalating step's span).
    carried = {k: fields[k] for k in ("replay_of", TRACEPARENT) if fields.get(k)}
    outputs = [
        (keys.stream(out.type), codec.new_fields(
            out.type, out.data, correlation_id=out.correlation_id or cid, producer=producer,
            idempotency_key=out.idempotency_key, extra=carried, more=out.extra))
        for out in outcome.outputs
    ]
    decided_at = now_rfc3339()
    record: dict[str, Any] = {REVIEW_ID: review_id, KIND: kind.name, field: cid,
                              DECISION: decision, BY: by, NOTE: note, DECIDED_AT: decided_at,
                              "outputs": [out.type for out in outcome.outputs]}
    decided = codec.new_fields(
        REVIEW_DECIDED, record, correlation_id=cid, producer=producer,
        idempotency_key=f"{REVIEW_DECIDED}:{review_id}",
        extra={REVIEW_ID: review_id, DECISION: decision, BY: by, NOTE: note,
               DECIDED_AT: decided_at},
    )
    # An output may be the run's outcome (a rejection's type often is): index it too.
    indexed = RunIndex(keys, outcomes=pipeline.outcomes).commit_writes(keys.review, cid, outputs)
    # A decision that writes to a run that has ended would change nothing: it is recorded
    # as such (no outputs) and the review closed, in the transaction fenced on the run.
    moot = None
    if cid and (outputs or outcome.commands):
        moot = codec.new_fields(
            REVIEW_DECIDED, {**record, "outputs": [], REASON_CODE: RUN_ENDED},
            correlation_id=cid, producer=producer, idempotency_key=f"{REVIEW_DECIDED}:{review_id}",
            extra={REVIEW_ID: review_id, DECISION: decision, BY: by, NOTE: note,
                   DECIDED_AT: decided_at})
    ended = await _commit(client, keys, entry_id, decided, outputs, (*outcome.commands, *indexed),
                          run_info=keys.run_info(cid) if moot else "", moot=moot)
    if ended:
        raise ReviewRunEnded(review_id, cid, ended)
    return {**record, **outcome.result, "detail": outcome.detail}


def _check_edited(
    pipeline: Pipeline, kind: ReviewKind, decision: str, resume_type: str, data: Any
) -> None:
    """Edited data only on an approval of a kind that takes it, within the payload
    limit, and acceptable to every step that consumes the type it resumes with."""
    if decision != APPROVED:
        raise ReviewInvalid("only an approval takes edited data")
    if not kind.accepts_data:
        raise ReviewInvalid(f"a review of kind {kind.name!r} takes no edited data")
    limit = pipeline.codec().payload_limit
    if len(_json.dumps(data)) > limit:
        raise ReviewInvalid(f"the edited data is larger than the payload limit ({limit} bytes)")
    for step in pipeline.steps.values():
        if resume_type in step.consumes and step.input_model is not None:
            try:
                step.input_model.model_validate(data)
            except ValidationError as exc:
                reasons = [r.as_dict() for r in validation_reasons(exc)]
                raise ReviewInvalid(f"step {step.name} refuses the edited data", reasons) from None


async def _commit(
    client: Redis, keys: StreamKeys, review_id: str, decided: dict[str, str],
    outputs: list[tuple[str, dict[str, str]]], commands: Sequence[tuple[Any, ...]] = (),
    *, run_info: str = "", moot: dict[str, str] | None = None,
) -> str:
    """Write the decision; the run's status when it had ended (``moot`` written instead),
    else ""."""
    try:
        written = await decide_review(client, keys, review_id, decided, outputs, commands,
                                      run_info=run_info, moot=moot)
    except WatchConflict:
        raise ReviewError(f"review {review_id}: too much concurrent change, try again") from None
    if not written.found:
        raise ReviewNotFound(review_id)
    return written.run_ended


# -- deadlines --------------------------------------------------------------------------------


async def expire_reviews(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, timeouts: Mapping[str, float],
    *, producer: str = DEFAULT_PRODUCER,
) -> list[dict[str, Any]]:
    """Reject, with ``by`` = ``timeout``, every open review older (by its entry id, the
    server's clock) than its kind's timeout in seconds; the decisions made. A review
    decided meanwhile (by a person or another process's sweep) is skipped; one whose
    kind's hook fails stays open and is logged, to be tried again next sweep."""
    if not timeouts:
        return []
    now_ms = await server_ms(client)
    newest = now_ms - int(min(timeouts.values()) * 1000)
    made: list[dict[str, Any]] = []
    for part in keys.each():
        made += await _expire_partition(client, part, pipeline, timeouts, now_ms, newest,
                                        producer)
    return made


async def _expire_partition(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, timeouts: Mapping[str, float],
    now_ms: int, newest: int, producer: str,
) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = []
    async for entry_id, fields in scan_stream(client, keys.review, "-", str(max(newest, 0)),
                                              chunk=_CHUNK):
        timeout = timeouts.get(fields.get(KIND, ""))
        if timeout is None or stream_id_ms(entry_id) + timeout * 1000 > now_ms:
            continue
        note = f"undecided after {timeout:g} s"
        try:
            made.append(await reject(client, keys, pipeline, keys.entry_ref(entry_id),
                                     by=TIMEOUT_BY, note=note, producer=producer))
        except ReviewNotFound:
            continue
        except ReviewRunEnded as exc:  # closed: its run had ended meanwhile
            log.info("review deadline: the run had ended", review_id=entry_id,
                     run_id=exc.run_id, status=exc.status)
            continue
        except ReviewError as exc:
            log.warning("review deadline: could not reject", review_id=entry_id,
                        error=str(exc))
    return made


def sweep_interval(timeouts: Mapping[str, float]) -> float:
    """Seconds between deadline sweeps: a quarter of the shortest timeout, between 50 ms
    and 5 s, so a review is rejected at most about that late."""
    return min(5.0, max(0.05, min(timeouts.values()) / 4)) if timeouts else 5.0
