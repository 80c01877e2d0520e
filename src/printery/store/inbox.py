"""What waits for people: open reviews and dead letters, over every partition, counted;
a review's decision written, a dead letter put back or deleted.

One read for both counts (an ``XLEN`` of each partition's ``review`` and ``dlq`` streams, one
round trip), so the gauges, the console's overview and its pages count them alike. A
review stays in ``review`` until it is decided (the decision deletes it), so the
stream's length is the number open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from printery.store.client_errors import ServerError, WatchConflict
from printery.store.outage import unreachable
from printery.store.scan import read_entry
from printery.transport.connection import Redis
from printery.transport.streams import WATCH_RETRIES
from printery.wire.keys import StreamKeys

__all__ = ["Decided", "Requeue", "Waiting", "decide_review", "delete_letter", "requeue_letter", "waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """Open reviews and dead letters held, over every partition."""

    reviews: int
    dead_letters: int


async def waiting(client: Redis, keys: StreamKeys) -> Waiting:
    """What waits for people under ``keys`` (every partition)."""
    parts = list(keys.each())
    async with client.pipeline(transaction=False) as pipe:
        for part in parts:
            pipe.xlen(part.review)
            pipe.xlen(part.dlq)
        counts = await pipe.execute()
    return Waiting(sum(counts[0::2]), sum(counts[1::2]))


class Decided(NamedTuple):
    """What :func:`decide_review` did: ``found`` False when the review was not open;
    ``run_ended`` the run's status when the run had ended (only the moot record was
    written), else ""."""

    found: bool
    run_ended: str = ""


async def decide_review(
    client: Redis, keys: StreamKeys, review_id: str, decided: Mapping[str, str],
    outputs: Sequence[tuple[str, Mapping[str, str]]], commands: Sequence[tuple[Any, ...]] = (),
    *, run_info: str = "", moot: Mapping[str, str] | None = None,
) -> Decided:
    """Write a review's decision in one transaction, fenced on the review still being
    open: the decision's own ``commands``, its ``review:decided`` record (``decided``),
    the ``outputs`` (stream, fields) and the review's deletion from ``review``. Fenced on
    the run's info hash ``run_info`` too when given: when the run index says the run has
    ended (by an outcome, not by a dead letter, whose ``run:failed`` gives way to a later
    outcome), only ``moot`` (the record of a decision that changed nothing) and the
    review's deletion are written. Raises :class:`WatchConflict` after :data:`WATCH_RETRIES`
    attempts that another writer overtook."""
    for _ in range(WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(*(keys.review, run_info) if run_info else (keys.review,))
                if await read_entry(pipe, keys.review, review_id) is None:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return Decided(False)
                status, ended, dead_letter = (
                    await pipe.hmget(run_info, ["status", "ended", "dead_letter"])  # type: ignore[misc]
                    if run_info else (None, None, None))
                pipe.multi()  # type: ignore[no-untyped-call]
                if ended and not dead_letter:  # a dead letter's run:failed gives way
                    pipe.xadd(keys.review_decided, cast(Any, moot or decided))
                    pipe.xdel(keys.review, review_id)
                    await pipe.execute()
                    return Decided(True, str(status or "ended"))
                # The decision's own writes first (a rejection's retraction of a held
                # draft), then its record, then its outputs: an output may end the run,
                # and a follower closes at it (so what it led to is written before it).
                for command in commands:
                    pipe.execute_command(*command)
                pipe.xadd(keys.review_decided, cast(Any, decided))
                for stream, fields in outputs:
                    pipe.xadd(stream, cast(Any, fields))
                pipe.xdel(keys.review, review_id)
                await pipe.execute()
                return Decided(True)
            except WatchConflict:
                continue
    raise WatchConflict(f"review {review_id}: too much concurrent change")


#: Where a dead letter goes back to (its source stream, the entry to add there, the run it
#: belongs to or None), or why it cannot (a reason).
Requeue = tuple[str, dict[str, str], str | None] | str


async def requeue_letter(
    client: Redis, part: StreamKeys, entry_id: str, rewrite: Callable[[dict[str, str]], Requeue],
    *, ended_by: str, reopen: Callable[[str], Sequence[tuple[Any, ...]]],
) -> tuple[str, str] | str:
    """Move the dead letter ``entry_id`` of ``part`` back in one WATCH/MULTI transaction
    fenced on it (two operators: one replay): ``rewrite(fields)`` says where to or why
    not; a run whose info hash holds the field ``ended_by`` (this dead letter ended it) is
    reopened by ``reopen(run)``'s commands in the same transaction. The source stream and
    the new entry's id, or why nothing was written ("" when there is no such letter).
    Raises :class:`WatchConflict` after :data:`WATCH_RETRIES` attempts overtaken."""
    for _ in range(WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(part.dlq)
                fields = await read_entry(pipe, part.dlq, entry_id)
                planned = "" if fields is None else rewrite(fields)
                if isinstance(planned, str):
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return planned
                source, entry, run = planned
                ended = bool(run) and bool(await pipe.hget(  # type: ignore[misc]
                    part.run_info(run or ""), ended_by))
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.xadd(source, cast(Any, entry))
                pipe.xdel(part.dlq, entry_id)
                if ended and run:
                    for command in reopen(run):
                        pipe.execute_command(*command)
                new_id, *_ = await pipe.execute()
            except WatchConflict:
                continue
        return source, str(new_id)
    raise WatchConflict(f"dlq entry {entry_id}: too much concurrent change")


async def delete_letter(client: Redis, part: StreamKeys, entry_id: str) -> bool:
    """Delete the dead letter ``entry_id`` of ``part``; whether there was one (an id the
    server refuses is no letter)."""
    try:
        return bool(await client.xdel(part.dlq, entry_id))
    except ServerError as exc:
        if unreachable(exc):
            raise
        return False
