"""Entries found in another partition than their run's (docs/reference.md, Partitions).

A producer writing raw ``XADD`` s may put an entry in the wrong partition's stream (or
in a stream it computed with another partition count). Such an entry is not lost and
not refused: it is routed, i.e. appended with the same fields to the same event type's
stream of its run's partition, then acknowledged where it was found. The append is
guarded by a once key of the target partition named after the found entry (one script,
one slot), so however many groups read the stream, and however often a lost reply is
retried, one copy is appended. The append and the ack touch two slots and cannot be
one transaction: a crash between them leaves the entry pending, it is routed again (the
guard appends nothing) and acked. An entry that names no run at all gets a fresh
correlation id in the partition it was found in (:func:`~printery.wire.keys.new_id_in`), so
it is handled where it is.

Its namesake in other layers (the same job there): :mod:`printery.policies.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

import structlog

from printery.base._util import new_id
from printery.runtime.consumer import Delivery
from printery.store.outage import Outage
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts
from printery.transport.streams import ROUTE_LUA
from printery.wire.envelope import Codec, Envelope, correlation_of
from printery.wire.keys import StreamKeys, new_id_in, partition_of

log = structlog.get_logger("printery.worker")

#: How long a routed entry's guard is kept: the idempotency records' default (7 days),
#: longer than any entry stays pending.
ROUTE_GUARD_TTL_MS = 7 * 86_400_000


class Placer:
    """Places entries of one partition's streams (``keys``, a partition's view)."""

    def __init__(self, client: Redis, keys: StreamKeys, codec: Codec,
                 connectivity: Outage) -> None:
        assert keys.partition is not None
        self.client = client
        self.connectivity = connectivity
        self.keys = keys
        self.codec = codec
        self.scripts = Scripts(client)

    def named(self, fields: Mapping[str, str]) -> Mapping[str, str]:
        """``fields`` naming a run: as given, or with a fresh id of this partition."""
        cf = self.codec.correlation_field
        if correlation_of(fields, cf) is not None:
            return fields
        assert self.keys.partition is not None
        run = new_id_in(self.keys.partition, self.keys.partitions,
                        lambda: new_id(self.codec.id_prefix))
        return {**fields, cf: run}

    async def placed(self, delivery: Delivery, fields: Mapping[str, str],
                     envelope: Envelope) -> bool:
        """False when the entry is in its run's partition (handle it here); else append
        ``fields`` to the same event type's stream of that partition and return True (the
        caller acks it here). Retried while the server cannot be reached."""
        if partition_of(envelope.correlation_id, self.keys.partitions) == self.keys.partition:
            return False
        target = self.keys.whole.of(envelope.correlation_id).stream(
            self.keys.event_type(delivery.stream))
        copy = {**fields, self.codec.correlation_field: envelope.correlation_id,
                "idempotency_key": envelope.idempotency_key}
        guard = self.keys.whole.of(envelope.correlation_id).once(
            f"routed:{delivery.stream}:{delivery.entry_id}")
        args = [ROUTE_GUARD_TTL_MS, *chain.from_iterable(copy.items())]
        await self.connectivity.retrying(
            lambda: self.scripts.call(ROUTE_LUA, [guard, target], args))
        log.warning("entry routed to its run's partition", stream=delivery.stream,
                    entry_id=delivery.entry_id, to=target,
                    correlation_id=envelope.correlation_id)
        return True
