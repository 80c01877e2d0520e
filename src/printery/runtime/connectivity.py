"""A worker's side of the outage policy (:mod:`printery.store.outage`): losing the server
is not a worker failure (reference: failures); a worker logs once per outage, backs off,
and carries on when it is back. Its waits end when the worker stops."""

from __future__ import annotations

import asyncio

from printery.store.outage import Outage

__all__ = ["Connectivity"]


class Connectivity(Outage):
    """One worker's view of the server, named by the worker; the entry pipeline asks
    ``stopping`` whether the worker is stopping (always there for a worker)."""

    stopping: asyncio.Event

    def __init__(self, worker: str, stopping: asyncio.Event) -> None:
        super().__init__(worker, stopping)

