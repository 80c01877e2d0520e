"""Whose consumer a name is, and whether that process is gone from this host: what the
read loop needs to claim a dead process's entries at once (the service's sweep of
departed consumers, :mod:`printery.service.departed`, builds on :func:`owner`)."""

from __future__ import annotations

import os

from printery.base._util import hostname


def owner(consumer: str) -> str | None:
    """The ``host:pid`` a consumer name of :func:`printery.base._util.consumer_name` belongs
    to; None for a name of another form (someone else's consumer: never touched)."""
    # host:pid:worker:index, where a worker's name may hold colons of its own (a Map's
    # ``<name>:each``): the host and pid are the first two parts, the index the last.
    host, _, rest = consumer.partition(":")
    pid, _, named = rest.partition(":")
    worker, _, index = named.rpartition(":")
    if not (host and pid.isdigit() and worker and index.isdigit()):
        return None
    return f"{host}:{pid}"


def died_here(consumer: str) -> bool:
    """Whether ``consumer`` belonged to another process of this host that no longer
    exists (its pid is gone): its pending entries can be claimed at once rather than
    after the visibility timeout (a handler that kills its process, ``os._exit``, then
    costs a restart per delivery, not a visibility timeout each: reference: failures). A pid
    that was reused, or a zombie not yet reaped, counts as alive: the visibility timeout
    still settles those."""
    who = owner(consumer)
    if who is None:
        return False
    host, pid = who.rsplit(":", 1)
    if host != hostname() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
