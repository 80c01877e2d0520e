"""Metrics: every series docs/reference.md lists (HTTP), rendered by prometheus_client."""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from printery.observe.metrics import CONTENT_TYPE, PROCESSING_BUCKETS, Metrics, MetricsObserver

DOCUMENTED_SERIES = {
    "printery_messages_total": "counter",
    "printery_processing_seconds": "histogram",
    "printery_worker_restarts_total": "counter",
    "printery_worker_up": "gauge",
    "printery_worker_uptime_seconds": "gauge",
    "printery_stream_pending": "gauge",
    "printery_dlq_total": "counter",
    "printery_retries_total": "counter",
    "printery_step_cost_total": "counter",
}


def touch_everything(metrics: Metrics) -> None:
    metrics.observe_message("validator", "ok", 0.004)
    metrics.observe_message("validator", "dead_letter")
    metrics.worker_restarts.labels("notifier").inc()
    metrics.set_worker("validator", up=True, uptime_s=12.5, pending=3)
    metrics.dlq.labels("validator", "undecodable").inc()
    metrics.retries.labels("notifier").inc()
    metrics.observe_cost("aggregator", {"tokens": 812, "usd": 0.0031, "bad": -1, "x": "y"})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_every_contract_series_is_rendered() -> None:
    metrics = Metrics()
    touch_everything(metrics)
    text = metrics.render().decode()
    # prometheus_client drops the `_total` suffix from counter family names
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    for name, kind in DOCUMENTED_SERIES.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        assert families.get(family) == kind, name
        assert any(line.startswith(name) for line in text.splitlines()), name


def test_values_and_labels() -> None:
    metrics = Metrics(process_metrics=False)
    touch_everything(metrics)
    found = samples(metrics.render().decode())
    assert found[("printery_messages_total", (("outcome", "ok"), ("worker", "validator")))] == 1
    assert found[("printery_processing_seconds_count", (("worker", "validator"),))] == 1
    assert found[("printery_worker_up", (("worker", "validator"),))] == 1
    assert found[("printery_worker_uptime_seconds", (("worker", "validator"),))] == 12.5
    assert found[("printery_stream_pending", (("worker", "validator"),))] == 3
    assert found[("printery_dlq_total", (("reason_code", "undecodable"), ("worker", "validator")))]
    tokens = ("printery_step_cost_total", (("unit", "tokens"), ("worker", "aggregator")))
    assert found[tokens] == 812
    assert ("printery_step_cost_total", (("unit", "bad"), ("worker", "aggregator"))) not in found


def test_registries_are_independent() -> None:
    one, two = Metrics(), Metrics()
    one.retries.labels("validator").inc(5)
    assert b"printery_retries_total{" in one.render()
    assert b"printery_retries_total{" not in two.render()


def test_content_type_is_prometheus_text() -> None:
    assert CONTENT_TYPE.startswith("text/plain; version=")


def test_per_entry_series_match_what_prometheus_client_would_write() -> None:
    """The per-entry series are kept as plain numbers (cheaper per entry): what they
    render is what a prometheus_client Counter and Histogram fed the same values render,
    bucket bounds included (a value on a bound counts in that bucket)."""
    values = [0.0005, 0.0004, 0.001, 0.003, 7.0, 120.0, 500.0, 0.0]
    metrics = Metrics(process_metrics=False)
    observer = MetricsObserver(metrics)
    reference = CollectorRegistry()
    counter = Counter("printery_messages_total", "m", ["worker", "outcome"], registry=reference)
    histogram = Histogram("printery_processing_seconds", "h", ["worker"],
                          buckets=PROCESSING_BUCKETS, registry=reference)
    cost = Counter("printery_step_cost_total", "c", ["worker", "unit"], registry=reference)
    waits = Histogram("printery_limit_wait_seconds", "w", ["limit"], buckets=PROCESSING_BUCKETS,
                      registry=reference)
    for n, value in enumerate(values):
        outcome = "ok" if n % 3 else "retry"
        metrics.observe_message("w", outcome, value)
        counter.labels("w", outcome).inc()
        histogram.labels("w").observe(value)
        observer.cost("w", "usd", value)
        if value > 0:  # a counter never goes down; zero adds nothing
            cost.labels("w", "usd").inc(value)
    observer.cost("w", "usd", -1.0)
    observer.limit_waited("w", "rpm", values)
    for value in values:
        waits.labels("rpm").observe(value)
    metrics.observe_message("w", "dead_letter")
    counter.labels("w", "dead_letter").inc()
    ours = {key: value for key, value in samples(metrics.render().decode()).items()
            if key[0].startswith(("printery_messages_total", "printery_processing_seconds",
                                  "printery_step_cost", "printery_limit_wait"))
            and not key[0].endswith("_created")}
    theirs = {key: value for key, value in samples(
        prometheus_client.generate_latest(reference).decode()).items()
        if not key[0].endswith("_created")}
    assert ours == theirs
    assert len(ours) == 2 * (len(PROCESSING_BUCKETS) + 1 + 2) + 3 + 1
    assert ours[("printery_processing_seconds_bucket", (("le", "0.0005"), ("worker", "w")))] == 3
    assert ours[("printery_limit_wait_seconds_bucket", (("le", "0.0005"), ("limit", "rpm")))] == 3
