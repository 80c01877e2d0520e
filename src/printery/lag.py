"""Queue lag in seconds (issue 17): how long the oldest entry a consumer group still owes
has waited, whether it was delivered and not yet acknowledged (pending) or not delivered
at all. A count of entries says how much is queued; this says how late the group is,
which is what an alert wants. The service's gauge ``printery_queue_lag_seconds``, the
console and ``printery streams`` read the same figure (:mod:`printery.store.overview`,
where it is computed with the streams' other figures); these are its Python names.
"""

from __future__ import annotations

from printery.store.overview import event_type_lags, queue_lag_seconds, stream_lags

__all__ = ["event_type_lags", "queue_lag_seconds", "stream_lags"]
