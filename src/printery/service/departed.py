"""Consumers of processes that are gone, removed from their groups: the service's sweep.

Every process reads under its own consumer names (``host:pid:worker:index``), and a
group keeps a consumer until told otherwise: without this, ``printery streams`` and
``XINFO`` grew by one consumer per worker per restart. A consumer is removed only when
all of these hold, so no entry is ever lost and no live reader is disturbed:

* its process (``host:pid``) is not in the process registry: it stopped gracefully,
  or it died and its heartbeat expired;
* it owns no pending entry (a dead process's entries are claimed by the living first:
  XGROUP DELCONSUMER would drop them);
* it has been idle for ``min_idle`` seconds.

The last two are checked by the server in the same step as the delete
(``delconsumer.lua``). A consumer removed while its reader still lives costs nothing:
its next read recreates it.

Its namesake in other layers (the same job there): :mod:`printery.runtime.departed`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from printery.runtime.departed import owner
from printery.store import Redis
from printery.transport.scripts import Scripts
from printery.transport.streams import consumers_of, remove_consumer


def live_owners(processes: Iterable[dict[str, Any]]) -> set[str]:
    """``host:pid`` of every registered process (see :func:`list_processes`)."""
    return {f"{p.get('host')}:{p.get('pid')}" for p in processes}


async def remove_departed(
    client: Redis,
    readers: Iterable[tuple[str, str]],
    gone: Callable[[str], bool],
    *,
    min_idle: float,
) -> list[tuple[str, str, str]]:
    """Remove the consumers of ``(stream, group)`` pairs whose owner is ``gone`` and
    that own nothing and were idle ``min_idle`` seconds; return what was removed.

    A stream or group that does not exist (yet) is skipped.
    """
    removed: list[tuple[str, str, str]] = []
    scripts = Scripts(client)
    for stream, group in readers:
        for name, pending in await consumers_of(client, stream, group):
            who = owner(name)
            if who is None or not gone(who) or pending:
                continue
            if await remove_consumer(scripts, stream, group, name, int(min_idle * 1000)):
                removed.append((stream, group, name))
    return removed
