"""One handler call alone in its process: what a suspect's trial needs (reference: failures,
a crash blames the crasher; :mod:`printery.runtime.suspects`).

A process that dies with several calls in flight says nothing of which one killed it; one
that dies while a single call ran does. :meth:`Alone.enter` makes a call the only one in
flight in its process (every worker of its event loop): it closes every worker's doors (no
call starts: :meth:`~printery.runtime.consumer.InFlight.hold_off`), waits for the calls
running to end, and :meth:`Alone.leave` opens them again. One such call at a time; the
others wait their turn without a place among their worker's running calls, so two
suspects of one worker never wait for each other.

The doors are the workers' own count of running calls (their ``limit`` set to 0 while a
call runs alone), so the common call pays nothing for them.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from printery.runtime.handler import Message

__all__ = ["Alone", "Flight", "Turn", "register"]


class Flight(Protocol):
    """A worker's running calls (:class:`printery.runtime.consumer.InFlight`)."""

    running: int

    def leave(self) -> None: ...

    def hold_off(self) -> None: ...

    def resume(self) -> None: ...

    async def drained(self, to: int = 0) -> None: ...


class Turn(Protocol):
    """What a call that must run alone waits for before it starts (a suspect's trial,
    :class:`printery.runtime.suspects.Trial`)."""

    async def begin(self, message: Message) -> None: ...

#: Every worker's running calls, by the event loop they were made in (None: made outside
#: one, counted in every loop).
_flights: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[Flight]] = (
    weakref.WeakKeyDictionary())
_unbound: weakref.WeakSet[Flight] = weakref.WeakSet()
_alone: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Alone] = weakref.WeakKeyDictionary()


def _loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def register(in_flight: Flight) -> None:
    """Count ``in_flight`` among the calls of its process (an ``InFlight`` does so as it is
    made); made while a call runs alone, its doors start closed."""
    loop = _loop()
    if loop is None:
        _unbound.add(in_flight)
        return
    _flights.setdefault(loop, weakref.WeakSet()).add(in_flight)
    alone = _alone.get(loop)
    if alone is not None and alone.closed:
        in_flight.hold_off()


class Alone:
    """The one call of this process's event loop that runs alone, if any."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()
        #: Set while a call runs alone (or waits for the others to end).
        self.closed = False

    @staticmethod
    def here() -> Alone:
        """The running event loop's."""
        loop = asyncio.get_running_loop()
        alone = _alone.get(loop)
        if alone is None:
            alone = _alone[loop] = Alone()
        return alone

    def _every(self) -> list[Flight]:
        loop = _loop()
        here = _flights.get(loop) if loop is not None else None
        return [*(here or ()), *_unbound]

    async def enter(self, mine: Flight) -> None:
        """Wait until the call holding a place of ``mine`` is the only call in flight in
        the process, and keep it so until :meth:`leave`. Raising (a stop), it holds no
        place any more and leaves nothing closed."""
        mine.leave()  # its turn is waited for without a place: another suspect may be first
        await self._turn.acquire()
        self.closed = True
        for flight in self._every():
            flight.hold_off()
        mine.running += 1  # its place again, past the closed doors
        try:
            for flight in self._every():
                await flight.drained(1 if flight is mine else 0)
        except BaseException:
            mine.leave()
            self.leave()
            raise

    def leave(self) -> None:
        """The call that ran alone is over: every worker's calls may start again."""
        self.closed = False
        for flight in self._every():
            flight.resume()
        self._turn.release()
