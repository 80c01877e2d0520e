"""Runs (docs/reference.md, Runs): every entry of one correlation id, in order, ending
with its outcome entry.

A run has no record of its own: its entries are the history. :class:`RunReader` finds
them in the pipeline's streams (and ``dlq``, ``review``, ``review:decided``), by the
correlation field or, for an entry an external producer wrote with only ``data``, by the
id inside ``data``; then it follows the streams live until the outcome entry, through
the one read of each partition that every run followed in the process shares
(:mod:`printery.runs.tail`). A run submitted through :class:`~printery.Client` has a
start record, so reading it starts at its first entry instead of at the beginning of
every stream.

**Order** (:class:`RunOrder`, the one rule ``trace``, ``watch``, ``result``, the event
stream and the console share): by the entry id's millisecond; within one millisecond
(entries of several streams committed together, or close together) causally, by the
depth in the pipeline's graph of what wrote the entry (an entry of an ingress type 0, a
step's output one more than the deepest of its inputs), a record (``dlq``, ``review``,
``review:decided``) before what was written with it and an outcome after; then the
entry id. One stream's entries always keep their id order: an entry that would sort
before an earlier one of its own stream (two records of one millisecond) waits behind it.

**Status** (:meth:`RunReader.outcome_of`): a run's outcome entry is its first outcome
entry in that order, except that a ``run:failed`` followed by a later outcome (a
dead letter replayed, docs/reference.md) gives way to it: the outcome is the first one that
is not ``run:failed``, else the last ``run:failed``.

Reading survives a server restart: a connection failure is retried with backoff (the
streams are on disk with the AOF) until the caller's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from printery.base import _json
from printery.base.errors import BlobMissing
from printery.pipeline.dag import Pipeline
from printery.runs.cost import CallTally
from printery.runs.history import decode_fields, id_order
from printery.runs.partials import Shown, ShownSoFar, merged, read_shown
from printery.runs.tail import Following, Row, RunTail
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_index import RUNNING, run_status
from printery.store import UNREACHABLE, Outage, Redis
from printery.store.run_index import run_start
from printery.store.scan import last_ids, read_after, scan_stream
from printery.wire.envelope import correlation_of
from printery.wire.fields import CALL_OF, REPLAYED_FROM, STEP, WORKER
from printery.wire.keys import (
    DLQ,
    REVIEW,
    REVIEW_DECIDED,
    RUN_FAILED,
    WITHHELD,
    StreamKeys,
    partition_of,
)

__all__ = ["RUNNING", "RunFollow", "RunOrder", "RunReader", "RunResult", "run_cost",
           "run_status"]


_CHUNK = 1000
#: Longest a follower waits for its run's next entries before it checks its deadline and
#: whether its reader is still there.
_FOLLOW_WAIT_S = 1.0
#: Most passes over a run's streams one history read makes: each after the first is one
#: more outcome found (a replayed dead letter's), so only a writer adding outcomes to the
#: run without end reaches it, and gets the entries as read.
_HISTORY_PASSES = 8
#: Longest one read of a run's partials by its follower blocks, while the partition's
#: read under way does not read them yet.
_BRIDGE_MS = 100


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished run: its status, its outcome's data, its entries up to the outcome and
    what its steps reported spending, per unit."""

    run_id: str
    status: str
    data: Any
    entries: list[dict[str, Any]]
    cost: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "data": self.data,
                "entries": self.entries, "cost": self.cost}


def run_cost(pipeline: Pipeline, entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What the steps of a run spent (:class:`~printery.runs.cost.CallTally`: copies of an
    entry never count), from entries as the reader returns them (``cost`` and ``data``
    parsed, ``stream`` the event type)."""
    tally = CallTally(pipeline)
    for entry in entries:
        fields = {k: str(entry[k]) for k in ("producer", "duration_ms", CALL_OF, REPLAYED_FROM,
                                             pipeline.correlation_field) if k in entry}
        cost = entry.get("cost")
        if cost is not None:
            fields["cost"] = cost if isinstance(cost, str) else _json.dumps(cost)
        tally.add(fields, str(entry.get("stream", "")))
    return tally.summary()


#: Streams of records about a step's entries (written beside its outputs, or instead).
_RECORDS = frozenset({DLQ, REVIEW, REVIEW_DECIDED, WITHHELD})

#: A run's place of one entry: (millisecond, depth, kind, sequence, type).
Place = tuple[int, int, int, int, int]


class RunOrder:
    """The order of a run's entries (see the module doc): one rule for every reader.

    Entry ids order the entries of one stream only; entries of several streams committed
    together (or in one millisecond) share the millisecond, and their sequence numbers
    are per stream. Within a millisecond an entry goes after what caused it: by the
    depth of its writer in the pipeline's graph. An entry of a pipeline type is placed
    by its type (the deepest of the steps that produce it; ingress types 0); a record
    (``dlq``, ``review``), ``run:failed``, ``budget:exceeded`` and any other type no step
    declares by the step that wrote it (its ``worker``, ``step``, ``producer`` or
    ``data.step``); a ``review:decided`` just before the types the decision wrote.
    Among entries of one depth, records go first and outcomes last."""

    def __init__(self, pipeline: Pipeline, types: Sequence[str]) -> None:
        self.outcomes = frozenset(pipeline.outcomes)
        self.index = {event_type: n for n, event_type in enumerate(types)}
        self.steps, self.types = self._depths(pipeline, 0)
        deepest = max(self.steps.values(), default=0)
        #: The depth of an entry whose writer is unknown: after every step's own outputs.
        self.floor = deepest + 1
        # Steps that consume what any step may write (run:failed) come after that.
        self.steps, self.types = self._depths(pipeline, self.floor)

    @staticmethod
    def _depths(pipeline: Pipeline, floor: int) -> tuple[dict[str, int], dict[str, int]]:
        """Each step's depth (one more than its deepest input; a type no step produces
        nor comes from outside is at ``floor``) and each produced or ingress type's."""
        steps: dict[str, int] = {}
        types: dict[str, int] = {}
        visiting: set[str] = set()

        def of_type(event_type: str) -> int:
            if event_type not in types:
                makers = pipeline.producers_of(event_type)
                if not makers and event_type not in pipeline.ingress:
                    return floor
                types[event_type] = max((of_step(name) for name in makers), default=0)
            return types[event_type]

        def of_step(name: str) -> int:
            if name in steps:
                return steps[name]
            if name in visiting or name not in pipeline.steps:  # a cycle: refused elsewhere
                return 0
            visiting.add(name)
            step = pipeline.steps[name]
            internal = step.loop.internal if step.loop is not None else ()
            depth = 1 + max((of_type(t) for t in step.consumes if t not in internal),
                            default=0)
            depth = max([depth, *(of_step(dep) + 1 for dep in step.depends_on)])
            visiting.discard(name)
            steps[name] = depth
            return depth

        for name in pipeline.steps:
            of_step(name)
        for event_type in pipeline.event_types():
            of_type(event_type)
        return steps, types

    def depth(self, entry: Mapping[str, Any]) -> int:
        """The depth of what wrote ``entry`` (an entry as the reader shows it)."""
        stream = str(entry.get("stream", ""))
        if stream not in _RECORDS and stream in self.types:
            return self.types[stream]
        data = entry.get("data")
        named = [entry.get(WORKER) if stream == DLQ else entry.get(STEP),
                 entry.get("producer"), data.get("step") if isinstance(data, dict) else None]
        for name in named:
            if isinstance(name, str) and name in self.steps:
                return self.steps[name]
        if stream == REVIEW_DECIDED and isinstance(data, dict):
            written = [self.types[t] for t in data.get("outputs") or ()
                       if isinstance(t, str) and t in self.types]
            if written:
                return min(written)
        return self.floor

    def place(self, entry: Mapping[str, Any]) -> Place:
        ms, seq = id_order(str(entry.get("id", "")))
        stream = str(entry.get("stream", ""))
        kind = 0 if stream in _RECORDS else 2 if stream in self.outcomes else 1
        return ms, self.depth(entry), kind, seq, self.index.get(stream, len(self.index))

    def sort(self, entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """``entries`` (of one run) in order: each stream's entries in their id order,
        merged by :meth:`place` (so a record of one millisecond written by a shallower
        step than the one before it in its stream waits behind that one, never goes
        before what caused either)."""
        streams: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            streams.setdefault(str(entry.get("stream", "")), []).append(entry)
        lists = list(streams.values())
        heads: list[tuple[Place, int, int]] = []
        for n, mine in enumerate(lists):
            mine.sort(key=lambda e: id_order(str(e["id"])))
            heads.append((self.place(mine[0]), n, 0))
        heapq.heapify(heads)
        ordered: list[dict[str, Any]] = []
        while heads:
            _, n, i = heapq.heappop(heads)
            ordered.append(lists[n][i])
            if i + 1 < len(lists[n]):
                heapq.heappush(heads, (self.place(lists[n][i + 1]), n, i + 1))
        return ordered


#: Where a follower has been (the event stream's ``Last-Event-ID``): per event type, the
#: id of the last entry of that stream it was given.
Seen = Mapping[str, str]


def delivered(entry: Mapping[str, Any], seen: Seen | None) -> bool:
    """Whether ``entry`` is one a follower that has ``seen`` those positions was given."""
    if not seen:
        return False
    last = seen.get(str(entry.get("stream", "")))
    return last is not None and id_order(str(entry["id"])) <= id_order(last)


class RunReader:
    """Finds and follows runs of ``pipeline`` under ``keys``."""

    def __init__(self, client: Redis, keys: StreamKeys, pipeline: Pipeline) -> None:
        self.client = client
        self.keys = keys
        self.pipeline = pipeline
        self.field = pipeline.correlation_field
        self.outcomes = frozenset(pipeline.outcomes)
        # Every outcome type is read (``run:failed`` too, which no step need declare).
        self.event_types = list(dict.fromkeys(
            [*pipeline.event_types(), *pipeline.outcomes, DLQ, REVIEW, REVIEW_DECIDED, WITHHELD]))
        self.order = RunOrder(pipeline, self.event_types)
        #: Stream key -> event type, of every partition (a run's are in one of them).
        self.streams = {part.stream(t): t for part in keys.each() for t in self.event_types}
        self.tail = RunTail(client, lambda k: [keys.at(k).stream(t) for t in self.event_types],
                            self.run_of)

    async def close(self) -> None:
        """End the live reads of followed runs (their followers raise)."""
        await self.tail.close()

    def run_of(self, fields: Mapping[str, str]) -> str:
        """The run an entry is of: its correlation field, or (only ``data`` written) the
        correlation field inside ``data`` ("" for none)."""
        return fields.get(self.field) or correlation_of(fields, self.field) or ""

    def streams_of(self, run_id: str) -> list[str]:
        """The streams a run's entries are in: those of its partition (docs/reference.md,
        Partitions)."""
        keys = self.keys.of(run_id)
        return [keys.stream(t) for t in self.event_types]

    def belongs(self, fields: Mapping[str, str], run_id: str) -> bool:
        """Whether an entry is of ``run_id``: by its correlation field, or (only ``data``
        written) by the correlation field inside ``data``."""
        value = fields.get(self.field)
        if value:
            return value == run_id
        # Only ``data``: parse it only when the id can be in it at all.
        return run_id in fields.get("data", "") and correlation_of(fields, self.field) == run_id

    def view(self, entry_id: str, stream: str, fields: Mapping[str, str]) -> dict[str, Any]:
        """An entry as ``trace`` shows it: id, event type (``stream``), decoded fields."""
        return {"id": entry_id, "stream": self.streams.get(stream, stream),
                **decode_fields(fields)}

    def is_outcome(self, entry: Mapping[str, Any]) -> bool:
        return entry.get("stream") in self.outcomes

    def ending(self, entries: Sequence[Mapping[str, Any]]) -> int | None:
        """Where in ``entries`` (in order) the run's outcome entry is, None before it:
        the first outcome entry that is not ``run:failed``, else the last ``run:failed``
        (a replayed dead letter continues a failed run: its next outcome counts)."""
        failed = None
        for n, entry in enumerate(entries):
            if self.is_outcome(entry):
                if entry.get("stream") != RUN_FAILED:
                    return n
                failed = n
        return failed

    def outcome_of(self, entries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The run's outcome entry among ``entries`` (in order; see :meth:`ending`)."""
        n = self.ending(entries)
        return None if n is None else entries[n]

    async def start_of(self, run_id: str) -> str:
        """Where the run's entries begin: its start record, else the beginning."""
        return await run_start(self.client, self.keys, run_id) or "-"

    async def history(self, run_id: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The run's entries so far in order (:class:`RunOrder`), and per stream the
        last id read (where following it live goes on).

        The streams are scanned one after another while the run's workers go on writing:
        a scan may find the outcome in a stream read after the one its cause landed in a
        moment too late. What led to the outcome was written before it, so it is in the
        streams by the time the outcome is found: once an outcome is known, the streams
        are read on from where each scan stopped, until the outcome stays the same
        (a replayed dead letter's later outcome, read in that pass, is read up to too).
        A run without its outcome yet needs none of this: following it live from those
        positions gives what each scan missed."""
        start = await self.start_of(run_id)
        if start != "-":  # another stream's entry of the same millisecond may sort lower
            start = f"{id_order(start)[0]}-0"
        found: list[dict[str, Any]] = []
        last = {stream: "0-0" if start == "-" else _before(start)
                for stream in self.streams_of(run_id)}
        outcome: Any = None
        ordered: list[dict[str, Any]] = []
        for _ in range(_HISTORY_PASSES):
            for stream in await self._moved(last, first=outcome is None):
                async for entry_id, fields in scan_stream(self.client, stream,
                                                          "(" + last[stream], chunk=_CHUNK):
                    if self.belongs(fields, run_id):
                        found.append(self.view(entry_id, stream, fields))
                    last[stream] = entry_id
            ordered = self.order.sort(found)
            end = self.ending(ordered)
            now = None if end is None else (ordered[end]["stream"], ordered[end]["id"])
            if now == outcome:
                break
            outcome = now
        return ordered, last

    async def _moved(self, last: Mapping[str, str], *, first: bool) -> list[str]:
        """The streams to read on after ``last``: all of them the first time, then (one
        round trip) those written to since."""
        if first:
            return list(last)
        now = await last_ids(self.client, list(last))
        return [stream for stream, at in now.items() if id_order(at) > id_order(last[stream])]

    async def exists(self, run_id: str) -> bool:
        entries, _ = await self.history(run_id)
        return bool(entries)

    @asynccontextmanager
    async def open(
        self, run_id: str, *, deadline: float | None = None, seen: Seen | None = None,
        partials: bool = False,
    ) -> AsyncIterator[RunFollow]:
        """Start following the run: join the process's shared read of its partition
        (:class:`~printery.runs.tail.RunTail`), then read its history; what it has to
        give (less what a follower that has ``seen`` those positions was given) is
        known before anything is given (:class:`RunFollow`). With ``partials``, its
        partials and verdicts too (:mod:`printery.runs.partials`): those on the server
        now are read first, then the entries."""
        partition = partition_of(run_id, self.keys.partitions)
        stream = self.keys.of(run_id).partials(run_id) if partials else None
        joining = self.tail.follow(run_id, partition, partials=stream)
        following = await (joining if deadline is None else
                           asyncio.wait_for(joining, max(0.0, deadline - time.monotonic())))
        try:
            shown: ShownSoFar | None = None
            if stream is not None:
                shown = await self._retrying(lambda: read_shown(self.client, run_id, stream),
                                             deadline)
            entries, last = await self._retrying(lambda: self.history(run_id), deadline)
            yield RunFollow(self, following, entries, last, deadline=deadline, seen=seen,
                            shown=shown)
        finally:
            self.tail.leave(following)

    async def follow(
        self, run_id: str, *, deadline: float | None = None,
        alive: Callable[[], bool] | None = None, seen: Seen | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every entry of the run in order, from the first, live, ending after the
        outcome entry (:meth:`ending`: of the history, else the first one that comes).
        Raises :class:`TimeoutError` at ``deadline`` (monotonic); ends early once
        ``alive()`` is false (checked at least once a second: a reader that went away
        stops waiting). ``seen``: skip the entries a follower with those positions was
        given (a reconnecting event stream)."""
        async with self.open(run_id, deadline=deadline, seen=seen) as run:
            async for entry in run.entries(alive):
                yield entry

    async def watch(
        self, run_id: str, *, deadline: float | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> AsyncIterator[dict[str, Any] | Shown]:
        """:meth:`follow`, with the run's partials and verdicts between its entries
        (reference: streaming through the gate)."""
        async with self.open(run_id, deadline=deadline, partials=True) as run:
            async for item in run.items(alive):
                yield item

    async def result(self, run_id: str, *, timeout: float | None = None) -> RunResult:
        """The run once it has ended (see :meth:`follow`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        entries = [entry async for entry in self.follow(run_id, deadline=deadline)]
        outcome = entries[-1]
        summary = run_cost(self.pipeline, entries)
        data = outcome.get("data")
        with contextlib.suppress(BlobMissing):  # expired: the reference, as stored
            data = await PayloadStore(self.client, self.keys.of(run_id)).resolved(data)
        return RunResult(run_id, run_status(outcome), data, entries,
                         dict(summary["total"]["cost"]))

    async def _retrying(self, call: Any, deadline: float | None) -> Any:
        """``call()``, again after a backoff while the server cannot be reached (a
        restart), until ``deadline`` (the one outage policy: :mod:`printery.store.outage`)."""
        return await Outage("a run's follower").retrying(call, deadline=deadline)


def _before(entry_id: str) -> str:
    """The id just before ``entry_id`` (XREAD reads after the id it is given)."""
    ms, seq = id_order(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"


class RunFollow:
    """One follower of one run (:meth:`RunReader.open`), its history read: ``known``
    (the run has any entry), ``ended`` (nothing is left to give: the outcome entry and
    everything before it were given already), then :meth:`entries`."""

    def __init__(
        self, reader: RunReader, following: Following, history: list[dict[str, Any]],
        last: dict[str, str], *, deadline: float | None, seen: Seen | None,
        shown: ShownSoFar | None = None,
    ) -> None:
        self.reader = reader
        self.following = following
        self.last = last
        self.deadline = deadline
        self.seen = seen
        self.known = bool(history)
        end = reader.ending(history)
        self.outcome_known = end is not None
        #: The millisecond of the outcome entry (None before it).
        self.outcome_ms = None if end is None else id_order(str(history[end]["id"]))[0]
        self.pending = [entry for entry in (history if end is None else history[: end + 1])
                        if not delivered(entry, seen)]
        self.ended = self.outcome_known and not self.pending
        #: The partials followed (None: not), given up to where.
        self.shown = shown
        if shown is not None and following.partials is not None:
            last[following.partials] = shown.last

    async def entries(self, alive: Callable[[], bool] | None = None) -> AsyncIterator[
        dict[str, Any]
    ]:
        """The entries to give, in order, live, up to the outcome entry (see
        :meth:`RunReader.follow`)."""
        async for item in self.items(alive):
            if isinstance(item, dict):
                yield item

    async def items(self, alive: Callable[[], bool] | None = None) -> AsyncIterator[
        dict[str, Any] | Shown
    ]:
        """:meth:`entries`, and when the run's partials are followed its partials and
        verdicts among them (:func:`~printery.runs.partials.merged`)."""
        shown = self.shown
        if shown is None:
            for entry in self.pending:
                yield entry
        else:
            for item in merged(self.pending, shown.head(self.seen, self.outcome_ms)):
                yield item
        if self.outcome_known:
            return
        while alive is None or alive():
            wait = _FOLLOW_WAIT_S
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {self.following.run_id} did not end in time")
                wait = min(wait, left)
            rows = await self._next(wait)
            if not rows:
                continue
            for item in await self._given(rows):
                yield item
                if isinstance(item, dict) and self.reader.is_outcome(item):
                    return

    async def _next(self, wait: float) -> list[Row] | None:
        """The tail's next batch. While the partition's read under way does not read the
        run's partials yet (this follower joined it mid-block), they are read here
        meanwhile, a short block at a time: live from the first, not a block late."""
        stream = self.following.partials
        if stream is None or self.reader.tail.reads_partials(self.following):
            return await self.following.next_batch(wait)
        try:
            reply = await read_after(self.reader.client, {stream: self.last[stream]},
                                     count=_CHUNK, block_ms=_BRIDGE_MS)
        except UNREACHABLE:  # the tail's own read waits for the server
            return await self.following.next_batch(wait)
        rows = [(stream, entry_id, fields) for _, found in reply for entry_id, fields in found]
        return [*self.following.ready(), *rows]

    async def _given(self, rows: list[Row]) -> list[dict[str, Any] | Shown]:
        """What to give of a batch of the tail, in order, up to the run's outcome."""
        reader, shown, partials = self.reader, self.shown, self.following.partials
        fresh = self.following.after(rows, self.last)
        entries = [entry for entry in reader.order.sort(
            reader.view(entry_id, stream, fields) for stream, entry_id, fields in fresh
            if stream != partials) if not delivered(entry, self.seen)]
        if shown is None:
            return list(entries)
        given: list[dict[str, Any] | Shown] = []
        added = shown.add(fresh, partials, self.seen)
        if partials is not None:  # what was given is not given again (read twice, or late)
            self.last[partials] = shown.last
        for item in merged(entries, added):
            if isinstance(item, dict) and reader.is_outcome(item):
                # Written before the outcome, not read by the tail yet (it joined a read
                # of the partition under way): given before the outcome they led to.
                given += await shown.before(reader.client, item)
                given.append(item)
                break
            given.append(item)
        return given
