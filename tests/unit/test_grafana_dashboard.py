"""docs/grafana/printery.json: a dashboard Grafana can import whose every query names a
metric printery really exports (printery.observe.metrics), and which shows throughput, lag, dead
letters, reviews, cost and handler durations."""

from __future__ import annotations

import json
import re
from pathlib import Path

from printery.observe.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "printery.json"
#: The sample names each metric type exposes (prometheus_client's family names).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created")}


def exported_names() -> set[str]:
    names = set()
    for family in Metrics(process_metrics=False).registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def queried_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert exprs, "no queries"
    return {name for expr in exprs for name in re.findall(r"\bprintery_[a-z_]+", expr)}


def test_every_queried_metric_is_exported() -> None:
    unknown = queried_names() - exported_names()
    assert not unknown, f"the dashboard queries metrics printery does not export: {sorted(unknown)}"


def test_the_dashboard_shows_what_operators_watch() -> None:
    wanted = {
        "printery_messages_total",  # throughput
        "printery_queue_lag_seconds",  # lag in seconds
        "printery_dlq_total", "printery_dlq_entries",  # dead letters
        "printery_reviews_open",  # reviews
        "printery_step_cost_total",  # cost
        "printery_processing_seconds_bucket",  # handler durations
    }
    assert wanted <= queried_names()


def test_the_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
