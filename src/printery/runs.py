"""Runs (CONTRACT §11): every entry of one correlation id, in order, ending with its
outcome entry.

A run has no record of its own: its entries are the history. :class:`RunReader` finds
them in the pipeline's streams (and ``dlq``, ``review``, ``review:decided``), by the
correlation field or, for an entry an external producer wrote with only ``data``, by the
id inside ``data``; then it follows the streams live until the outcome entry, through
the one read of each partition that every run followed in the process shares
(:mod:`printery.run_tail`). A run submitted through :class:`~printery.Client` has a
start record, so reading it starts at its first entry instead of at the beginning of
every stream.

Reading survives a server restart: a connection failure is retried with backoff (the
streams are on disk with the AOF) until the caller's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import structlog

from printery import _json
from printery._util import idle
from printery.backoff import compute_backoff
from printery.cost import CallTally
from printery.envelope import correlation_of
from printery.history import decode_fields, id_order
from printery.keys import DLQ, REVIEW, REVIEW_DECIDED, StreamKeys, partition_of
from printery.pipeline.dag import Pipeline
from printery.run_index import RUNNING, run_status
from printery.run_tail import RunTail
from printery.transport.streams import CONNECTION_ERRORS

__all__ = ["RUNNING", "RunReader", "RunResult", "run_cost", "run_status"]

log = structlog.get_logger("printery.runs")

_CHUNK = 1000
#: Longest a follower waits for its run's next entries before it checks its deadline and
#: whether its reader is still there.
_FOLLOW_WAIT_S = 1.0


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
    """What the steps of a run spent (:class:`~printery.cost.CallTally`), from entries
    as the reader returns them (``cost`` and ``data`` parsed)."""
    tally = CallTally(pipeline)
    for entry in entries:
        fields = {k: str(entry[k]) for k in ("producer", "duration_ms", pipeline.correlation_field)
                  if k in entry}
        cost = entry.get("cost")
        if cost is not None:
            fields["cost"] = cost if isinstance(cost, str) else _json.dumps(cost)
        tally.add(fields)
    return tally.summary()


class RunReader:
    """Finds and follows runs of ``pipeline`` under ``keys``."""

    def __init__(self, client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline) -> None:
        self.client = client
        self.keys = keys
        self.pipeline = pipeline
        self.field = pipeline.correlation_field
        self.outcomes = frozenset(pipeline.outcomes)
        self.event_types = list(dict.fromkeys(
            [*pipeline.event_types(), DLQ, REVIEW, REVIEW_DECIDED]))
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
        """The streams a run's entries are in: those of its partition (CONTRACT §15)."""
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

    def _placed(
        self, entry_id: str, stream: str, fields: Mapping[str, str]
    ) -> tuple[tuple[int, int, int], dict[str, Any]]:
        """An entry with its place in the run: entry ids order entries of one stream
        only, and entries of several streams committed together (or in one millisecond)
        share the millisecond; within it an outcome goes last, so an entry written with
        it or before it is never read as coming after it."""
        ms, seq = id_order(entry_id)
        entry = self.view(entry_id, stream, fields)
        return (ms, 1 if self.is_outcome(entry) else 0, seq), entry

    def is_outcome(self, entry: Mapping[str, Any]) -> bool:
        return entry.get("stream") in self.outcomes

    async def start_of(self, run_id: str) -> str:
        """Where the run's entries begin: its start record, else the beginning."""
        start = await self.client.get(self.keys.of(run_id).run_start(run_id))
        return str(start) if start else "-"

    async def history(self, run_id: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The run's entries so far in id order, and per stream the last id read (where
        following it live goes on)."""
        start = await self.start_of(run_id)
        if start != "-":  # another stream's entry of the same millisecond may sort lower
            start = f"{id_order(start)[0]}-0"
        found: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
        last: dict[str, str] = {}
        for stream in self.streams_of(run_id):
            lower, last[stream] = start, "0-0" if start == "-" else _before(start)
            while True:
                batch = await self.client.xrange(stream, lower, "+", count=_CHUNK)
                for entry_id, fields in batch:
                    if self.belongs(fields, run_id):
                        found.append(self._placed(entry_id, stream, fields))
                if batch:
                    last[stream] = batch[-1][0]
                if len(batch) < _CHUNK:
                    break
                lower = "(" + batch[-1][0]
        found.sort(key=lambda item: item[0])
        return [entry for _, entry in found], last

    async def exists(self, run_id: str) -> bool:
        entries, _ = await self.history(run_id)
        return bool(entries)

    async def follow(
        self, run_id: str, *, deadline: float | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every entry of the run in order, from the first, live, ending after the
        outcome entry. Raises :class:`TimeoutError` at ``deadline`` (monotonic); ends
        early once ``alive()`` is false (checked at least once a second: a reader that
        went away stops waiting). Live entries come from the process's shared read of
        the run's partition (:class:`~printery.run_tail.RunTail`), joined before the
        history is read."""
        partition = partition_of(run_id, self.keys.partitions)
        joining = self.tail.follow(run_id, partition)
        following = await (joining if deadline is None else
                           asyncio.wait_for(joining, max(0.0, deadline - time.monotonic())))
        try:
            entries, last = await self._retrying(lambda: self.history(run_id), deadline)
            for entry in entries:
                yield entry
                if self.is_outcome(entry):
                    return
            while alive is None or alive():
                wait = _FOLLOW_WAIT_S
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"run {run_id} did not end in time")
                    wait = min(wait, left)
                rows = await following.next_batch(wait)
                if rows is None:
                    continue
                batch = [self._placed(entry_id, stream, fields)
                         for stream, entry_id, fields in following.after(rows, last)]
                batch.sort(key=lambda item: item[0])
                for _, entry in batch:
                    yield entry
                    if self.is_outcome(entry):
                        return
        finally:
            self.tail.leave(following)

    async def result(self, run_id: str, *, timeout: float | None = None) -> RunResult:
        """The run once it has ended (see :meth:`follow`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        entries = [entry async for entry in self.follow(run_id, deadline=deadline)]
        outcome = entries[-1]
        summary = run_cost(self.pipeline, entries)
        return RunResult(run_id, run_status(outcome), outcome.get("data"), entries,
                         dict(summary["total"]["cost"]))

    async def _retrying(self, call: Any, deadline: float | None) -> Any:
        """``call()``, again after a backoff while the server cannot be reached (a
        restart), until ``deadline``."""
        attempt = 0
        while True:
            try:
                return await call()
            except CONNECTION_ERRORS as exc:
                attempt += 1
                delay = compute_backoff(attempt, base_ms=100, cap_ms=2000)
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TimeoutError(f"server unreachable: {exc}") from exc
                log.warning("server unreachable while following a run; retrying",
                            attempt=attempt, error=str(exc))
                await idle(delay)


def _before(entry_id: str) -> str:
    """The id just before ``entry_id`` (XREAD reads after the id it is given)."""
    ms, seq = id_order(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"
