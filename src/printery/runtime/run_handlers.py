"""How the handlers of a read batch run, and their entries commit as they finish (the
*handle* and *commit* steps of :mod:`printery.runtime.consume`).

Each handler runs once it has a slot: one after another in the batch's own task while
the step's handlers neither wait on I/O nor set context variables, else each in a task
of its own. A task per handler cost about 4 µs of a 30 µs hop on Python 3.11, and a
batch of two or three waited a turn of the loop for its tasks (3.12's eager tasks cost
neither); what a task of its own gives a handler is kept (see :meth:`HandlerRunner.in_turn`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from printery.base._util import given_up, log_failure
from printery.runtime.accounting import Decided
from printery.runtime.consumer import Consumer, Delivery
from printery.runtime.handler import Message
from printery.runtime.spans import HandleEntry
from printery.store.outage import Outage

#: Python 3.12+ runs a new task's first step at once (a handler that never awaits then
#: costs no scheduling); 3.11 schedules it.
_eager: Any = getattr(asyncio, "eager_task_factory", None)


def _task(
    coro: Coroutine[Any, Any, Decided | None], context: contextvars.Context | None = None,
) -> asyncio.Task[Decided | None]:
    loop = asyncio.get_running_loop()
    if _eager is not None:
        return _eager(loop, coro, context=context)  # type: ignore[no-any-return]
    return loop.create_task(coro, context=context)


#: How often a batch waiting for its handlers looks for calls given up on meanwhile.
GIVE_UP_CHECK_SECONDS = 1.0


class HandlerRunner:
    """Runs the handlers of one step's batches (``handle`` takes an entry to its decision)
    and has their entries committed (``commit``) as they finish; ``connectivity`` carries
    the worker's stop signal."""

    def __init__(
        self, handle: HandleEntry[Decided],
        commit: Callable[[list[Decided], float], Awaitable[None]], connectivity: Outage,
    ) -> None:
        self.handle = handle
        self.commit = commit
        self.connectivity = connectivity
        #: Set once a handler changed its task's context variables: from then on every
        #: handler of a batch gets a task of its own (see :meth:`in_turn`).
        self.isolate = False

    async def run(
        self, admitted: list[tuple[Delivery, Message]], decided: list[Decided], begun: float,
        *, read: int,
    ) -> bool:
        """Handle ``admitted`` and commit them with
        ``decided``, of a batch of ``read`` entries that began at ``begun``. True when the
        worker stopped first: what did not start is then left held for the drain."""
        if admitted and (len(admitted) == 1 or (admitted[0][0].consumer.fast and not self.isolate)):
            return await self.in_turn(admitted, decided, begun, read)
        running = self._start(admitted)
        return await self._commit_as_done(running, decided, begun,
                                          adapt=admitted[0][0].consumer if admitted else None)

    async def in_turn(
        self, admitted: list[tuple[Delivery, Message]], decided: list[Decided], begun: float,
        read: int,
    ) -> bool:
        """Run the handlers one after another in this task while they neither wait on I/O
        nor change a context variable; the rest each in a task of its own. True when the
        worker stopped first: what did not start is then left held for the drain.

        What a task of its own gives a handler is kept. Every handler starts in the
        context the batch began in: the ones before it here changed nothing, or the rest
        start in tasks made in that context (and the batch's own lines are written in
        it). ``asyncio.timeout`` and ``TaskGroup`` bind to the task it runs in. And none
        waits for another: a callback scheduled as this begins runs only once this task
        gives the loop a turn, that is once the handler running here waits, and starts
        the rest in tasks then, which commit as they finish, without waiting for this
        one. The consumer learns its handlers wait (:meth:`Consumer.adapt`), and its next
        batch starts every handler in a task."""
        loop = asyncio.get_running_loop()
        clean = contextvars.copy_context()
        task = asyncio.current_task()
        begun_here = 0  # the position of the handler running here
        running: list[asyncio.Task[Decided | None]] | None = None
        #: The commits of the rest, once they started while the handler here waits.
        rest_settled: asyncio.Task[bool] | None = None
        left_held = False

        def start_the_rest() -> None:
            nonlocal running, left_held, rest_settled
            left_held = self.connectivity.stopped()
            rest = [] if left_held else admitted[begun_here + 1 :]
            running = self._start(rest, clean)
            # Committed as they finish, not once the handler here is done: one of them
            # may hold the only slot (``parallel=1``, an aggregator's) that a retry of
            # the handler here waits for after its backoff, which gave that slot back.
            # The entries decided before it go with them: the handler here may never end
            # (one that swallows its cancellation is given up on, not ended).
            before, decided[:] = decided[:], []
            rest_settled = loop.create_task(self._commit_as_done(running, before, begun),
                                            context=clean.copy())

        signal = loop.call_soon(start_the_rest)
        dirty = False
        try:
            while begun_here < len(admitted) and running is None:
                delivery, message = admitted[begun_here]
                if not delivery.slot and not delivery.consumer.has_slot():
                    # No slot free: the ones this batch decided hold theirs until their
                    # commit, which comes after this loop; waiting here for another
                    # would wait for ever once every batch did the same. The rest start
                    # in tasks of their own and the decided commit first.
                    break
                delivery.task = task
                result = await self.handle(delivery, message)
                if result is not None:
                    decided.append(result)
                if contextvars.copy_context() != clean:
                    self.isolate = dirty = True  # from now on: a task per handler
                    break
                begun_here += 1
        except BaseException:
            for started in running or ():
                started.cancel()
                started.add_done_callback(log_failure)
            _abandon(rest_settled)
            raise
        finally:
            signal.cancel()
        consumer = admitted[0][0].consumer
        consumer.adapt(fast=running is None)
        if running is None:  # nobody waited: what is left here, the rest of a dirty batch
            begun_here += dirty
            start_the_rest_now = admitted[begun_here:]
            left_held = bool(start_the_rest_now) and self.connectivity.stopped()
            running = [] if left_held else self._start(start_the_rest_now, clean)
        else:  # the rest commit in their own task (start_the_rest)
            running = []
        settle = self._commit_as_done(running, decided, begun)
        try:
            if dirty and read > 1:
                await loop.create_task(settle, context=clean.copy())
            else:
                await settle
        except BaseException:
            _abandon(rest_settled)
            raise
        if rest_settled is not None:
            await rest_settled
        return left_held

    def _start(
        self, admitted: list[tuple[Delivery, Message]], context: contextvars.Context | None = None,
    ) -> list[asyncio.Task[Decided | None]]:
        """A task per handler, in a copy of ``context`` (default: of the current one):
        a task runs in the context it is given, so tasks given one would share it."""
        running = []
        for delivery, message in admitted:
            coro = self.handle(delivery, message)
            delivery.task = _task(coro, None if context is None else context.copy())
            running.append(delivery.task)
        return running

    async def _commit_as_done(
        self, running: list[asyncio.Task[Decided | None]], decided: list[Decided], begun: float,
        *, adapt: Consumer | None = None,
    ) -> bool:
        """Commit ``decided`` and each of the ``running`` handlers' entries. After one
        turn of the loop (handlers that never really await are done by then) the decided
        entries commit together; the others commit as they finish, those finishing
        together in one commit. In read order: entries committed in the order they were
        read are fenced by one ranged ``XPENDING``. ``adapt``: a consumer that learns from
        this turn whether its handlers wait (:meth:`Consumer.adapt`). Returns False:
        nothing is left held."""
        try:
            if any(not task.done() for task in running):
                await asyncio.sleep(0)
            if adapt is not None and running:
                adapt.adapt(fast=all(task.done() for task in running))
            while True:
                decided += self._results([task for task in running if task.done()])
                # A call given up on at its timeout never ends: its entry was settled
                # without it (``EntryPipeline.abandon``), and the batch goes on.
                running = [task for task in running if not task.done() and not given_up(task)]
                await self.commit(decided, begun)
                if not running:
                    return False
                decided = []
                await asyncio.wait(running, timeout=GIVE_UP_CHECK_SECONDS,
                                   return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # a crash, or cancelled by the drain
            for task in running:
                task.cancel()
                task.add_done_callback(log_failure)  # one that fails as it stops: logged
            raise

    def _results(self, finished: list[asyncio.Task[Decided | None]]) -> list[Decided]:
        decided, crash = [], None
        for task in finished:
            if task.cancelled():  # not started at shutdown: handed back
                continue
            failure = task.exception()
            if failure is not None:
                crash = crash or failure
            elif (result := task.result()) is not None:
                decided.append(result)
        if crash is not None:
            raise crash  # out of the batch, and so the worker crashes
        return decided


def _abandon(task: asyncio.Task[bool] | None) -> None:
    """Cancel the rest's commits as the batch fails; what they raise is logged, not lost."""
    if task is not None:
        task.cancel()
        task.add_done_callback(log_failure)
