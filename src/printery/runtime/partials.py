"""Streaming through the gate (docs/reference.md, "Streaming through the gate"): what a
handler reports with :meth:`Message.partial <printery.Message.partial>` and the verdicts
that commit or retract it.

Partials are not entries of the run: they are provisional text a follower shows while an
attempt runs, and they are never replayed nor traced. They go to one capped stream per
run, ``<scope>:partials:<run>`` (:meth:`~printery.wire.keys.StreamKeys.partials`), beside
which followers read the run's entries; the stream lapses an hour after its last write.
A verdict (``kind`` ``verdict``) on the same stream closes an attempt: its partials are
committed (passed) or retracted (not passed, with the reasons), and a follower that
joins late shows only the partials after a step's last verdict, the attempt in progress.

A handler's path pays no round trip per chunk: :meth:`PartialWriter.add` appends to a
buffer (merged with the chunk before it of the same attempt) and one task per worker
writes what gathered every :data:`FLUSH_S` seconds with one pipelined round trip. The
attempt's end is the only wait: its partials and its verdict are on the server before
what the step commits (:meth:`PartialWriter.flush`), so no follower sees an outcome
before the verdict that led to it. A step that never calls ``partial`` pays nothing: no
buffer, no task, no key.

A process killed mid-attempt writes no verdict; the first partial of the entry's next
delivery goes after a ``restart`` mark, which followers take for the retraction of the
draft left open (:mod:`printery.runs.partials`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog

from printery.base import _json
from printery.base.errors import TIMEOUT_CANCEL, describe
from printery.transport.connection import Redis
from printery.wire.fields import ITEM
from printery.wire.keys import StreamKeys

__all__ = ["FLUSH_S", "MAXLEN", "TTL_S", "PartialWriter", "current", "passed", "retract",
           "using", "withdraw"]

log = structlog.get_logger("printery.partials")

#: Seconds chunks gather before they are written (one round trip for all of them).
FLUSH_S = 0.05
#: Entries a run's partials stream keeps at most (approximately): the start of an
#: attempt longer than that (in writes, not tokens) is lost to a follower joining late.
MAXLEN = 10_000
#: Seconds a run's partials stream outlives its last write.
TTL_S = 3600
#: Longest a failed handler's retraction is waited for before its failure goes on.
RETRACT_WAIT_S = 1.0
#: ``kind`` of the sorts of entry of a partials stream: a piece of a draft, the verdict
#: that closes it, and the mark a redelivered attempt writes before its first partial.
PARTIAL, VERDICT, RESTART = "partial", "verdict", "restart"
#: The reason code of a draft closed by a restart: the delivery that wrote it died.
REDELIVERED = "redelivered"


class Attempt(Protocol):
    """What a partial or a verdict is of: a handler call's message (a
    :class:`~printery.Message`), named without importing it (it calls this module)."""

    worker: str
    attempt: int
    envelope: Any

    @property
    def correlation_id(self) -> str: ...


def item_of(message: Attempt) -> str:
    """The Map item a message is of ("" for none): the concurrent items of one run
    stream drafts of their own."""
    return str(message.envelope.extra.get(ITEM, ""))


_writer: contextvars.ContextVar[PartialWriter | None] = contextvars.ContextVar(
    "printery_partials", default=None)


def current() -> PartialWriter | None:
    """The writer of the worker whose handler runs in this context (None outside one)."""
    return _writer.get()


def using(writer: PartialWriter | None) -> contextvars.Token[PartialWriter | None]:
    """Make ``writer`` the one of this context (a worker's run and every task it starts)."""
    return _writer.set(writer)


def verdict_fields(step: str, attempt: int, passed: bool,
                   reasons: Sequence[Mapping[str, Any]], item: str = "") -> dict[str, str]:
    """A verdict's fields (a restart mark's too, under its own ``kind``): followers parse
    both alike."""
    fields = {"kind": VERDICT, "step": step, "attempt": str(attempt),
              "passed": "1" if passed else "0", "reasons": _json.dumps(list(reasons))}
    if item:
        fields[ITEM] = item
    return fields


class PartialWriter:
    """Writes the partials and verdicts of every handler of one worker (see the module
    doc); :meth:`close` when the worker stops."""

    def __init__(self, client: Redis, keys: StreamKeys, *,
                 interval: float = FLUSH_S) -> None:
        self.client = client
        self.keys = keys
        self.interval = interval
        self._pending: list[tuple[str, dict[str, str]]] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def add(self, message: Attempt, text: str, *, restarted: bool = False) -> None:
        """Queue ``text`` as the next partial of ``message``'s attempt. ``restarted``: the
        first partial of a delivery after the first; a ``restart`` mark goes before it, which
        followers take for the retraction of a draft the earlier delivery left open (its
        process died before its verdict), and pass over when there is none."""
        key = self.keys.of(message.correlation_id).partials(message.correlation_id)
        step, attempt, item = message.worker, str(message.attempt), item_of(message)
        if restarted:
            mark = verdict_fields(step, message.attempt, False, [{
                "code": REDELIVERED, "field": "",
                "message": "an earlier delivery ended without a verdict (its process stopped)"}],
                item)
            self._queue(key, {**mark, "kind": RESTART})
        if self._pending:
            last_key, last = self._pending[-1]
            if (last_key == key and last["kind"] == PARTIAL and last["step"] == step
                    and last["attempt"] == attempt and last.get(ITEM, "") == item):
                last["text"] += text
                return
        fields = {"kind": PARTIAL, "step": step, "attempt": attempt, "text": text}
        if item:
            fields[ITEM] = item
        self._queue(key, fields)

    def verdict(self, message: Attempt, *, passed: bool,
                reasons: Sequence[Mapping[str, Any]] = ()) -> None:
        """Queue the verdict of ``message``'s attempt (written by the next flush)."""
        key = self.keys.of(message.correlation_id).partials(message.correlation_id)
        self._queue(key, verdict_fields(message.worker, message.attempt, passed, reasons,
                                        item_of(message)))

    def _queue(self, key: str, fields: dict[str, str]) -> None:
        self._pending.append((key, fields))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="printery-partials")
        self._wake.set()

    async def flush(self) -> None:
        """Write everything queued so far; raises what the server answered (the caller's
        entry fails and is delivered again, as for any write of its step)."""
        async with self._lock:
            await self._write()

    async def close(self) -> None:
        """Write what is left (a failure is logged: the worker is stopping) and stop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._pending:
            try:
                await self.flush()
            except Exception as exc:  # reported: partials are ephemeral
                log.warning("partials not written as the worker stopped", error=repr(exc))

    async def _run(self) -> None:
        """Write what gathered, every ``interval`` while anything is queued. A failure is
        logged and that batch dropped: partials are provisional, and the attempt's end
        (:meth:`flush`, awaited) raises what the server answers."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.interval)  # let the chunks of the interval gather
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # logged; the next flush goes on
                log.warning("partials not written", error=repr(exc), exc_info=exc)

    async def _write(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, fields in batch:
            pipe.xadd(key, fields, maxlen=MAXLEN, approximate=True)  # type: ignore[arg-type]
        for key in dict.fromkeys(key for key, _ in batch):
            pipe.expire(key, TTL_S)
        await pipe.execute()


#: The reason code of an attempt retracted because its handler failed (raised, timed
#: out, was cancelled) after it had shown partials.
FAILED = "work_failed"


async def passed(message: Attempt) -> None:
    """Commit what ``message``'s handler showed: its partials and a verdict that passed
    are on the server before its outputs are committed."""
    writer = current()
    if writer is not None:
        writer.verdict(message, passed=True)
        await writer.flush()


async def retract(message: Attempt, exc: BaseException) -> None:
    """Retract what ``message``'s handler showed before it failed with ``exc`` (the
    reasons name the failure), before the failure is handled: a handler cancelled at its
    step timeout too, so no follower meets the dead letter that ends a run before the
    retraction (see :func:`withdraw`)."""
    code = getattr(exc, "reason_code", None)
    if isinstance(exc, TimeoutError):
        code = "timeout"
    elif isinstance(exc, asyncio.CancelledError):
        code = "timeout" if exc.args[:1] == (TIMEOUT_CANCEL,) else "cancelled"
    await withdraw(message, [{"code": code if isinstance(code, str) and code else FAILED,
                              "field": "", "message": describe(exc)}])


async def withdraw(message: Attempt, reasons: Sequence[Mapping[str, Any]]) -> None:
    """Retract ``message``'s attempt with ``reasons`` when it will never be judged (its
    handler failed, or a budget stopped the run first). Waits at most
    :data:`RETRACT_WAIT_S`; never raises what the server answers (what ends the attempt
    is what the runtime must see, not a lost verdict).

    The write goes on past the wait: cut short, it would drop the verdict with the batch
    it was in (on a loaded machine a second passes), and the draft would stay open for
    ever. Its end is logged when it fails, whenever that is."""
    writer = current()
    if writer is None:
        return
    writer.verdict(message, passed=False, reasons=reasons)
    writing = asyncio.ensure_future(writer.flush())
    writing.add_done_callback(_retraction_written)
    await asyncio.wait({writing}, timeout=RETRACT_WAIT_S)


def _retraction_written(writing: asyncio.Future[None]) -> None:
    """Log a retraction the server did not take (a draft left open is shown as such)."""
    if not writing.cancelled() and (failed := writing.exception()) is not None:
        log.warning("retraction not written", error=repr(failed))


async def verdict(message: Attempt, *, passed: bool,
                  reasons: Sequence[Mapping[str, Any]]) -> None:
    """Publish the gate's verdict on ``message``'s attempt (a validator's judgement of
    an attempt that streamed), before what the gate commits."""
    writer = current()
    if writer is not None:
        writer.verdict(message, passed=passed, reasons=reasons)
        await writer.flush()


