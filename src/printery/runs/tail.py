"""One live read of a partition's streams, shared by every run followed in a process.

Following a run used to be an ``XREAD BLOCK`` of its own over every stream of the run's
partition: N followers (``Client.result``/``watch`` calls, server-sent event streams of
the HTTP API and the console) held N connections blocked on the server and read the whole
traffic N times, each keeping only its own run's entries. A :class:`RunTail` reads each
partition once, whoever follows, and hands every entry to the followers of its run: the
cost of following is one connection and one read of the traffic per partition, however
many runs are followed.

A partition's read starts with its first follower at the streams' last ids, taken before
that follower reads the run's history, and ends when its last follower leaves (after at
most one block). So nothing a follower has not read in the history escapes the tail; the
entries it reads in both are dropped by the follower (:meth:`Following.after`).

A connection failure is retried with backoff while anyone follows (the followers' own
deadlines bound their waits); any other failure ends the read and is raised to every
follower of the partition. Nothing is lost in a task: the read's task hands its end to
its followers, whatever it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from printery.base._util import stop_tasks, where
from printery.runs.history import id_order
from printery.store import Outage, Redis
from printery.store.scan import last_ids, read_after

__all__ = ["Following", "RunTail"]

log = structlog.get_logger("printery.run_tail")

#: Longest a read blocks: how long a partition's read outlives its last follower.
BLOCK_MS = 1000
#: Seconds the reads get to end when the tail is closed.
CLOSE_TIMEOUT = 5.0
#: Entries one read takes at most.
COUNT = 1000

#: ``(stream, entry id, fields)`` of one entry, as the tail hands it over.
Row = tuple[str, str, Mapping[str, str]]


@dataclass(eq=False)
class Following:
    """One follower's view of the tail: the entries of its run read after it began, in
    batches (each batch one read's entries of the run, in the order they were read)."""

    run_id: str
    partition: int
    batches: asyncio.Queue[list[Row] | BaseException] = field(default_factory=asyncio.Queue)
    #: The run's partials stream, read beside the partition's streams for this follower
    #: (reference: streaming through the gate); None: not read.
    partials: str | None = None

    async def next_batch(self, timeout: float) -> list[Row] | None:
        """The next batch, or None when none came within ``timeout`` seconds. Raises
        what ended the partition's read."""
        try:
            batch = await asyncio.wait_for(self.batches.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(batch, BaseException):
            raise batch
        return batch

    def ready(self) -> list[Row]:
        """The rows of every batch handed over already, without waiting. Raises what
        ended the partition's read."""
        rows: list[Row] = []
        while not self.batches.empty():
            batch = self.batches.get_nowait()
            if isinstance(batch, BaseException):
                raise batch
            rows += batch
        return rows

    @staticmethod
    def after(rows: list[Row], last: Mapping[str, str]) -> list[Row]:
        """``rows`` less those at or before ``last[stream]`` (read in the history)."""
        return [row for row in rows
                if row[0] not in last or id_order(row[1]) > id_order(last[row[0]])]


class _PartitionRead:
    """The shared read of one partition's streams."""

    def __init__(self, streams: list[str]) -> None:
        self.streams = streams
        self.followers: dict[str, set[Following]] = {}
        self.positions: dict[str, str] = {}
        #: The partials streams read beside ``streams``: stream -> its run, and how many
        #: followers read each.
        self.partials: dict[str, str] = {}
        self.readers: dict[str, int] = {}
        #: The partials streams the read under way reads (those added since, the next).
        self.reading: frozenset[str] = frozenset()
        self.started: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None


class RunTail:
    """Reads each partition's streams once for every run followed in this process.

    ``streams_of(partition)`` names a partition's streams; ``run_of(fields)`` tells which
    run an entry belongs to ("" for none)."""

    def __init__(
        self, client: Redis, streams_of: Callable[[int], list[str]],
        run_of: Callable[[Mapping[str, str]], str],
    ) -> None:
        self.client = client
        self.streams_of = streams_of
        self.run_of = run_of
        self._reads: dict[int, _PartitionRead] = {}

    def reading(self) -> int:
        """How many partitions are being read (each one connection, blocked)."""
        return sum(1 for read in self._reads.values() if read.task is not None)

    def following(self) -> int:
        """How many followers the reads hand entries to."""
        return sum(len(followers) for read in self._reads.values()
                   for followers in read.followers.values())

    async def follow(self, run_id: str, partition: int, *, partials: str | None = None) -> (
        Following
    ):
        """Start handing ``run_id``'s entries to a new :class:`Following`: every entry
        added after this returns (and some before) reaches it. Read the run's history
        after this, and :meth:`leave` when done.

        ``partials`` (the run's partials stream) is read too, from its start (the
        follower drops what it read itself, :meth:`Following.after`): by the read's next
        turn, within :data:`BLOCK_MS` when the partition's read is under way."""
        read = self._reads.get(partition)
        if read is None:
            read = self._reads[partition] = _PartitionRead(self.streams_of(partition))
        following = Following(run_id, partition, partials=partials)
        read.followers.setdefault(run_id, set()).add(following)
        if partials is not None:
            read.partials[partials] = run_id
            read.readers[partials] = read.readers.get(partials, 0) + 1
            read.positions.setdefault(partials, "0-0")
        if read.task is None:  # the first follower starts the read
            read.started = asyncio.get_running_loop().create_future()
            read.task = asyncio.create_task(self._read(partition, read),
                                            name=f"printery-run-tail-{partition}")
        assert read.started is not None
        try:
            await asyncio.shield(read.started)
        except BaseException:
            self.leave(following)
            raise
        return following

    def leave(self, following: Following) -> None:
        """Stop handing entries to ``following`` (its partition's read ends with its
        next block when no one else follows)."""
        read = self._reads.get(following.partition)
        if read is None:
            return
        mine = read.followers.get(following.run_id)
        if mine is not None and following in mine:
            mine.discard(following)
            if not mine:
                del read.followers[following.run_id]
            stream = following.partials
            if stream is not None:
                read.readers[stream] -= 1
                if not read.readers[stream]:
                    del read.readers[stream], read.partials[stream]
                    read.positions.pop(stream, None)

    async def close(self) -> None:
        """End every read now (its followers get :class:`ConnectionError`)."""
        tasks = [read.task for read in self._reads.values() if read.task is not None]
        for task in await stop_tasks(tasks, timeout=CLOSE_TIMEOUT):
            log.error("run read did not stop: left behind", at=where(task))

    async def _read(self, partition: int, read: _PartitionRead) -> None:
        """The partition's read loop; whatever ends it reaches its followers."""
        assert read.started is not None
        ended: BaseException | None = None
        try:
            read.positions = {
                **{stream: read.positions.get(stream, "0-0") for stream in read.partials},
                **await self._retrying(lambda: self._last_ids(read.streams), read)}
            if not read.started.done():
                read.started.set_result(None)
            while read.followers:
                reply = await self._retrying(lambda: self._read_once(read), read)
                self._hand_over(read, reply or [])
        except asyncio.CancelledError:
            ended = ConnectionError("the run reader was closed")
            raise
        except Exception as exc:  # raised to every follower, never dropped
            ended = exc
            if read.followers:
                log.error("following runs failed", partition=partition, error=repr(exc))
        finally:
            read.task = None
            if ended is not None:
                if read.started is not None and not read.started.done():
                    read.started.set_exception(ended)
                    read.started.exception()  # retrieved: the followers raise it
                for followers in read.followers.values():
                    for following in followers:
                        following.batches.put_nowait(ended)
                read.followers.clear()
                for stream in read.partials:
                    read.positions.pop(stream, None)
                read.partials.clear()
                read.readers.clear()

    def _hand_over(self, read: _PartitionRead, reply: list[Any]) -> None:
        """Move the positions on and give each follower its run's entries."""
        batches: dict[str, list[Row]] = {}
        for stream, rows in reply:
            for entry_id, fields in rows:
                if stream in read.positions:  # (a partials stream no one reads any more)
                    read.positions[stream] = entry_id
                if read.followers:
                    run = read.partials.get(stream) or self.run_of(fields)
                    if run in read.followers:
                        batches.setdefault(run, []).append((stream, entry_id, fields))
        for run, rows in batches.items():
            for following in read.followers.get(run, ()):
                following.batches.put_nowait(rows)

    def reads_partials(self, following: Following) -> bool:
        """Whether the partition's read under way reads ``following``'s partials stream
        (a follower that joined it mid-block waits for its next turn, up to a block)."""
        read = self._reads.get(following.partition)
        return read is not None and following.partials in read.reading

    async def _read_once(self, read: _PartitionRead) -> Any:
        read.reading = frozenset(read.partials)
        return await read_after(self.client, read.positions, count=COUNT, block_ms=BLOCK_MS)

    async def _last_ids(self, streams: list[str]) -> dict[str, str]:
        """Each stream's last id now ("0-0" for an empty or missing stream)."""
        return await last_ids(self.client, streams)

    async def _retrying(self, call: Callable[[], Any], read: _PartitionRead) -> Any:
        """``call()``, again after a backoff while the server cannot be reached, as long
        as anyone follows (each follower's deadline is its own; the one outage policy:
        :mod:`printery.store.outage`)."""
        return await Outage("the shared live read").retrying(call, give_up=lambda: not read.followers)
