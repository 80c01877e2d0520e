"""Every Prometheus instrument of printery, defined once (docs/reference.md, HTTP; Replay
and cost).

Each :class:`Metrics` owns its ``CollectorRegistry`` instead of using the global one,
so several services (or tests) in one process never collide on a metric name, and
``render`` shows exactly one service's numbers. The exposition text always comes from
``prometheus_client``; nothing here writes the format by hand.

Label values are the worker names of the pipeline (``worker``), and for
``printery_messages_total`` an ``outcome`` among :data:`OUTCOMES`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample

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


_MESSAGES_HELP = "Messages consumed, by worker and outcome."
_PROCESSING_HELP = "Handler time per message, seconds."
_COST_HELP = "Cost reported by handlers, by worker and unit."
_LIMIT_WAIT_HELP = "Seconds a handler call waited for its step's flow-control limits, by limit."
_LIMIT_FALLBACK_HELP = ("Handler calls that ran their step's fallback rather than wait past "
                        "a limit's max_wait, by limit.")
#: The ``le`` labels of the processing buckets, as prometheus_client writes them.
_BOUNDS = (*(repr(float(bound)) for bound in PROCESSING_BUCKETS), "+Inf")


class _EntryTally:
    """The per-entry series kept as plain numbers and made into metric families when the
    registry is read (a collector of the registry): ``printery_messages_total{worker,
    outcome}``, ``printery_processing_seconds{worker}``, ``printery_step_cost_total{worker,
    unit}``, ``printery_limit_wait_seconds{limit}`` and
    ``printery_limit_fallbacks_total{limit}``.

    Why not a prometheus_client Counter and Histogram: those take a lock for each value
    they change and find a bucket in a Python loop, 1.1 µs of the 1.5 µs each handled
    entry cost the worker; an add to a dict and a bisect cost a third of that. Only the
    event loop's thread writes and reads them (the scrape is served on it)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        #: Per worker (per limit): a count per bucket (``PROCESSING_BUCKETS``, then +Inf)
        #: and the sum.
        self.timed: dict[str, list[float]] = {}
        self.waited: dict[str, list[float]] = {}
        self.costs: dict[tuple[str, str], float] = {}
        #: Per limit: calls that ran the fallback instead of waiting past ``max_wait``.
        self.fallbacks: dict[str, int] = {}
        self.created: dict[object, float] = {}

    def series(self, worker: str, outcome: str) -> None:
        """Make the series of ``worker`` and ``outcome`` (at zero, if new)."""
        if (worker, outcome) not in self.counts:
            self.counts[(worker, outcome)] = 0
            self.created[(worker, outcome)] = time.time()
        if worker not in self.timed:
            self.timed[worker] = self._buckets(("timed", worker))

    def _buckets(self, key: object) -> list[float]:
        self.created[key] = time.time()
        return [0.0] * (len(PROCESSING_BUCKETS) + 2)

    def add(self, worker: str, outcome: str, seconds: float | None) -> None:
        key = (worker, outcome)
        if key not in self.counts:
            self.series(worker, outcome)
        self.counts[key] += 1
        if seconds is not None:
            timed = self.timed[worker]
            timed[bisect_left(PROCESSING_BUCKETS, seconds)] += 1
            timed[-1] += seconds

    def cost(self, worker: str, unit: str, amount: float) -> None:
        key = (worker, unit)
        if key not in self.costs:
            self.costs[key] = 0.0
            self.created[("cost", *key)] = time.time()
        self.costs[key] += amount

    def waits(self, limit: str, seconds: Sequence[float]) -> None:
        waited = self.waited.get(limit)
        if waited is None:
            waited = self.waited[limit] = self._buckets(("waited", limit))
        for each in seconds:
            waited[bisect_left(PROCESSING_BUCKETS, each)] += 1
            waited[-1] += each

    def fallback(self, limit: str) -> None:
        if limit not in self.fallbacks:
            self.fallbacks[limit] = 0
            self.created[("fallback", limit)] = time.time()
        self.fallbacks[limit] += 1

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("printery_messages", _MESSAGES_HELP, labels=["worker", "outcome"])
        yield HistogramMetricFamily("printery_processing_seconds", _PROCESSING_HELP,
                                    labels=["worker"])
        yield CounterMetricFamily("printery_step_cost", _COST_HELP, labels=["worker", "unit"])
        yield HistogramMetricFamily("printery_limit_wait_seconds", _LIMIT_WAIT_HELP,
                                    labels=["limit"])
        yield CounterMetricFamily("printery_limit_fallbacks", _LIMIT_FALLBACK_HELP,
                                  labels=["limit"])

    def collect(self) -> Iterator[Metric]:
        messages = CounterMetricFamily("printery_messages", _MESSAGES_HELP,
                                       labels=["worker", "outcome"])
        for (worker, outcome), count in self.counts.items():
            messages.add_metric([worker, outcome], count, created=self.created[(worker, outcome)])
        yield messages
        yield self._histogram("printery_processing_seconds", _PROCESSING_HELP, "worker",
                              self.timed, "timed")
        costs = CounterMetricFamily("printery_step_cost", _COST_HELP, labels=["worker", "unit"])
        for (worker, unit), amount in self.costs.items():
            costs.add_metric([worker, unit], amount, created=self.created[("cost", worker, unit)])
        yield costs
        yield self._histogram("printery_limit_wait_seconds", _LIMIT_WAIT_HELP, "limit",
                              self.waited, "waited")
        fallbacks = CounterMetricFamily("printery_limit_fallbacks", _LIMIT_FALLBACK_HELP,
                                        labels=["limit"])
        for limit, count in self.fallbacks.items():
            fallbacks.add_metric([limit], count, created=self.created[("fallback", limit)])
        yield fallbacks

    def _histogram(self, name: str, help_text: str, label: str,
                   tallies: Mapping[str, list[float]], kind: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, help_text, labels=[label])
        for value, tally in tallies.items():
            buckets: list[tuple[str, float]] = []
            seen = 0.0
            for bound, in_bucket in zip(_BOUNDS, tally[:-1], strict=True):
                seen += in_bucket
                buckets.append((bound, seen))
            family.add_metric([value], buckets, tally[-1])
            family.samples.append(Sample(f"{name}_created", {label: value},
                                         self.created[(kind, value)]))
        return family


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
        #: The per-entry series: messages, processing time, cost, limit waits.
        self.entries = _EntryTally()
        r.register(self.entries)
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
        self.breaker_open = Gauge(
            "printery_breaker_open",
            "1 while the circuit breaker of a model (its configured model name) is open or "
            "waits for its trial call, else 0.", ["model"], registry=r,
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
        self.budget_events = Counter(
            "printery_budget_events_total",
            "Budget events of runs: a soft limit reached (warning), a hard one (exceeded).",
            ["level"], registry=r,
        )
        for level in ("warning", "exceeded"):
            self.budget_events.labels(level)

    def observe_message(self, worker: str, outcome: str, seconds: float | None = None) -> None:
        """Count one consumed message; ``seconds`` (handler time) feeds the histogram."""
        self.entries.add(worker, outcome, seconds)

    def init_worker(self, worker: str) -> None:
        """Create a worker's per-entry series at zero (every outcome), so scrapes see them
        before any traffic."""
        for outcome in OUTCOMES:
            self.entries.series(worker, outcome)

    def observe_cost(self, worker: str, cost: Mapping[str, object]) -> None:
        """Add a handler's reported cost (``{"tokens": 812, "usd": 0.0031}``); negatives
        and non-numbers are ignored, since a counter must never go down."""
        for unit, amount in cost.items():
            if isinstance(amount, int | float) and not isinstance(amount, bool) and amount > 0:
                self.entries.cost(worker, unit, amount)

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
        self._entries = metrics.entries  # once per entry: a call less than observe_message

    def processed(self, worker: str, outcome: str, seconds: float) -> None:
        self._entries.add(worker, _OUTCOME_LABEL.get(outcome, outcome), seconds)

    def dead_lettered(self, worker: str, reason_code: str) -> None:
        self.metrics.dlq.labels(worker, reason_code).inc()

    def retried(self, worker: str) -> None:
        self.metrics.retries.labels(worker).inc()

    def cost(self, worker: str, unit: str, amount: float) -> None:
        if isinstance(amount, int | float) and not isinstance(amount, bool) and amount > 0:
            self._entries.cost(worker, unit, amount)

    def budget_event(self, worker: str, level: str) -> None:
        self.metrics.budget_events.labels(level).inc()

    def limit_waited(self, worker: str, limit: str, seconds: Sequence[float]) -> None:
        self._entries.waits(limit, seconds)

    def limit_fallback(self, worker: str, limit: str) -> None:
        self._entries.fallback(limit)
