"""Small helpers shared by every layer: clocks, ids, time formats."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import socket
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog


class _Clock:
    """The current time as RFC 3339 text and as hex milliseconds (an id's time part),
    both made once per millisecond: every output of a handler is stamped with both, and
    formatting a datetime costs more than the rest of an output's fields."""

    def __init__(self) -> None:
        self._ms = -1
        self._text = ""
        self._hex = ""

    def read(self) -> tuple[str, str]:
        """``(rfc 3339 text, hex milliseconds)`` of now."""
        ms = int(time.time() * 1000)
        if ms != self._ms:
            stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
            self._ms, self._text, self._hex = ms, stamp.replace("+00:00", "Z"), f"{ms:x}"
        return self._text, self._hex


def marked(handler: object, attr: str) -> Any:
    """The value of ``attr`` (a mark ``escalate`` sets on the function it returns) on
    ``handler`` or on a function it wraps: a user's own decorator without
    ``functools.wraps`` hides the marked function in its closure (or in ``__wrapped__``,
    a ``partial``, a bound method), and the pipeline must still see what it is; None when
    no function within a few wrappers carries it."""
    seen: set[int] = set()
    layer: list[object] = [handler]
    for _ in range(_MARK_DEPTH):
        below: list[object] = []
        for fn in layer:
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            found = getattr(fn, attr, None)
            if found is not None:
                return found
            for inner in (getattr(fn, "__wrapped__", None), getattr(fn, "func", None),
                          getattr(fn, "__func__", None)):
                if callable(inner):
                    below.append(inner)
            for cell in getattr(fn, "__closure__", None) or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    if callable(cell.cell_contents):
                        below.append(cell.cell_contents)
        layer = below
    return None


#: How many wrappers deep :func:`marked` looks for a mark.
_MARK_DEPTH = 4

_CLOCK = _Clock()
_random_bits = random.getrandbits


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 with milliseconds, the format of `produced_at`."""
    return _CLOCK.read()[0]


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or offset); naive input is taken as UTC."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def new_id(prefix: str) -> str:
    """A unique, sortable-enough id: ``<prefix>-<ms time hex>-<40 random bits, hex>``.

    Ids name events and runs; they are not secrets, so the fast generator serves."""
    return f"{prefix}-{_CLOCK.read()[1]}-{_random_bits(40):010x}"


def stamped_id(prefix: str) -> tuple[str, str]:
    """:func:`new_id` and :func:`now_rfc3339` from one reading of the clock: what every
    entry a worker writes carries (``event_id``, ``produced_at``)."""
    text, ms_hex = _CLOCK.read()
    return f"{prefix}-{ms_hex}-{_random_bits(40):010x}", text


def hostname() -> str:
    return socket.gethostname()


def consumer_name(worker: str, index: int) -> str:
    """Unique per host, process, worker and consumer index, as the contract asks."""
    return f"{hostname()}:{os.getpid()}:{worker}:{index}"


def as_text(value: bytes | str) -> str:
    """A reply as text, from a client that may not decode (``decode_responses=False``:
    the fields a user's own client read, say); printery's own clients decode already."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def stream_id_ms(entry_id: str) -> int:
    """Milliseconds part of a stream entry id (``1700000000000-3`` -> 1700000000000)."""
    return int(entry_id.split("-", 1)[0])


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; whether it is set.

    ``asyncio.timeout`` rather than ``asyncio.wait_for``: on Python 3.11, ``wait_for``
    can lose a cancellation that arrives as its timeout fires (and it runs the wait in a
    task of its own); a loop waiting this way would then outlive its worker's stop.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


def fail_waiters(
    futures: Iterable[asyncio.Future[Any]], exc: BaseException, what: str
) -> None:
    """A batch's round trip failed with ``exc``: every caller still waiting on it learns
    so through its future (a cancellation of the one that sent it becomes a
    ``ConnectionError``: ``what`` interrupted, for the others)."""
    failure = exc if isinstance(exc, Exception) else ConnectionError(f"{what} interrupted")
    for future in futures:
        if not future.done():
            future.set_exception(failure)


def log_failure(task: asyncio.Future[Any]) -> None:
    """Done callback of a background task: an exception it ended with is logged at error
    level with its traceback (and so retrieved), never lost with the task."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
    structlog.get_logger("printery.tasks").error(
        "background task failed", task=name, error=f"{type(exc).__name__}: {exc}", exc_info=exc)



def check_cancelled() -> None:
    """Raise :class:`asyncio.CancelledError` if the current task was asked to stop and
    is running on anyway: a cancellation can be lost on its way.

    redis-py 6.4 checks a pooled connection with ``asyncio.timeout(0)`` before each
    command, and that timeout swallows a cancellation requested just before it (CPython
    gh-134471; measured here: 7 % of the cancellations of a task in a tight command loop).
    The command then runs on as if nothing happened; only the task's count of
    cancellation requests (``cancelling()``) still tells. A background loop calls this at
    each turn, so it ends however its cancellation went."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def idle(seconds: float) -> None:
    """The pause between two rounds of a background loop, which ends the loop when its
    task was cancelled, also when the cancellation was lost mid-command or answered with
    a connection or timeout error the loop tolerates (:func:`check_cancelled`)."""
    check_cancelled()
    await asyncio.sleep(seconds)


#: Tasks known to ignore their cancellation (a handler call given up on at its timeout).
_GIVEN_UP: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def give_up(task: asyncio.Task[Any]) -> None:
    """Mark ``task`` as one that ignores its cancellation: :func:`stop_tasks` cancels it
    once more and does not wait for it (a stop would only wait out its timeout)."""
    _GIVEN_UP.add(task)


def given_up(task: asyncio.Task[Any]) -> bool:
    return task in _GIVEN_UP


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], timeout: float,
                     *, again_after: float = 0.5) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait up to ``timeout`` seconds for them to end; those still
    running after ``again_after`` seconds are cancelled again (a cancellation can be lost,
    see :func:`check_cancelled`), and so on. Returns the tasks still running at
    ``timeout``, for the caller to name in its log: a stop never waits without bound.
    Tasks given up on (:func:`give_up`) are cancelled, not waited for."""
    pending = {task for task in tasks if not task.done()}
    hopeless = {task for task in pending if task in _GIVEN_UP}
    for task in hopeless:
        task.cancel()
    pending -= hopeless
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(again_after, left))
    return pending | {task for task in hopeless if not task.done()}


def where(task: asyncio.Task[Any]) -> str:
    """Where ``task`` is suspended: its chain of awaits, innermost first, for the log
    line about a task that did not stop."""
    frames: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(frames) < 12:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            break
        code = frame.f_code
        frames.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None)
    return " < ".join(reversed(frames)) or "done"


#: Net new container objects between two young-generation collections in a worker
#: process (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """Set the cyclic garbage collector for a long-running worker process, once it is set
    up (every module imported, the workers built).

    Why: a worker makes a few dozen short-lived containers per entry (fields, envelope,
    message, task, commit), nearly all freed by reference counting; but a read batch
    keeps a hundred entries' worth alive at once, so at the default threshold the young
    generation is collected every few entries and the survivors are promoted until a full
    collection walks every object of the process, the tens of thousands that imports made
    included. Measured on the bench: a tenth to a fifth of a worker's CPU. Freezing
    what exists now takes those out of every later collection; a higher young threshold
    collects a little more garbage a little less often (a few MB at most)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(max(GC_YOUNG_THRESHOLD, gc.get_threshold()[0]), middle, old)


#: Significant digits of a cost amount that is not a whole number, as text.
AMOUNT_DIGITS = 6


def amount(value: object) -> str:
    """A cost amount as text (``trace``, ``cost``'s tables, the console; JSON keeps the
    number): a whole number in full (a million tokens, not ``1e+06``), any other to
    :data:`AMOUNT_DIGITS` significant digits, without an exponent from a million up (a
    sum of floats carries their noise: ``0.00014000000000000001`` usd is ``0.00014``),
    and what is not a number as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    text = f"{value:.{AMOUNT_DIGITS}g}"
    return f"{value:.2f}" if "e+" in text else text


def amounts(cost: Mapping[str, object] | None, *, joiner: str = ",", between: str = "=") -> str:
    """``unit=amount`` pairs (:func:`amount`) in the mapping's order ("" for none)."""
    return joiner.join(f"{unit}{between}{amount(value)}" for unit, value in (cost or {}).items())
