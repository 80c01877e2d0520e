"""Every Prometheus instrument of printery, defined once (CONTRACT §8, §10).

Each :class:`Metrics` owns its ``CollectorRegistry`` instead of using the global one,
so several services (or tests) in one process never collide on a metric name, and
``render`` shows exactly one service's numbers. The exposition text always comes from
``prometheus_client``; nothing here writes the format by hand.

Label values are the worker names of the pipeline (``worker``), and for
``printery_messages_total`` an ``outcome`` among :data:`OUTCOMES`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CONTENT_TYPE", "OUTCOMES", "PROCESSING_BUCKETS", "Metrics", "MetricsObserver"]

#: Content type of :meth:`Metrics.render`'s output, for the ``/metrics`` response.
CONTENT_TYPE: str = prometheus_client.CONTENT_TYPE_LATEST

#: What happened to a consumed message: handled and acked, failed and left for a
#: redelivery, dead-lettered, or skipped because its idempotency record said "done".
OUTCOMES = ("ok", "retry", "dead_letter", "duplicate")

#: Seconds; spans no-op handlers (~1 ms) to health probes that wait for a deadline.
PROCESSING_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0,
)


class Metrics:
    """The instruments of one service process, in a registry of their own.

    Instruments are public attributes; use them with ``.labels(...)`` as usual. The
    helpers below cover the calls that would otherwise be repeated at every call site.
    ``process_metrics`` adds the standard ``process_*`` and ``python_*`` series.
    """

    def __init__(self, *, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if process_metrics:
            prometheus_client.ProcessCollector(registry=self.registry)
            prometheus_client.PlatformCollector(registry=self.registry)
            prometheus_client.GCCollector(registry=self.registry)
        r = self.registry
        #: Labelled children of the per-entry metrics, by their labels.
        self._counted: dict[tuple[str, str], Any] = {}
        self._timed: dict[str, Any] = {}
        self._costed: dict[tuple[str, str], Any] = {}
        self._waited: dict[str, Any] = {}
        self.messages = Counter(
            "printery_messages_total", "Messages consumed, by worker and outcome.",
            ["worker", "outcome"], registry=r,
        )
        self.processing_seconds = Histogram(
            "printery_processing_seconds", "Handler time per message, seconds.",
            ["worker"], buckets=PROCESSING_BUCKETS, registry=r,
        )
        self.worker_restarts = Counter(
            "printery_worker_restarts_total", "Restarts by the supervisor.", ["worker"], registry=r,
        )
        self.worker_up = Gauge(
            "printery_worker_up", "1 while the worker runs and is healthy, else 0.",
            ["worker"], registry=r,
        )
        self.worker_uptime = Gauge(
            "printery_worker_uptime_seconds", "Seconds since the worker last started.",
            ["worker"], registry=r,
        )
        self.stream_pending = Gauge(
            "printery_stream_pending",
            "Entries delivered to the worker's consumer group and not yet acknowledged.",
            ["worker"], registry=r,
        )
        self.queue_lag = Gauge(
            "printery_queue_lag_seconds",
            "Age of the oldest entry the consumer group has not acknowledged (pending or "
            "not yet delivered), seconds; 0 when it owes nothing.",
            ["stream", "group"], registry=r,
        )
        self.reviews_open = Gauge(
            "printery_reviews_open", "Reviews waiting for a decision (entries of `review`).",
            registry=r,
        )
        self.dlq_entries = Gauge(
            "printery_dlq_entries", "Entries held in `dlq` (not replayed or purged).", registry=r,
        )
        self.dlq = Counter(
            "printery_dlq_total", "Entries dead-lettered, by worker and reason code.",
            ["worker", "reason_code"], registry=r,
        )
        self.retries = Counter(
            "printery_retries_total", "Handler failures left for redelivery.", ["worker"],
            registry=r,
        )
        self.stream_trimmed = Counter(
            "printery_stream_trimmed_total",
            "Acknowledged entries removed by the retention sweep, by event type.",
            ["event_type"], registry=r,
        )
        self.limit_wait = Histogram(
            "printery_limit_wait_seconds",
            "Seconds a handler call waited for its step's flow-control limits, by limit.",
            ["limit"], buckets=PROCESSING_BUCKETS, registry=r,
        )
        self.step_cost = Counter(
            "printery_step_cost_total", "Cost reported by handlers, by worker and unit.",
            ["worker", "unit"], registry=r,
        )
        self.budget_events = Counter(
            "printery_budget_events_total",
            "Budget events of runs: a soft limit reached (warning), a hard one (exceeded).",
            ["level"], registry=r,
        )
        for level in ("warning", "exceeded"):
            self.budget_events.labels(level)

    def observe_message(self, worker: str, outcome: str, seconds: float | None = None) -> None:
        """Count one consumed message; ``seconds`` (handler time) feeds the histogram.
        Once per handled entry: the labelled children are looked up once each and kept
        (``labels()`` validates and locks on every call, about as much as the count)."""
        counter = self._counted.get((worker, outcome))
        if counter is None:
            counter = self._counted[(worker, outcome)] = self.messages.labels(worker, outcome)
        counter.inc()
        if seconds is not None:
            timer = self._timed.get(worker)
            if timer is None:
                timer = self._timed[worker] = self.processing_seconds.labels(worker)
            timer.observe(seconds)

    def observe_cost(self, worker: str, cost: Mapping[str, object]) -> None:
        """Add a handler's reported cost (``{"tokens": 812, "usd": 0.0031}``); negatives
        and non-numbers are ignored, since a Counter must never go down. Once per entry
        and unit: the labelled children are kept, as :meth:`observe_message`'s."""
        for unit, amount in cost.items():
            if isinstance(amount, int | float) and not isinstance(amount, bool) and amount > 0:
                counter = self._costed.get((worker, unit))
                if counter is None:
                    counter = self._costed[(worker, unit)] = self.step_cost.labels(worker, unit)
                counter.inc(amount)

    def observe_limit_waits(self, limit: str, seconds: Sequence[float]) -> None:
        """Observe the waits of handler calls admitted together by ``limit``."""
        histogram = self._waited.get(limit)
        if histogram is None:
            histogram = self._waited[limit] = self.limit_wait.labels(limit)
        for waited in seconds:
            histogram.observe(waited)

    def set_worker(
        self, worker: str, *, up: bool, uptime_s: float, pending: int | None = None
    ) -> None:
        """Refresh the per-worker gauges from a status snapshot."""
        self.worker_up.labels(worker).set(1 if up else 0)
        self.worker_uptime.labels(worker).set(uptime_s)
        if pending is not None:
            self.stream_pending.labels(worker).set(pending)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry (see :data:`CONTENT_TYPE`)."""
        return prometheus_client.generate_latest(self.registry)


#: Runtime outcome names -> the ``outcome`` label values of ``printery_messages_total``.
_OUTCOME_LABEL = {"error": "retry", "dead_lettered": "dead_letter", "fenced": "duplicate"}


class MetricsObserver:
    """Adapts the runtime's :class:`~printery.runtime.observe.Observer` hooks to
    :class:`Metrics`, so the consume loop never knows about Prometheus."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def processed(self, worker: str, outcome: str, seconds: float) -> None:
        self.metrics.observe_message(worker, _OUTCOME_LABEL.get(outcome, outcome), seconds)

    def dead_lettered(self, worker: str, reason_code: str) -> None:
        self.metrics.dlq.labels(worker, reason_code).inc()

    def retried(self, worker: str) -> None:
        self.metrics.retries.labels(worker).inc()

    def cost(self, worker: str, unit: str, amount: float) -> None:
        self.metrics.observe_cost(worker, {unit: amount})

    def budget_event(self, worker: str, level: str) -> None:
        self.metrics.budget_events.labels(level).inc()

    def limit_waited(self, worker: str, limit: str, seconds: Sequence[float]) -> None:
        self.metrics.observe_limit_waits(limit, seconds)
