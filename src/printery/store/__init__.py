"""The keyspace outside the commit path: everything printery reads, counts and sweeps.

Above the transport (which owns the wire: the commit path, consumer-group operations,
the scripts and redis-py's internals) and below everything that shows or sweeps the
data. Only ``store/`` and ``transport/`` import redis-py (``make lint`` checks it); the
rest takes the client as :data:`Redis` and calls in here:

* :mod:`~printery.store.overview`: one :class:`StreamOverview` (length, pending,
  undelivered count, lag in seconds per event type, partition and group) for
  ``printery streams``, the console and the gauges;
* :mod:`~printery.store.inbox`: how many reviews and dead letters wait (one read), a
  review's decision, a dead letter's replay and purge;
* :mod:`~printery.store.outage`: one outage policy and one definition of unreachable;
* :mod:`~printery.store.client_errors`: the client's errors by what they mean;
* :mod:`~printery.store.scan`: one scan of a stream and of every partition, entries by
  id, the followers' live read;
* :mod:`~printery.store.joins` (an aggregator's joins, :class:`JoinStore`),
  :mod:`~printery.store.item_counts` (a Map's), :mod:`~printery.store.run_index` (the run
  index's reads), :mod:`~printery.store.processes` (the process registry),
  :mod:`~printery.store.layout` (the layout record), :mod:`~printery.store.blobs`
  (payloads by reference), :mod:`~printery.store.budgets`, :mod:`~printery.store.records`
  (a failed entry's last error), :mod:`~printery.store.sessions` (console sessions) and
  :mod:`~printery.store.servers` (what the servers report): each keyspace, its keys
  named in :mod:`printery.wire.keys`.
"""

from __future__ import annotations

from printery.store.client_errors import CommandRefused, ServerError, WatchConflict
from printery.store.inbox import Waiting, waiting
from printery.store.joins import JoinStore
from printery.store.outage import UNREACHABLE, Outage, unreachable
from printery.store.overview import GroupFigures, StreamFigures, StreamOverview, read_overview
from printery.transport.connection import Redis

__all__ = [
    "UNREACHABLE", "CommandRefused", "GroupFigures", "JoinStore", "Outage", "Redis",
    "ServerError", "StreamFigures", "StreamOverview", "Waiting", "WatchConflict",
    "read_overview", "unreachable", "waiting",
]
