"""The run index's writes: what each commit tells the index of runs (which runs exist,
newest first, and each one's status), turned into a few commands of that commit's own
transaction. The reads (the console's overview and runs pages) and the sweep that forgets
ended runs are :mod:`printery.runs.index`; the keys, every one from
:class:`~printery.wire.keys.StreamKeys`:

- ``run_index()``: sorted set, run id -> when it started (ms);
- ``run_index(status)``: the runs of one status (``running``, then the outcome's status)
  -> when they got it, so a status filter reads one set;
- ``run_statuses``: the set of status names seen (the filter's choices);
- ``run_info(run)``: hash ``status``, ``ended`` (written at the outcome: a run without
  it is running; its start is its score in ``run_index()``);
- ``cost_minute(m)``: hash unit -> amount the steps reported in unix minute ``m`` (TTL
  two hours): the overview's "cost in the last hour" is 60 ``HGETALL``.

Who writes: ``submit.lua`` indexes a submitted run atomically with its ingress entry. The
commit of an entry of an ingress type indexes its run too (``NX``: a submitted run keeps
its start), so a run an external producer started with a plain ``XADD`` is indexed when
its first entry is handled. The commit of an outcome entry sets the status, once: the
first outcome of a run stays its status, and commit.lua withholds an outcome of a run
whose info hash says it ended (:attr:`RunMark.ends`, :func:`committed`). Each entry's
commit carries a :class:`RunMark`; the committer turns the marks of the entries of one
script run into a few commands of that run's own transaction (:meth:`RunIndex.writes`:
one ``ZADD`` per set for all of them, not one per entry), so they land with the
outputs, atomically; they do not depend on the script's verdict, so they are
idempotent (``NX``, the same status again), except the cost minutes: a duplicate
delivery's cost counts twice there (an overview figure; ``printery cost`` is exact).
The costs of the entries of one script run go to their minute summed (:meth:`RunIndex.spent`,
from their marks): one write per script run, not per entry.

Its namesakes in other layers (the same job there): :mod:`printery.policies.run_index`,
:mod:`printery.store.run_index`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from printery.base import _json
from printery.transport.channel import Command
from printery.transport.commit import IndexEnd, IndexWrites
from printery.wire.keys import StreamKeys

__all__ = ["COST_MINUTE_TTL", "DEAD_LETTER", "RUNNING", "RunIndex", "RunMark",
           "committed", "now_ms", "outcome_status", "run_status"]

#: A run's status before its outcome entry.
RUNNING = "running"
#: The field of a run's info hash set while the run's status comes from a dead letter.
DEAD_LETTER = "dead_letter"
#: Seconds a cost minute is kept: the last hour is always there.
COST_MINUTE_TTL = 7200


def run_status(outcome: Mapping[str, Any] | None) -> str:
    """A run's status (docs/reference.md, The API: /v1): its outcome entry's
    ``data.status`` when that is a string, else the outcome's event type; :data:`RUNNING`
    without an outcome."""
    if outcome is None:
        return RUNNING
    data = outcome.get("data")
    if isinstance(data, dict) and isinstance(data.get("status"), str):
        return str(data["status"])
    return str(outcome.get("stream", ""))


def now_ms() -> int:
    return int(time.time() * 1000)


class RunMark(NamedTuple):
    """What one entry's commit tells the run index: its run ``started`` (an ingress
    entry), ended with ``status`` ("" if not), or both, and the ``costs`` its handler
    reported. A commit carries marks, not commands
    (:attr:`~printery.transport.commit.EntryCommit.mark`): the committer turns each
    script run's marks into a few commands (:meth:`RunIndex.writes`)."""

    run_id: str
    started: bool
    status: str
    costs: Mapping[str, float] | None = None
    #: Ended by a dead letter (its ``run:failed``): the run's info then says so
    #: (``dead_letter``), so that only such a run is ended again by a later dead letter or
    #: continued by a replay of one; any other outcome clears it.
    dead_letter: bool = False
    #: The positions, among the entry's outputs, of those that are outcomes of its run, and
    #: the run's info hash: the commit withholds them when the run has ended already, but
    #: by a dead letter (a run gets one outcome; :func:`committed`).
    ends: tuple[int, ...] = ()
    info: str = ""
    #: The run's ``withheld`` stream: where the commit copies the figures of a call whose
    #: first output it withholds (the call's cost was spent all the same).
    withheld: str = ""


class RunIndex:
    """The run index's writes under ``keys``, as commands for a commit (the reads:
    :class:`printery.runs.index.RunIndexReader`).

    With several partitions (docs/reference.md, Partitions) each partition keeps the index
    of its own runs, so a commit's index writes stay in its slot: writes need one
    partition's keys (:meth:`within`)."""

    def __init__(self, keys: StreamKeys, *, ingress: Iterable[str] = (),
                 outcomes: Iterable[str] = ()) -> None:
        self.keys = keys
        self.ingress = frozenset(ingress)
        self.outcomes = frozenset(outcomes)
        #: The ingress and the outcome streams under ``keys`` (made at the first commit).
        self._streams: tuple[frozenset[str], dict[str, str]] | None = None
        self._expire_sent = -1
        #: Keys written on the hot path, named once (at the first write: the index of a
        #: partitioned keyspace as a whole only reads): every run, the running ones, and
        #: the runs of each status.
        self._set_keys: tuple[str, str] | None = None
        self._status_sets: dict[str, str] = {}

    def within(self, keys: StreamKeys) -> RunIndex:
        """The same index written under one partition's ``keys``."""
        return RunIndex(keys, ingress=self.ingress, outcomes=self.outcomes)

    def _sets(self) -> tuple[str, str]:
        if self._set_keys is None:
            self._set_keys = (self.keys.run_index(), self.keys.run_index(RUNNING))
        return self._set_keys

    def _status_set(self, status: str) -> str:
        of_status = self._status_sets.get(status)
        if of_status is None:
            of_status = self._status_sets[status] = self.keys.run_index(status)
        return of_status

    def spent(self, costs: Mapping[str, float], at_ms: int) -> list[Command]:
        """Add ``costs`` to their minute. The minute's TTL is set again at most once a
        second (a commit that failed leaves it to the next second's), not per entry."""
        if not costs:
            return []
        key = self.keys.cost_minute(at_ms // 60_000)
        commands: list[Command] = [("HINCRBYFLOAT", key, unit, repr(float(amount)))
                                   for unit, amount in costs.items()]
        if at_ms // 1000 != self._expire_sent:
            self._expire_sent = at_ms // 1000
            commands.append(("EXPIRE", key, COST_MINUTE_TTL))
        return commands

    def mark(
        self, source: str, run_id: str, outputs: Iterable[Sequence[Any]],
        costs: Mapping[str, float] | None = None,
    ) -> RunMark | None:
        """What the commit of one handled entry (of the stream ``source``, run ``run_id``,
        its handler having reported ``costs``) tells the index, given its ``outputs`` as
        (stream key, fields, ...): None for most commits (only an ingress entry, an
        outcome and costs are indexed). On the hot path of every step: two set lookups
        when nothing is indexed."""
        streams = self._streams
        if streams is None:
            streams = self._streams = (
                frozenset(self.keys.stream(t) for t in self.ingress),
                {self.keys.stream(t): t for t in self.outcomes})
        if not run_id:
            return RunMark(run_id, False, "", costs) if costs else None
        ingress, outcomes = streams
        status, ends = "", []
        for slot, out in enumerate(outputs):
            if out[0] in outcomes:
                ends.append(slot)
                if status:
                    continue
                status = outcome_status(outcomes[out[0]], out[1])
                if status in ("", RUNNING):  # not a status the index can file an ended run under
                    status = outcomes[out[0]]
        starts = source in ingress
        if not starts and not status and not costs:
            return None
        if not status:
            return RunMark(run_id, starts, status, costs or None)
        return RunMark(run_id, starts, status, costs or None, ends=tuple(ends),
                       info=self.keys.run_info(run_id), withheld=self.keys.withheld)

    def writes(self, marks: Sequence[RunMark], at_ms: int | None = None) -> list[Command]:
        """The commands that index ``marks`` (of the entries of one commit) at ``at_ms``
        (default now), a few for all of them: a started run goes into every run's set
        and the running ones (``NX``: kept as it was when indexed already), an ended one
        out of the running ones and into its status's, with its ``status`` and ``ended``
        in its info hash; one ``ZADD`` per set, one ``ZREM`` and one ``SADD`` for all the
        marks, and their costs summed into their minute (:meth:`spent`). The starts go
        first: a run one commit starts and ends is ended (and one a commit ends and starts
        again too). For commit.lua, the same by name: :func:`committed`."""
        at = now_ms() if at_ms is None else at_ms
        every, running = self._sets()
        total: dict[str, float] = {}
        for mark in marks:
            if mark.costs:
                for unit, amount in mark.costs.items():
                    total[unit] = total.get(unit, 0.0) + amount
        commands = self.spent(total, at)
        started = [part for mark in marks if mark.started for part in (at, mark.run_id)]
        if started:
            commands += [("ZADD", every, "NX", *started), ("ZADD", running, "NX", *started)]
        ended = [mark for mark in marks if mark.status]
        if not ended:
            return commands
        return commands + self._ended(every, running, ended, at)

    def _ended(self, every: str, running: str, ended: Sequence[RunMark], at: int) -> (
        list[Command]
    ):
        commands: list[Command] = [
            ("ZADD", every, "NX", *[part for mark in ended for part in (at, mark.run_id)]),
            ("ZREM", running, *[mark.run_id for mark in ended])]
        by_status: dict[str, list[Any]] = {}
        for mark in ended:
            by_status.setdefault(mark.status, []).extend((at, mark.run_id))
        for status, members in by_status.items():
            commands.append(("ZADD", self._status_set(status), *members))
        commands.append(("SADD", self.keys.run_statuses, *by_status))
        commands += [("HSET", self.keys.run_info(mark.run_id), "status", mark.status, "ended", at,
                      *(() if mark.dead_letter else (DEAD_LETTER, "")))
                     for mark in ended]
        return commands

    def commit_writes(self, source: str, run_id: str,
                      outputs: Iterable[Sequence[Any]]) -> list[Command]:
        """The writes of :meth:`mark` for one commit made on its own (a review's decision)."""
        mark = self.mark(source, run_id, outputs)
        return [] if mark is None else self.writes([mark])


def outcome_status(event_type: str, fields: Mapping[str, str]) -> str:
    """The status of a run ending with this entry (docs/reference.md, The API: /v1):
    ``data.status`` when a string, else the event type."""
    try:
        data = _json.loads(fields.get("data", "null"))
    except (_json.JSONDecodeError, ValueError):
        data = None
    return run_status({"stream": event_type, "data": data})


def committed(
    index: RunIndex, marks: Sequence[RunMark], at_ms: int | None = None
) -> IndexWrites | None:
    """The writes of ``marks`` under ``index`` for commit.lua (a committer's
    ``index_writes``: ``partial(committed, index)``), by name: :meth:`RunIndex.writes`'
    commands as the script's run index include makes them, each end only when the script
    kept that run's outcome (the run had not ended before it), so the first outcome stays
    the run's status. None: nothing to write."""
    at = now_ms() if at_ms is None else at_ms
    total: dict[str, float] = {}
    for mark in marks:
        if mark.costs:
            for unit, amount in mark.costs.items():
                total[unit] = total.get(unit, 0.0) + amount
    started = tuple(mark.run_id for mark in marks if mark.started)
    ended = tuple(IndexEnd(mark.info or index.keys.run_info(mark.run_id),
                           index._status_set(mark.status), mark.run_id, mark.status,
                           not mark.dead_letter)
                  for mark in marks if mark.status)
    if not total and not started and not ended:
        return None
    every, running = index._sets()
    minute, ttl = "", 0
    if total:
        minute = index.keys.cost_minute(at // 60_000)
        if at // 1000 != index._expire_sent:
            index._expire_sent = at // 1000
            ttl = COST_MINUTE_TTL
    return IndexWrites(at, every, running, started, minute, ttl,
                       tuple((unit, repr(float(amount))) for unit, amount in total.items()),
                       index.keys.run_statuses if ended else "", ended,
                       tuple(index.keys.run_info(run) for run in started))
