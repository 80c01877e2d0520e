"""The bench document: the sides' figures of every round, their ratios and overheads
(medians over the rounds), and what the run was asked for."""

from __future__ import annotations

import statistics
from typing import Any

from printery.bench.plan import BATCH, SIDES, Plan
from printery.transport.connection import CLIENT_LIBRARY


def _ratio(ours: dict[str, Any] | None, ceiling: dict[str, Any] | None, key: str) -> float:
    if ours and ceiling and ceiling.get(key):
        return round(float(ours[key]) / float(ceiling[key]), 3)
    return 0.0


def _figures(results: dict[str, dict[str, Any]], *, rate: bool) -> dict[str, float]:
    """One round's ratios (of p99 too in the ``rate`` mode) and the features' overheads,
    when they ran."""
    same, minimal, ours, without, featured = (results.get(side) for side in SIDES)
    figures = {"ratio": _ratio(ours, same, "events_per_s"),
               "ratio_minimal": _ratio(ours, minimal, "events_per_s")}
    if rate:
        figures["p99_ratio"] = _ratio(ours, same, "p99_ms")
        figures["p99_ratio_minimal"] = _ratio(ours, minimal, "p99_ms")
    if featured is not None:
        figures["with_overhead"] = round(1 - _ratio(featured, without or ours, "events_per_s"), 3)
        if without is not None:
            figures["with_overhead_plain"] = round(1 - _ratio(featured, ours, "events_per_s"), 3)
    return figures


def _median_round(rounds: list[dict[str, dict[str, Any]]], side: str) -> dict[str, Any] | None:
    """``side``'s figures from its median round by throughput (the lower of the two
    middle ones for an even count)."""
    runs = sorted((r[side] for r in rounds if side in r), key=lambda v: v["events_per_s"])
    return runs[(len(runs) - 1) // 2] if runs else None


def document(
    plan: Plan, rounds: list[dict[str, dict[str, Any]]], *, embedded: bool, ceiling: str
) -> dict[str, Any]:
    same, minimal, ours, without, featured = (_median_round(rounds, side) for side in SIDES)
    per_round = [_figures(results, rate=plan.rate is not None) for results in rounds]
    figures = {key: round(statistics.median(f[key] for f in per_round), 3)
               for key in per_round[0]}
    settings = (ours or {}).get("settings", {})
    doc: dict[str, Any] = {
        "ceiling": same or {},
        "ceiling_minimal": minimal or {},
        "printery": ours or {},
        "ratio": figures["ratio"],
        "ratio_minimal": figures["ratio_minimal"],
        "events": plan.events,
        "stages": plan.stages,
        "verified": all(r["verified"] for results in rounds for r in results.values()),
        "mode": "backlog" if plan.rate is None else "rate",
        "processes": plan.processes,
        "partitions": plan.partitions,
        "payload_bytes": plan.payload_bytes,
        "server": "embedded" if embedded else "url",
        "client": CLIENT_LIBRARY,
        "ceilings": ceiling,
        "batch": BATCH,
        "prefetch": settings.get("prefetch", plan.prefetch),
        "prefetch_default": plan.prefetch is None,
        "rounds": plan.rounds,
    }
    if plan.rounds > 1:
        doc["per_round"] = [{"order": list(results), **f, "events_per_s": {
                                side: values["events_per_s"] for side, values in results.items()}}
                            for results, f in zip(rounds, per_round, strict=True)]
    if featured is not None:
        doc["printery_with"] = featured
        doc["with"] = list(plan.features)
        doc["with_overhead"] = figures["with_overhead"]
        if without is not None:
            doc["printery_without"] = without
            doc["with_overhead_plain"] = figures["with_overhead_plain"]
    if plan.rate is not None:
        doc["rate"] = plan.rate
        doc["duration"] = plan.duration
        doc["p99_ratio"] = figures["p99_ratio"]
        doc["p99_ratio_minimal"] = figures["p99_ratio_minimal"]
    return doc
