"""The ``budget_exceeded`` review kind (reference: budgets, failures): what a decision on
a run held over a ``review`` budget does.

An approval raises the limit once and, in the decision's transaction, puts every held
entry back on its source stream (:data:`RELEASE`), typed as it was (a loop's attempt
goes back to ``<loop>:loop`` as ``<loop>:attempt``), for its step alone; it frees the
guard, so a later breach of the raised limit asks again. A rejection writes
``budget:exceeded`` and keeps the guard taken while the run's budget lives: the entries
held after it wait for nothing, as they would with ``stop``. The limits themselves and
the names of what a breach writes are :mod:`printery.rules.budgets`.
"""

from __future__ import annotations

from typing import Any

from printery.base import _json
from printery.base.errors import ReviewActionFailed
from printery.pipeline.review_kinds import (
    REJECTED_BY_REVIEWER,
    ReviewCase,
    ReviewKind,
    ReviewOutcome,
)
from printery.rules.budgets import (
    BUDGET_EXCEEDED,
    BUDGET_FIELD,
    BUDGET_LIMIT,
    BUDGET_RAISE,
    BUDGET_REVIEW_KIND,
    BUDGET_SPENT,
    BUDGET_UNIT,
    HELD_FROM,
    HELD_IN,
    HELD_KEY,
    exceeded_data,
    held_type,
    review_guard,
)
from printery.runtime import partials
from printery.runtime.handler import Output
from printery.transport.commit import encode_amount
from printery.transport.scripts import script
from printery.wire.fields import REPLAY_FOR, SOURCE_STREAM, STEP
from printery.wire.keys import raise_field

__all__ = ["REJECT", "REJECTED_KEEP_MS", "RELEASE", "budget_review_kind"]

#: Milliseconds a rejected run's held entries and review guard are kept when its budget
#: hash has no expiry to go by (the default idempotency record ttl).
REJECTED_KEEP_MS = 7 * 86400 * 1000

#: An approval's release (``budget_release.lua``, in the decision's MULTI) and a
#: rejection's hold (``budget_reject.lua``).
RELEASE, REJECT = script("budget_release"), script("budget_reject")


# -- the review kind --------------------------------------------------------------------------


def budget_review_kind() -> ReviewKind:
    """The ``budget_exceeded`` kind: an approval raises the run's limit by its original
    amount and puts every entry the run's breach held back on its source stream, for its
    step alone, both in the decision's transaction; a rejection writes
    ``budget:exceeded``. Approvals take no edited data."""

    async def approve(case: ReviewCase) -> ReviewOutcome:
        fields = case.fields
        raise_by = float(fields.get(BUDGET_RAISE, "0") or 0)
        if case.keys is None:
            raise ReviewActionFailed("a budget review is decided with the stream keys")
        keys, run, field = case.keys, case.correlation_id, fields.get(BUDGET_FIELD, "")
        commands: list[tuple[Any, ...]] = [
            ("HINCRBY", keys.budget(run), raise_field(field), encode_amount(raise_by))]
        held_in = fields.get(HELD_IN)
        if held_in is None:  # a review of an earlier version: it held the entry it shows
            return ReviewOutcome([_held_copy(case)], detail=f"limit raised by {raise_by:g}",
                                 commands=commands)
        commands += [RELEASE.command([held_in], [HELD_FROM]),
                     ("DEL", keys.once(review_guard(run, field)))]
        return ReviewOutcome(
            detail=f"limit raised by {raise_by:g}; the entries the run held run again",
            commands=commands)

    async def reject(case: ReviewCase) -> ReviewOutcome:
        fields = case.fields
        data = {**exceeded_data(fields.get(BUDGET_UNIT, ""),
                                float(fields.get(BUDGET_LIMIT, "0") or 0),
                                float(fields.get(BUDGET_SPENT, "0") or 0)),
                case.correlation_field: case.correlation_id,
                "reasons": [{"code": REJECTED_BY_REVIEWER, "field": "", "message": case.note}]}
        commands: list[tuple[Any, ...]] = []
        if case.keys is not None:
            keys, run = case.keys, case.correlation_id
            # A held loop attempt that streamed is retracted: it will never be judged.
            retracted = [{"code": "budget_exceeded", "field": "",
                          "message": "the run's budget review was rejected"
                                     + (f": {case.note}" if case.note else "")}]
            commands.append(REJECT.command(
                [keys.stream(held_type(run)),
                 keys.once(review_guard(run, fields.get(BUDGET_FIELD, ""))), keys.budget(run),
                 keys.partials(run)],
                [REJECTED_KEEP_MS, _json.dumps(retracted), partials.MAXLEN, partials.TTL_S]))
        return ReviewOutcome([Output(
            BUDGET_EXCEEDED, data, correlation_id=case.correlation_id,
            idempotency_key=f"{BUDGET_EXCEEDED}:{case.correlation_id}",
        )], commands=commands)

    return ReviewKind(BUDGET_REVIEW_KIND, approve, reject, accepts_data=False)


def _held_copy(case: ReviewCase) -> Output:
    """The entry a review written before held streams shows, back on its source stream
    with its own type (a loop's attempt is an entry of ``<loop>:loop``), for its step."""
    assert case.keys is not None
    fields = case.fields
    source = case.keys.event_type(fields.get(SOURCE_STREAM, "")) or case.resume_type
    return Output(
        source, case.data, correlation_id=case.correlation_id,
        idempotency_key=f"{fields.get(HELD_KEY, case.resume_type)}:budget:{case.review_id}",
        extra={"type": case.resume_type, REPLAY_FOR: fields.get(STEP, "")},
    )
