"""Dead letters (docs/reference.md, Failures): reading, replaying and purging the ``dlq``
stream, for the operator tool and the HTTP API alike.

Replay moves an entry back atomically: WATCH the ``dlq`` stream, check the entry is still
there, then MULTI: XADD to its source stream + XDEL from ``dlq``, EXEC. Two operators
replaying the same entry at once cannot both succeed (the loser's EXEC aborts and its
retry finds the entry gone), and a crash between the two writes is impossible.
"""

from __future__ import annotations

from typing import Any

from printery.base.errors import TransportError
from printery.runs.history import decode_fields, id_order
from printery.runtime.run_index import DEAD_LETTER, RUNNING, now_ms
from printery.store import Redis, WatchConflict
from printery.store.inbox import Requeue, delete_letter, requeue_letter
from printery.store.scan import read_entry, scan_partitions
from printery.transport.streams import public_api
from printery.wire.envelope import correlation_of
from printery.wire.fields import DLQ_FIELDS, REPLAYED_FROM, SOURCE_STREAM
from printery.wire.keys import StreamKeys

#: The status of a run a dead letter ended (its ``run:failed`` outcome, docs/reference.md).
FAILED = "failed"

__all__ = ["dead_letter", "dead_letter_ids", "dead_letters", "purge", "replay_dead_letter"]



def view(entry_id: str, fields: dict[str, str], correlation_field: str) -> dict[str, Any]:
    """A dead letter as a reader sees it: every field decoded, and the run's id under the
    pipeline's correlation field even when the producer put it only in ``data``.
    ``entry_id`` is as commands name it (``<id>@p<k>`` with several partitions)."""
    row = {"id": entry_id, **decode_fields(fields)}
    row[correlation_field] = correlation_of(fields, correlation_field) or ""
    return row


@public_api
async def dead_letters(
    client: Redis, keys: StreamKeys, correlation_field: str, *, count: int = 1000
) -> list[dict[str, Any]]:
    """The oldest ``count`` dead letters of every partition, each with every field."""
    found = [(id_order(entry_id), part.entry_ref(entry_id), fields) async for part, entry_id, fields
             in scan_partitions(client, keys, lambda part: part.dlq, count=count)]
    found.sort(key=lambda row: row[0])
    return [view(ref, fields, correlation_field) for _, ref, fields in found[:count]]


async def _find(
    client: Redis, keys: StreamKeys, ref: str
) -> tuple[StreamKeys, str, dict[str, str]] | None:
    """The partition, stream id and fields of the dead letter named ``ref``."""
    parts, entry_id = keys.resolve_ref(ref)
    for part in parts:
        fields = await read_entry(client, part.dlq, entry_id)
        if fields is not None:
            return part, entry_id, fields
    return None


@public_api
async def dead_letter(
    client: Redis, keys: StreamKeys, correlation_field: str, entry_id: str
) -> dict[str, Any] | None:
    """One dead letter, or None when there is no such entry."""
    found = await _find(client, keys, entry_id)
    return None if found is None else view(found[0].entry_ref(found[1]), found[2], correlation_field)


@public_api
async def replay_dead_letter(
    client: Redis, keys: StreamKeys, entry_id: str, correlation_field: str = "",
) -> dict[str, Any]:
    """Move one dead letter back to its source stream (``attempt`` + 1, ``replayed_from``);
    a result: ``replayed`` true with ``new_id``, or false with an ``error``. The source
    stream is of the dead letter's partition: one transaction, one slot.

    With the pipeline's ``correlation_field``, a run a dead letter ended (its run index
    says so) is running again in the same transaction: the replay continues it,
    and its status becomes that of its next outcome (reference: failures)."""
    ref, found = entry_id, await _find(client, keys, entry_id)
    if found is None:
        return {"id": ref, "replayed": False, "error": "no such dlq entry"}
    part, entry_id = found[0], found[1]

    def rewrite(fields: dict[str, str]) -> Requeue:
        source = fields.get(SOURCE_STREAM, "")
        if not source:
            return "entry has no source_stream"
        # Everything but what dead-lettering added is the original entry.
        original = {k: v for k, v in fields.items() if k not in DLQ_FIELDS}
        try:
            attempt = int(original.get("attempt") or 1)
        except ValueError:
            attempt = 1
        original["attempt"] = str(attempt + 1)
        original[REPLAYED_FROM] = entry_id
        run = correlation_of(original, correlation_field) if correlation_field else None
        return source, original, run or None

    def reopen(run: str) -> list[tuple[Any, ...]]:
        """The run this dead letter ended is running again: its next outcome decides."""
        return [("ZREM", part.run_index(FAILED), run),
                ("ZADD", part.run_index(RUNNING), now_ms(), run),
                ("HDEL", part.run_info(run), "status", "ended", DEAD_LETTER)]

    try:
        done = await requeue_letter(client, part, entry_id, rewrite, ended_by=DEAD_LETTER,
                                    reopen=reopen)
    except WatchConflict:
        raise TransportError(
            f"dlq entry {entry_id}: too much concurrent change, try again") from None
    if isinstance(done, str):
        return {"id": ref, "replayed": False, "error": done or "no such dlq entry"}
    source, new_id = done
    return {"id": ref, "replayed": True, "source_stream": source,
            "new_id": part.entry_ref(new_id)}


@public_api
async def purge(client: Redis, keys: StreamKeys, entry_id: str) -> dict[str, Any]:
    """Delete one dead letter for good: ``purged`` true, or false with an ``error``."""
    parts, stream_id = keys.resolve_ref(entry_id)
    deleted = False
    for part in parts:
        deleted = await delete_letter(client, part, stream_id)
        if deleted:
            break
    return {"id": entry_id, "purged": deleted,
            "error": "" if deleted else "no such dlq entry"}


@public_api
async def dead_letter_ids(client: Redis, keys: StreamKeys) -> list[str]:
    """Every dead letter's id as commands name it, of every partition."""
    return [part.entry_ref(entry_id)
            async for part, entry_id, _ in scan_partitions(client, keys, lambda part: part.dlq)]
