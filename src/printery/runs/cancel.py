"""Cancelling a run (docs/reference.md, Cancelling a run): one script writes the run's
outcome ``run:cancelled`` with its mark (its info hash says ``cancelled``; it joins the
partition's ``stopped`` runs), so of any number of concurrent cancels exactly one ends
the run. What the run still had going is stopped by the workers, not here: its entries
are settled where they are admitted, its running calls cancelled, and no commit writes
an output of it (the ``stops`` policy and the commit's check). Here, after the mark:
its open reviews are decided ``cancelled`` (the inbox is the canceller's to close: no
worker holds them).

Deadlines and supersedes cancel through the same script (``by`` ``deadline``, or the new
run's id), so each also ends a run once, whichever process gets there first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from printery.base._util import now_rfc3339
from printery.base.errors import UnknownRun
from printery.observe.logging import get_logger
from printery.pipeline.dag import Pipeline
from printery.runtime.run_index import RUNNING
from printery.store import Redis, WatchConflict
from printery.store.inbox import decide_review
from printery.store.scan import scan_stream
from printery.transport.scripts import Scripts, script
from printery.wire.envelope import correlation_of
from printery.wire.fields import BY, DECIDED_AT, DECISION, KIND, NOTE, REVIEW_ID
from printery.wire.keys import REVIEW_DECIDED, RUN_CANCELLED, StreamKeys

__all__ = [
    "CANCELLED",
    "DEADLINE_BY",
    "DEADLINE_EXCEEDED",
    "SUPERSEDED",
    "Cancelled",
    "cancel_due",
    "cancel_run",
]

CANCEL = script("cancel")
#: The status of a cancelled run, and the ``decision`` of its reviews.
CANCELLED = "cancelled"
#: ``reason`` and ``by`` of a run cancelled at its deadline.
DEADLINE_EXCEEDED = "deadline_exceeded"
DEADLINE_BY = "deadline"
#: ``reason`` of a run cancelled by a newer submit with its ``supersede`` key.
SUPERSEDED = "superseded"
#: Who wrote a ``run:cancelled`` entry (its ``producer``).
PRODUCER = "printery-cancel"
#: How long a stopped run's mark is kept (ms): a week, the longest a record lives.
STOP_KEPT_MS = 7 * 86400 * 1000

log = get_logger("printery.cancel")


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did: ``cancelled`` True when this call ended the run (``status``
    ``cancelled``), False when it had ended already (``status`` its status)."""

    run_id: str
    cancelled: bool
    status: str

    def as_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "cancelled": self.cancelled, "status": self.status}


async def cancel_run(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, run_id: str, *, reason: str = "",
    by: str | None = None, scripts: Scripts | None = None,
) -> Cancelled:
    """Cancel ``run_id``. Raises :class:`UnknownRun` for a run with no entry and none
    submitted."""
    part = keys.of(run_id)
    codec = pipeline.codec()
    data = {"status": CANCELLED, "reason": reason, "by": by}
    fields = codec.new_fields(RUN_CANCELLED, data, correlation_id=run_id, producer=PRODUCER,
                              idempotency_key=f"{RUN_CANCELLED}:{run_id}")
    args: list[object] = [run_id, STOP_KEPT_MS]
    for name, value in fields.items():
        args += (name, value)
    reply = await (scripts or Scripts(client)).call(CANCEL, [
        part.run_info(run_id), part.run_start(run_id), part.stream(RUN_CANCELLED), part.stopped,
        part.run_index(), part.run_index(RUNNING), part.run_index(CANCELLED), part.run_statuses,
        part.reserved(run_id), part.deadlines], args)
    done, said = int(reply[0]), str(reply[1])
    if done < 0:
        raise UnknownRun(f"no entries of {pipeline.correlation_field} {run_id!r}")
    if not done:
        return Cancelled(run_id, False, said or RUNNING)
    await cancel_reviews(client, part, pipeline, run_id, by=by or "", reason=reason)
    return Cancelled(run_id, True, CANCELLED)


async def cancel_due(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, now_ms: int,
    scripts: Scripts | None = None,
) -> list[str]:
    """Cancel the runs of partition ``keys`` whose deadline passed by ``now_ms`` (the
    server's clock): ``reason`` ``deadline_exceeded``, ``by`` ``deadline``. The runs this
    call ended (another process's sweep may have ended some first)."""
    due: Sequence[str] = await client.zrangebyscore(keys.deadlines, "-inf", now_ms, 0, 100)
    ended = []
    for run_id in due:
        try:
            done = await cancel_run(client, keys, pipeline, run_id, reason=DEADLINE_EXCEEDED,
                                    by=DEADLINE_BY, scripts=scripts)
        except UnknownRun:  # its entry is gone (trimmed): nothing to cancel
            done = Cancelled(run_id, False, "")
        if done.cancelled:
            ended.append(run_id)
        else:
            await client.zrem(keys.deadlines, run_id)
    return ended


async def cancel_reviews(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, run_id: str, *, by: str,
    reason: str = "",
) -> list[str]:
    """Decide every open review of ``run_id`` (in its partition ``keys``) ``cancelled``: a
    ``review:decided`` record each and the review out of the inbox, nothing else written
    (an approval after it answers as for any decided review). The ids decided."""
    field, codec = pipeline.correlation_field, pipeline.codec()
    decided_ids = []
    async for entry_id, fields in scan_stream(client, keys.review, "-", chunk=200):
        if correlation_of(fields, field) != run_id or not fields.get(KIND, "").strip():
            continue
        review_id, decided_at = keys.entry_ref(entry_id), now_rfc3339()
        record = {REVIEW_ID: review_id, KIND: fields[KIND], field: run_id,
                  DECISION: CANCELLED, BY: by, NOTE: reason, DECIDED_AT: decided_at,
                  "outputs": []}
        decided = codec.new_fields(
            REVIEW_DECIDED, record, correlation_id=run_id, producer=PRODUCER,
            idempotency_key=f"{REVIEW_DECIDED}:{review_id}",
            extra={REVIEW_ID: review_id, DECISION: CANCELLED, BY: by, NOTE: reason,
                   DECIDED_AT: decided_at})
        try:
            written = await decide_review(client, keys, entry_id, decided, [])
        except WatchConflict:  # another decision raced it: that one closed it
            continue
        if written.found:
            decided_ids.append(review_id)
    return decided_ids
