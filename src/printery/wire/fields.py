"""Field names of the entries the framework itself writes, in one place.

A ``dlq`` entry (docs/reference.md, Failures) is the original entry plus
:data:`DLQ_FIELDS`; a ``review`` entry (docs/reference.md, Escalation kinds; Review inbox)
carries :data:`REVIEW_FIELDS` beside the escalated ``data``; a ``review:decided`` entry
carries :data:`DECISION_FIELDS`. The workers that write them and the tools that read them
(``printery dlq``, ``review``, ``trace``) take the names from here, so they can never
spell one differently. Stream names are in :mod:`printery.wire.keys`; the envelope's own fields
in :mod:`printery.wire.envelope`.
"""

from __future__ import annotations

from collections.abc import Mapping

from printery.base._util import now_rfc3339

__all__ = [
    "BY",
    "DECIDED_AT",
    "DECISION",
    "DECISION_FIELDS",
    "DELIVERIES",
    "DLQ_FIELDS",
    "ERROR",
    "FAILED_AT",
    "ITEM",
    "ITEMS",
    "ITEM_FAILED",
    "ITEM_FIELDS",
    "KIND",
    "MAP",
    "NOTE",
    "ON_ITEM_FAILURE",
    "REASON",
    "REASON_CODE",
    "REJECT_TYPE",
    "REPLAYED_FROM",
    "REPLAY_FOR",
    "RESUME_TYPE",
    "REVIEW_FIELDS",
    "REVIEW_ID",
    "SOURCE_ID",
    "SOURCE_STREAM",
    "STEP",
    "TRACEBACK",
    "TRACEPARENT",
    "WORKER",
    "dlq_fields",
    "item_fields",
    "item_key",
    "review_fields",
]

# Where an entry came from: in `dlq` and `review` entries alike.
SOURCE_STREAM = "source_stream"
SOURCE_ID = "source_id"

# `dlq`: why and where an entry was dead-lettered.
ERROR = "error"
REASON_CODE = "reason_code"
WORKER = "worker"
DELIVERIES = "deliveries"
FAILED_AT = "failed_at"
#: Only when a handler raised: its traceback.
TRACEBACK = "traceback"
DLQ_FIELDS: tuple[str, ...] = (
    ERROR, REASON_CODE, WORKER, DELIVERIES, FAILED_AT, SOURCE_STREAM, SOURCE_ID, TRACEBACK,
)
#: Written by ``printery dlq replay`` on the entry it puts back: the dlq entry's id.
REPLAYED_FROM = "replayed_from"
#: Written by ``printery replay --from STEP`` on an entry whose stream other steps read
#: too: the steps (comma-separated) that re-run on it. Every other group acknowledges it
#: without calling its handler, so a sibling of STEP does not run again.
REPLAY_FOR = "replay_for"

#: On the second and later outputs of one handler call: the ``event_id`` of its first.
#: Every output carries the call's ``duration_ms`` and ``cost``; the sums count a call
#: once, by the outputs that carry no ``call_of``.
CALL_OF = "call_of"

#: On a loop's attempt entry whose ``work`` showed partials (its value: the attempt's
#: number): its verdict is published to the run's followers when it is judged, or its
#: draft retracted when a budget stops the run first, or when the entry that wrote it
#: did not commit (reference: streaming through the gate).
STREAMED = "streamed"

#: On every entry while tracing is on (docs/reference.md, Tracing): the W3C trace context
#: of the span that wrote it (or of a producer's span, given to a submit).
TRACEPARENT = "traceparent"

# A Map's item and result entries (reference: fan-out), beside ``data`` like ``attempt``:
# the Map's name, the item's 0-based index and the count, and what a failed item does
# (``fail`` or ``skip``), so that whoever dead-letters one (a worker, an operator's
# ``printery pending dlq``) knows without the pipeline what its failure means. A result
# written for a failed item carries ``item_failed`` (its reason code).
MAP = "map"
ITEM = "item"
ITEMS = "items"
ON_ITEM_FAILURE = "on_item_failure"
ITEM_FAILED = "item_failed"
#: The fields a Map's entries carry, in the order they are written.
ITEM_FIELDS: tuple[str, ...] = (MAP, ITEM, ITEMS, ON_ITEM_FAILURE)

# `review`: what escalated, in which step, and why; what a decision writes
# (docs/reference.md, Review inbox).
KIND = "kind"
STEP = "step"
REASON = "reason"
#: The event type an approval writes (the run resumes from there); empty: none.
RESUME_TYPE = "resume_type"
#: The event type a rejection writes; empty: the decision is only recorded.
REJECT_TYPE = "reject_type"
REVIEW_FIELDS: tuple[str, ...] = (
    KIND, STEP, REASON, SOURCE_STREAM, SOURCE_ID, RESUME_TYPE, REJECT_TYPE,
)

# `review:decided`: one decision on one review.
REVIEW_ID = "review_id"
DECISION = "decision"
BY = "by"
NOTE = "note"
DECIDED_AT = "decided_at"
DECISION_FIELDS: tuple[str, ...] = (REVIEW_ID, DECISION, BY, NOTE, DECIDED_AT)


def dlq_fields(
    *, error: str, reason_code: str, worker: str, deliveries: int, source_stream: str,
    source_id: str, traceback: str = "", failed_at: str | None = None,
) -> dict[str, str]:
    """The fields a worker adds to an entry it dead-letters: ``error`` cut at 2,000
    characters, so a huge message cannot bloat the stream; ``failed_at`` now unless
    given; ``traceback`` only when there is one."""
    fields = {
        ERROR: error[:2000], REASON_CODE: reason_code, WORKER: worker,
        DELIVERIES: str(deliveries), FAILED_AT: failed_at or now_rfc3339(),
        SOURCE_STREAM: source_stream, SOURCE_ID: source_id,
    }
    if traceback:
        fields[TRACEBACK] = traceback
    return fields


def review_fields(
    *, kind: str, step: str, reason: str, source_stream: str = "", source_id: str = "",
    resume_type: str = "", reject_type: str = "",
) -> dict[str, str]:
    """The fields of a ``review`` entry beside its ``data``; the source is empty when no
    one entry escalated (an aggregator's deadline), a decision's type empty when that
    decision writes nothing."""
    return {KIND: kind, STEP: step, REASON: reason,
            SOURCE_STREAM: source_stream, SOURCE_ID: source_id,
            RESUME_TYPE: resume_type, REJECT_TYPE: reject_type}


def item_fields(extra: Mapping[str, str]) -> dict[str, str]:
    """The Map fields among an entry's extra fields (empty: not a Map's entry): what every
    entry written for that item carries on, so its result and its dead letter find their
    Map, index and policy."""
    if MAP not in extra:
        return {}
    return {name: extra[name] for name in ITEM_FIELDS if name in extra}


def item_key(event_type: str, run: str, carried: Mapping[str, str]) -> str:
    """The idempotency key of an entry of ``event_type`` written for one item of a run:
    the run's items are not duplicates of each other (``<type>:<run>:<item>``; without
    Map fields ``<type>:<run>``, the default)."""
    item = carried.get(ITEM)
    return f"{event_type}:{run}" if item is None else f"{event_type}:{run}:{item}"

#: On what a step writes while it handles a run's ``run:cancelled`` or ``run:failed`` (and
#: on what is written from that, on down): compensation, which the stop of its run does
#: not stop (docs/reference.md, Cancelling a run). Its value is the run id.
COMPENSATES = "compensates"
