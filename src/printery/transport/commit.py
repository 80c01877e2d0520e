"""The commit protocol: one atomic unit per handled entry (its outputs, its ack and its
idempotency record, or nothing), many entries per round trip.

A commit is a transaction (:func:`commit_commands`): ``MULTI``, a plain ``XADD`` per
output, then ``commit.lua``, which keeps or withdraws each entry's outputs after checking
that the entry is still ours (the fence) and that its idempotency key has no record yet,
then acks; ``EXEC``. This module is the Python half of that script's argument encoding
(:func:`commit_run`); ``tests/integration/test_commit_transaction.py`` runs the script's
own argument parser on what this module encodes, so the two halves cannot drift apart.

:class:`Committer` is the one way to send commits: commits of entries that finish at
about the same time share one round trip, while each entry stays atomic on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple, cast

import redis.asyncio as aioredis
import structlog
from redis.exceptions import NoScriptError, ResponseError

from printery.base._util import check_cancelled, fail_waiters
from printery.transport.channel import Command, DirectChannel
from printery.transport.scripts import Scripts, script
from printery.wire.keys import budget_warning_key_parts, record_sets, warned_field

Fields = Mapping[str, str]

#: A commit's result for an entry fenced out (another consumer owns it now).
FENCED = -1
#: A commit's result for an entry whose idempotency key already had a record.
DUPLICATE = 0
#: Entries per script run: bounds how long one run holds the server (other clients wait
#: while a script runs); a flush with more sends several runs in the same write.
MAX_ENTRIES_PER_RUN = 128

#: A budget hash holds what a run spent as whole billionths of a unit, so that a commit
#: adds with ``HINCRBY``: in the server's script an integer add costs under half what a
#: float add does (``HINCRBYFLOAT`` parses and prints a long double and rewrites itself
#: for propagation), and the sums are exact. A run may count up to about 9.2e9 units.
SPENT_SCALE = 10**9
#: The most a budget field counts (a commit that would pass it stops there).
SPENT_MAX = 2**63 - 1

log = structlog.get_logger("printery.commit")

COMMIT_SCRIPT = script("commit")
COMMIT_LUA = COMMIT_SCRIPT.source
#: The line of commit.lua (assembled) after which its arguments are parsed (the test runs
#: the script up to there with a decoder of its own).
ARGUMENTS_PARSED = "-- end of argument parsing"


class Append(NamedTuple):
    """One output of a commit: the stream to append to, the entry's fields, and a once
    key ("" for none) that makes it written at most once, ever."""

    stream: str
    fields: Fields
    once: str = ""


class ChargePlan(NamedTuple):
    """How one step's commits charge their runs' budgets (docs/reference.md, Budgets), the same for
    each of its entries: each charged amount goes to its field of the hash ``prefix +
    run``. A field with a ``soft`` threshold (None: none) whose total reaches it in a
    commit writes one ``warning`` entry to ``warning_stream``, once per run and field:
    ``warning`` with ``data`` = ``note`` + the spent + ``}``, ``corr`` = the run and an
    event id and idempotency key of its own. A field with a ``hard`` limit (none when
    ``hard`` is empty or the field's is None) whose total reaches it puts the run in the
    sorted set ``over`` (scored by when its budget hash lapses at the latest): the runs a
    check before handlers must read (see :mod:`printery.runtime.budget_guard`). ``columns``:
    per field, which of a charge's amounts it adds (fields of one unit, the run's and
    the step's, share one: an argument less per entry); empty, field ``j`` adds the
    ``j``-th. ``soft`` and ``hard`` are in units; the hash counts billionths of one
    (:data:`SPENT_SCALE`). ``reserved``: the prefix of the runs' reservations hashes of a
    step that reserves its estimate before running (each commit removes its entry's,
    keyed by its idempotency record); "" for one that does not."""

    prefix: str
    fields: tuple[str, ...]
    soft: tuple[float | None, ...]
    notes: tuple[str, ...]
    corr: str
    warning_stream: str
    warning: Fields
    hard: tuple[float | None, ...] = ()
    over: str = ""
    columns: tuple[int, ...] = ()
    reserved: str = ""


class BudgetCharge(NamedTuple):
    """What an entry's commit adds to its run's spent, only if the entry commits: each
    of ``amounts`` (as :func:`encode_amount` writes them) to the fields of ``plan`` that
    add it (see :attr:`ChargePlan.columns`)."""

    plan: ChargePlan
    run: str
    amounts: tuple[str, ...]


class IndexEnd(NamedTuple):
    """A run's end in the run index: its ``info`` hash and its status's set (keys), its
    id and ``status``; ``clears``: its outcome is no dead letter's (the info's
    ``dead_letter`` is cleared). Written only when the commit kept that run's outcome."""

    info: str
    status_set: str
    run: str
    status: str
    clears: bool


class IndexWrites(NamedTuple):
    """The run index's writes of one commit, by name (commit.lua's ``run_index`` include;
    :class:`~printery.runtime.run_index.RunIndex` makes them): at ``at`` ms, the
    ``started`` runs go into ``every`` and ``running``, ``costs`` (unit, amount) add to
    the ``minute`` hash (its ttl set again when ``minute_ttl``), the ``ended`` runs
    leave ``running`` for their status's set and are named in ``statuses``."""

    at: int
    every: str = ""
    running: str = ""
    started: tuple[str, ...] = ()
    minute: str = ""
    minute_ttl: int = 0
    costs: tuple[tuple[str, str], ...] = ()
    statuses: str = ""
    ended: tuple[IndexEnd, ...] = ()
    #: The info hash of each of ``started``: a run that has ended (cancelled before its
    #: first entry was handled) is not put among the running ones again.
    started_info: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadLetterWrite:
    """Everything one dead letter writes (a commit of its own kind: :class:`EntryCommit`
    ``letter``). ``consumer`` "" takes the entry from whoever holds it (an operator's
    ``printery pending dlq``). ``outcome`` "" ends no run (the entry names none); else
    the run's ``run:failed`` stream, ``outcome_fields`` its entry (its ``data`` is
    ``data_before`` + the dlq id + ``data_after``), ``run_info`` the run's index hash (a
    run ended with another status gets no outcome) and ``index`` the index's writes for
    it. ``last_error`` the key of the entry's last error record, removed with it ("" none).
    ``entry_id`` "" dead-letters what no entry holds (a join a sweep decided: no fence,
    no ack); ``once`` a key that makes it written at most once (kept ``once_ttl_ms``), ""
    none. ``ends_run`` False writes ``outcome_fields`` to ``outcome`` as a plain entry (a
    skipped Map item's result for its collector): no run ends, the index is not touched.
    ``reservation`` the entry's field in its run's reservations hash ``reserved`` (a
    step's ``estimate=``), removed with it ("" none)."""

    source: str
    group: str
    consumer: str
    entry_id: str
    dlq: str
    letter: Mapping[str, str]
    outcome: str = ""
    outcome_fields: Mapping[str, str] = field(default_factory=dict)
    data_before: str = ""
    data_after: str = ""
    run_info: str = ""
    index: IndexWrites | None = None
    last_error: str = ""
    once: str = ""
    once_ttl_ms: int = 0
    ends_run: bool = True
    reserved: str = ""
    reservation: str = ""


class StopCheck(NamedTuple):
    """The commit's check that an entry's run has not stopped (cancelled, or failed with
    ``on_failure="cancel"``): the partition's ``stopped`` runs, its ``withheld`` stream
    (where the figures of a call whose outputs are withheld go) and the entry's ``run``."""

    stopped: str
    withheld: str
    run: str


class EntryCommit(NamedTuple):
    """One entry's part of a commit. ``entry_id`` "" means outputs caused by no entry
    (no ack, no fence); ``record`` "" means no idempotency record; ``budget`` what its
    commit adds to its run's budget (None: nothing); ``mark`` what the entry tells the
    committer's ``index_writes`` (None: nothing; a run index's
    :class:`~printery.runtime.run_index.RunMark`), which turns the marks of the entries of
    one script run into the :class:`IndexWrites` that script run makes whatever its
    verdict, so idempotent ones: a few for all of them rather than some for each. A
    mark's ``ends`` (positions in ``appends``) are outcomes of its run, withheld when its
    ``info`` hash says the run has ended: a run gets one outcome (when the first output is
    withheld, a copy of its figures goes to the mark's ``withheld`` stream: the call's
    cost was charged). ``letter``: this entry
    is dead-lettered (its ``appends`` are empty); its result is the dlq entry's id, or
    :data:`FENCED`. ``stop``: none of its outputs is written when its run has stopped
    (the check is in the commit, whichever process makes it)."""

    source: str
    consumer: str
    entry_id: str
    record: str
    appends: Sequence[Append]
    budget: BudgetCharge | None = None
    mark: Any = None
    letter: DeadLetterWrite | None = None
    stop: StopCheck | None = None


@dataclass(frozen=True, slots=True)
class CommitRun:
    """The script's keys and arguments for a run of entries, the outputs to append before
    it in order, and each entry's output count."""

    keys: list[str]
    args: list[Any]
    appends: list[Append]
    output_counts: list[int]


#: Turns the marks of the entries of one script run into its index writes (see
#: ``EntryCommit``; None: nothing to write).
IndexWritesOf = Callable[[list[Any]], "IndexWrites | None"]


def commit_run(
    index_key: str, group: str, ttl_ms: int, entries: Sequence[EntryCommit],
    index_writes: IndexWritesOf | None = None,
) -> CommitRun:
    """One run over ``entries`` of ``group``, whose idempotency records live under
    ``index_key`` for at least ``ttl_ms``, with ``index_writes`` of their marks.
    Consecutive entries of one shape (source, consumer, record or not, output streams
    and whether each has a once key, the budget fields they charge) form a segment whose
    per-entry values go as columns: the script hands them to its commands whole; a dead
    letter is a segment of its own. Every key goes in ``keys``, every value in ``args``,
    each in the order commit.lua reads them (docs/engine.md, The Lua library)."""
    # The records' keys only when an entry carries one (a dead letter alone has none).
    recorded = any(entry.record and entry.letter is None for entry in entries)
    keys: list[str] = [index_key, *record_sets(index_key)] if recorded else []
    args: list[Any] = [group, ttl_ms, 1 if recorded else 0, 0]
    appends: list[Append] = []
    marks: list[Any] = []
    counts: list[int] = []
    indexes: list[IndexWrites] = []
    segment: list[EntryCommit] = []
    shape: tuple[Any, ...] = ()
    segments = 0
    for entry in entries:
        if entry.letter is not None:
            if segment:
                _add_segment(keys, args, segment, shape)
                segments += 1
                segment, shape = [], ()
            _add_letter(keys, args, entry.letter)
            segments += 1
            counts.append(0)
            if entry.letter.index is not None:
                indexes.append(entry.letter.index)
            continue
        source = entry.source if entry.entry_id else ""
        ends = _ends(entry)
        stop = entry.stop
        entry_shape = (source, entry.consumer if source else "", not entry.record,
                       entry.budget.plan if entry.budget is not None else None,
                       None if stop is None or not entry.appends else stop[:2],
                       *[(out.stream, not out.once, slot in ends)
                         for slot, out in enumerate(entry.appends)])
        if entry_shape != shape and segment:
            _add_segment(keys, args, segment, shape)
            segments += 1
            segment = []
        shape = entry_shape
        segment.append(entry)
        counts.append(len(entry.appends))
        appends += entry.appends
        if entry.mark is not None:
            marks.append(entry.mark)
    if segment:
        _add_segment(keys, args, segment, shape)
        segments += 1
    args[3] = segments
    if marks and index_writes is not None:
        written = index_writes(marks)
        if written is not None:
            indexes.insert(0, written)
    args.append(len(indexes))
    for writes in indexes:
        _add_index(keys, args, writes)
    return CommitRun(keys, args, appends, counts)


def _add_segment(
    keys: list[str], args: list[Any], segment: list[EntryCommit], shape: tuple[Any, ...]
) -> None:
    source, consumer, unrecorded, budget, stop, *outputs = shape
    args += ("entries", len(segment))
    if source:
        keys.append(source)
        args += (1, consumer)
    else:
        args.append(0)
    args += ("0" if unrecorded else "1", len(outputs), len(budget.fields) if budget else 0)
    for stream, no_once, ends in outputs:
        keys.append(stream)
        args.append(str((0 if no_once else 1) + (2 if ends else 0)))
    if any(ends for _, _, ends in outputs):  # one partition's outputs: one run's stream
        keys.append(segment[0].mark.withheld)
    if stop is None:
        args.append(0)
    else:
        keys += stop
        args.append(1)
    columns = _add_budget_plan(keys, args, budget) if budget else ()
    if source:
        args += [entry.entry_id for entry in segment]
    if not unrecorded:
        args += [entry.record for entry in segment]
    if stop is not None:
        args += [entry.stop.run for entry in segment]  # type: ignore[union-attr]
    for slot, (_, no_once, ends) in enumerate(outputs):
        if not no_once:
            keys += [entry.appends[slot].once for entry in segment]
        if ends:
            keys += [entry.mark.info for entry in segment]
    if budget:  # every entry of the segment charges (its shape has the plan)
        charges = [entry.budget for entry in segment]
        keys += [budget.prefix + charge.run for charge in charges]  # type: ignore[union-attr]
        if budget.reserved:
            keys += [budget.reserved + charge.run for charge in charges]  # type: ignore[union-attr]
        args += [charge.run for charge in charges]  # type: ignore[union-attr]
        for column in range(max(columns, default=-1) + 1):
            args += [charge.amounts[column] for charge in charges]  # type: ignore[union-attr]


def _add_budget_plan(keys: list[str], args: list[Any], budget: ChargePlan) -> tuple[int, ...]:
    """A segment's budget plan (the ``budget`` include's ``budget_plan`` reads it); the
    amount column of each field."""
    template = list(chain.from_iterable(budget.warning.items()))
    columns = budget.columns or tuple(range(len(budget.fields)))
    keys.append(budget.warning_stream)
    args += (budget.corr, SPENT_SCALE, max(columns, default=-1) + 1)
    if budget.over:
        keys.append(budget.over)
    args += (1 if budget.over else 0, 1 if budget.reserved else 0, len(template), *template,
             len(budget.fields))
    hard = budget.hard or (None,) * len(budget.fields)
    for name, soft, limit, note, column in zip(budget.fields, budget.soft, hard,
                                               budget.notes, columns, strict=True):
        before, after = budget_warning_key_parts(name)
        args += (name, warned_field(name), encode_limit(soft), encode_limit(limit), note,
                 column + 1, before, after)
    return columns


def _add_letter(keys: list[str], args: list[Any], letter: DeadLetterWrite) -> None:
    """A dead letter's segment (commit.lua's ``letter`` include reads it)."""
    args += ("letter", letter.entry_id, letter.consumer)
    keys.append(letter.dlq)
    if letter.entry_id:
        keys.append(letter.source)
    fields = list(chain.from_iterable(letter.letter.items()))
    args += (len(fields), *fields)
    outcome = list(chain.from_iterable(letter.outcome_fields.items())) if letter.outcome else []
    args.append(len(outcome))
    if outcome:
        keys += (letter.outcome, letter.run_info)
        args += ("1" if letter.ends_run else "0", letter.data_before, letter.data_after, *outcome)
    for present, key, value in ((letter.last_error, letter.last_error, None),
                                (letter.once, letter.once, letter.once_ttl_ms),
                                (letter.reservation, letter.reserved, letter.reservation)):
        args.append(1 if present else 0)
        if present:
            keys.append(key)
            if value is not None:
                args.append(value)


def _add_index(keys: list[str], args: list[Any], writes: IndexWrites) -> None:
    """One run index's writes (commit.lua's ``run_index`` include reads them)."""
    args += (writes.at, len(writes.started), len(writes.costs), len(writes.ended),
             len(writes.started_info))
    if writes.started or writes.ended:
        keys += (writes.every, writes.running)
    args += writes.started
    keys += writes.started_info
    if writes.costs:
        keys.append(writes.minute)
        args.append(writes.minute_ttl)
        args += chain.from_iterable(writes.costs)
    if writes.ended:
        keys.append(writes.statuses)
    for end in writes.ended:
        keys += (end.info, end.status_set)
        args += (end.run, end.status, "1" if end.clears else "0")


def _ends(entry: EntryCommit) -> tuple[int, ...]:
    """The outputs of ``entry`` that end its run (its mark's ``ends``: the script
    withholds them when the run's info hash, the mark's ``info``, says it ended)."""
    mark = entry.mark
    return () if mark is None else tuple(getattr(mark, "ends", ()))


def encode_limit(value: float | None) -> str:
    """A threshold or limit as the scripts compare it with a budget hash's count ("":
    none)."""
    return "" if value is None else repr(float(value) * SPENT_SCALE)


def encode_amount(value: float) -> str:
    """An amount as a budget hash counts it: whole billionths of the unit, as ``HINCRBY``
    takes them ("0": nothing to add). Past what a field counts, the most it counts (the
    run is over any limit then); an amount that is no number adds nothing."""
    if value == 0 or value != value:  # nothing, or NaN
        return "0"
    if isinstance(value, int):
        scaled = value * SPENT_SCALE
    elif abs(value) < SPENT_MAX / SPENT_SCALE:
        scaled = round(value * SPENT_SCALE)
    else:
        scaled = SPENT_MAX if value > 0 else -SPENT_MAX
    return str(max(-SPENT_MAX, min(SPENT_MAX, scaled)))


def decode_spent(value: str | bytes | None) -> float:
    """What a budget hash field holds, in units (0 for none, and for a value that is not a
    count, as the scripts read it)."""
    try:
        return int(value or 0) / SPENT_SCALE
    except ValueError:
        return 0.0


def commit_commands(run: CommitRun) -> list[Command]:
    """``MULTI``, a plain ``XADD`` per output, the script by its SHA, ``EXEC``.

    Why not write the outputs from the script: every argument of a script is allocated
    again as a Lua string and again when the script calls ``XADD``; that made the script
    cost the server about four times what the ``XADD`` does. By SHA (``EVALSHA``), not
    ``EVAL`` of its 18 KB: sending, packing and hashing the source on every commit cost
    both sides more than the script's own work at low load. The committer's connection
    loads the script before its first commit (:class:`DirectChannel`'s ``preload``); a
    server that forgot it meanwhile (``SCRIPT FLUSH``) is :meth:`Committer._forgotten`'s."""
    commands: list[Command] = [("MULTI",)]
    for stream, fields, _ in run.appends:
        commands.append(("XADD", stream, "*", *chain.from_iterable(fields.items())))
    commands.append(("EVALSHA", COMMIT_SCRIPT.sha, len(run.keys), *run.keys, *run.args))
    commands.append(("EXEC",))
    return commands


def commit_results(run: CommitRun, reply: Any) -> list[Any]:
    """Each entry's result from the script's reply: :data:`FENCED`, :data:`DUPLICATE`,
    ``1 +`` the number of outputs kept, a dead letter's dlq entry id, or the error of an
    entry that could not commit. A reply that is an error fails every entry of the run.
    The run index's errors, when the reply has them, are logged (:func:`index_errors`)."""
    if isinstance(reply, Exception):
        return [reply] * len(run.output_counts)
    if isinstance(reply, int):  # every entry committed with all its outputs
        if reply != len(run.output_counts):
            error = ResponseError(f"commit decided {reply} entries of {len(run.output_counts)}")
            return [error] * len(run.output_counts)
        return [1 + count for count in run.output_counts]
    results = cast(list[Any], reply)
    errors = index_errors(run, results)
    if errors:
        log.warning("run index writes failed (the commit stands)", errors=errors)
        results = results[: len(run.output_counts)]
    return [entry.decode() if isinstance(entry, bytes) else entry for entry in results]


def index_errors(run: CommitRun, reply: Any) -> list[str]:
    """The errors of the run index's writes a commit's reply carries (after its entries'
    results: the commit stands, the index missed them)."""
    if isinstance(reply, list) and len(reply) == len(run.output_counts) + 1:
        return [e.decode() if isinstance(e, bytes) else str(e) for e in reply[-1]]
    return []


async def commit_alone(scripts: Scripts, entries: Sequence[EntryCommit]) -> list[Any]:
    """Commit entries that append nothing (dead letters) with one script run over
    ``scripts``, outside a committer (an operator's, a join's sweep): the same script,
    with no ``XADD`` before it, so no transaction."""
    assert not any(entry.appends for entry in entries), "outputs need the transaction"
    letter = next(entry.letter for entry in entries if entry.letter is not None)
    run = commit_run("", letter.group, 0, entries)
    try:
        reply = await scripts.call(COMMIT_SCRIPT, run.keys, run.args)
    except ResponseError as exc:
        reply = exc
    return commit_results(run, reply)


_Queued = tuple[Sequence[EntryCommit], "asyncio.Future[list[Any]]"]


class Committer:
    """Sends commits for one consumer group; every commit of the group goes through it.

    Commits queue while a flush is on the wire and go together in the next one, so the
    batch grows with the load and nothing waits for a timer. At low load the caller
    flushes from its own task (no hand-over to the committer task). A failed round trip
    fails every caller in it; callers retry: the script is idempotent through its record
    and fenced by ownership, so a retry after a lost reply cannot write twice.
    """

    def __init__(
        self, client: aioredis.Redis, *, index_key: str, group: str, ttl_ms: int,
        index_writes: IndexWritesOf | None = None,
    ) -> None:
        self._channel = DirectChannel(client, preload=[COMMIT_SCRIPT])
        self._header = (index_key, group, ttl_ms)
        self._index_writes = index_writes
        self._queue: list[_Queued] = []
        self._wake = asyncio.Event()
        self._busy = False

    async def commit(self, entries: Sequence[EntryCommit]) -> list[Any]:
        """Commit entries; each one's result (see :func:`commit_results`). Raises the
        client's connection errors when the round trip failed. Shielded: a caller
        cancelled meanwhile does not cancel the commit of the others in its flush."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((entries, future))
        self._wake.set()
        if not self._busy:
            await self._drain(once=True)
        return await asyncio.shield(future)

    async def run(self) -> None:
        """Flush what no caller leads, until cancelled; then fail whoever still waits."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._busy and self._queue:
                    await self._drain()
                    check_cancelled()  # a cancellation the flush's commands lost
        finally:
            queued, self._queue = self._queue, []
            for _, future in queued:
                if not future.done():
                    future.set_exception(ConnectionError("committer stopped"))
            await self.close()

    async def close(self) -> None:
        """Close the committer's connection (a later commit opens a new one)."""
        await self._channel.close()

    async def _drain(self, *, once: bool = False) -> None:
        """Flush until the queue is empty (``once``: one flush, so a leading caller is held
        up by one round trip at most; the committer task takes what queued since)."""
        self._busy = True
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._flush(batch)
                if once:
                    break
        finally:
            self._busy = False
            if self._queue:
                self._wake.set()

    async def _flush(self, batch: list[_Queued]) -> None:
        entries = [entry for group, _ in batch for entry in group]
        runs = [commit_run(*self._header, entries[i : i + MAX_ENTRIES_PER_RUN], self._index_writes)
                for i in range(0, len(entries), MAX_ENTRIES_PER_RUN)]
        try:
            replies = await self._channel.transactions([commit_commands(run) for run in runs])
            if any(map(_forgotten, replies)):
                replies = await self._forgotten(runs, replies)
        except BaseException as exc:
            # Connection trouble, or the flushing task was cancelled mid-reply.
            fail_waiters((future for _, future in batch), exc, "commit")
            if not isinstance(exc, Exception):
                raise
            return
        results: list[Any] = []
        for run, executed in zip(runs, replies, strict=True):
            results += commit_results(run, executed if isinstance(executed, Exception) else executed[-1])
        start = 0
        for group, future in batch:
            if not future.done():
                future.set_result(results[start : start + len(group)])
            start += len(group)

    async def _forgotten(self, runs: list[CommitRun], replies: list[Any]) -> list[Any]:
        """Commit again the runs whose script the server had forgotten (``SCRIPT FLUSH``
        between two commits). The transaction's ``XADD``s ran without it, so nothing
        decided them: they are deleted first, then the script is loaded and the runs sent
        again; they acked and recorded nothing, so that is safe. A reader that took one of
        the deleted outputs meanwhile commits it once: the copy the retry writes carries
        the same idempotency key, and that reader's commit finds it recorded."""
        again = [n for n, executed in enumerate(replies) if _forgotten(executed)]
        await self._withdraw([(runs[n], replies[n]) for n in again])
        self._channel.forget_scripts()
        retried = await self._channel.transactions([commit_commands(runs[n]) for n in again])
        if any(map(_forgotten, retried)):  # flushed once more between the two
            await self._withdraw([(runs[n], executed) for n, executed in zip(again, retried, strict=True)
                                  if _forgotten(executed)])
        replies = list(replies)
        for n, executed in zip(again, retried, strict=True):
            replies[n] = executed
        return replies

    async def _withdraw(self, executed: list[tuple[CommitRun, list[Any]]]) -> None:
        """Delete the outputs that transactions wrote without their script."""
        commands: list[Command] = [("XDEL", append.stream, entry_id)
                                   for run, replies in executed
                                   for append, entry_id in zip(run.appends, replies, strict=False)
                                   if isinstance(entry_id, str | bytes)]
        if commands:
            await self._channel.commands(commands)


def _forgotten(executed: Any) -> bool:
    """Whether a transaction ran without its script (the server did not know the SHA)."""
    return isinstance(executed, list) and bool(executed) and isinstance(executed[-1], NoScriptError)
