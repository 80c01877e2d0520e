"""The concurrency slots that processes which died still hold, found by a limit gate
whose entries wait for them (docs/reference.md, Flow control), so that a kill -9 stalls
no limit key for the visibility timeout.

A slot is held by a gate (one step's limits in one process) until released or until its
lease lapses. A gate is named as a consumer is (``host:pid:limits:<n>``), so the rule
that claims a dead process's entries at once (:func:`~printery.runtime.departed.died_here`:
a process of this host whose pid is gone) finds its gates too. A gate of another host, or
of a pid reused, is not known to be dead: its slots lapse with their lease.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable

import structlog

from printery.base._util import hostname, stop_tasks
from printery.base.errors import describe
from printery.runtime.departed import died_here
from printery.transport.limit_store import LimitStore

log = structlog.get_logger("printery.worker")

#: How often at most a gate whose entries wait for a slot of a limit key looks for
#: holders of it whose process is known to be dead.
DEPARTED_CHECK_SECONDS = 1.0


def gate_name() -> str:
    """A new gate's name in the server: ``host:pid:limits:<random n>``."""
    return f"{hostname()}:{os.getpid()}:limits:{int.from_bytes(os.urandom(4), 'big')}"


class DepartedSlots:
    """The gates of dead processes holding slots that ``gate``'s entries wait for: found
    by :meth:`look`, given back by the gate's next request (:meth:`take`); ``found`` is
    called when there are some (the gate then sends a request)."""

    def __init__(self, store: LimitStore, gate: str, worker: str,
                 found: Callable[[], None]) -> None:
        self.store = store
        self.gate = gate
        self.worker = worker
        self._found = found
        #: Per limit key, the gates the next request gives back.
        self._gone: dict[str, set[str]] = {}
        #: When each limit key was last looked at (monotonic).
        self._looked: dict[str, float] = {}
        self._looking: asyncio.Task[None] | None = None

    def take(self) -> dict[str, set[str]]:
        """What the next request gives back (then forgotten here, unless it fails:
        :meth:`keep`)."""
        gone, self._gone = self._gone, {}
        return gone

    def keep(self, gone: dict[str, set[str]]) -> None:
        """A request that was to give ``gone`` back failed: the next one does."""
        for base, gates in gone.items():
            self._gone.setdefault(base, set()).update(gates)

    def look(self, bases: Iterable[str]) -> None:
        """Entries wait for slots of ``bases``: look for their dead holders, at most
        every :data:`DEPARTED_CHECK_SECONDS` per key and one look at a time."""
        if self._looking is not None:
            return
        now = time.monotonic()
        due = [base for base in bases
               if now - self._looked.get(base, -DEPARTED_CHECK_SECONDS) >= DEPARTED_CHECK_SECONDS]
        if due:
            for base in due:
                self._looked[base] = now
            self._looking = asyncio.get_running_loop().create_task(
                self._find(due), name=f"{self.worker}:departed slots")

    async def close(self) -> None:
        if self._looking is not None:
            await stop_tasks([self._looking], timeout=2.0)

    async def _find(self, bases: list[str]) -> None:
        try:
            holders = await self.store.holders(bases)
            found = 0
            for base, gates in holders.items():
                for gate in gates:
                    if gate != self.gate and died_here(gate):
                        self._gone.setdefault(base, set()).add(gate)
                        found += 1
            if found:
                log.info("giving back the limit slots of a process that died",
                         worker=self.worker, gates=found)
                self._found()
        except Exception as exc:  # the next wait looks again
            log.warning("looking for the limit slots of dead processes failed",
                        worker=self.worker, error=describe(exc))
        finally:
            self._looking = None
