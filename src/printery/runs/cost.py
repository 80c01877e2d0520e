"""Time and reported cost per step and unit (docs/reference.md, Replay and cost), from the
streams themselves.

Every entry a worker writes carries ``duration_ms`` (handler time) and, when reported,
``cost`` (JSON of named amounts); ``producer`` names the step. One handler call that
writes several outputs puts the same figures on each, and its outputs after the first
name the first in ``call_of``: a call is counted once, by its first output (calls of a
step with the same figures, Map items for one, are each counted). Handler calls that
wrote no output (an aggregator still waiting for branches) leave no trace and are not
counted; a call whose first output the commit withheld (an outcome of a run that had
ended meanwhile) is counted by the copy of its figures in the ``withheld`` stream. Copies
of an entry are not calls: a ``dlq`` entry (the entry that failed, with
its producer's figures) and what ``dlq replay`` puts back (``replayed_from``) never count
(:func:`is_call`, the one rule of every figure: ``printery cost``, ``RunResult.cost``,
``GET /v1/runs/{id}``, the console). A redelivery writes nothing twice: only the commit
that lands keeps its outputs (and charges the budget), so its call counts once. Scans with
XRANGE (from the ``since`` time when given): operator use only.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from typing import Any

from printery.base import _json
from printery.pipeline.dag import Pipeline
from printery.rules.budgets import step_field
from printery.runtime.reservations import reserved_sums
from printery.store import Redis
from printery.store.budgets import budget_hashes, recorded_budget_limits
from printery.store.scan import scan_stream
from printery.transport.commit import decode_spent
from printery.transport.streams import public_api
from printery.wire.envelope import correlation_of
from printery.wire.fields import CALL_OF, REPLAYED_FROM
from printery.wire.keys import DLQ, REVIEW, WITHHELD, StreamKeys, raise_field

__all__ = ["CallTally", "budget_report", "budget_status", "cost_summary", "enforced_limits",
           "is_call", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``10m``, ``2h``, ``30s``, ``1d``, ``500ms`` (bare number: seconds) -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r}: expected a duration like 30s, 10m, 2h, 1d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]


@public_api
async def cost_summary(
    client: Redis,
    keys: StreamKeys,
    pipeline: Pipeline,
    correlation_id: str | None = None,
    since_seconds: float | None = None,
) -> dict[str, Any]:
    """``{"steps": {step: {"calls", "duration_ms", "cost": {unit: sum}}}, "total": {...}}``.

    Only entries produced by the pipeline's steps count; ``correlation_id`` restricts to
    one run, ``since_seconds`` to entries written in that window (by entry id time).
    """
    start = "-"
    if since_seconds is not None:
        start = str(max(0, int((time.time() - since_seconds) * 1000)))  # before 1970: all
    tally = CallTally(pipeline, correlation_id)
    # One run's entries are in its partition; every run's in every partition
    # (docs/reference.md, Partitions).
    parts = [keys.of(correlation_id)] if correlation_id is not None else list(keys.each())
    # dlq: copies only; withheld: calls whose outputs were not kept.
    for event_type in dict.fromkeys([*pipeline.event_types(), REVIEW, WITHHELD]):
        for part in parts:
            async for _id, fields in scan_stream(client, part.stream(event_type), start):
                tally.add(fields, event_type)
    return {pipeline.correlation_field: correlation_id, "since_seconds": since_seconds,
            **tally.summary()}


def enforced_limits(pipeline: Pipeline) -> list[dict[str, Any]]:
    """The budget limits ``pipeline`` enforces, as this process imported it: the run's
    budget's, then each step's own (``step``, ``unit``, ``limit``, ``soft`` fraction), as
    the workers record them (:func:`~printery.store.budgets.record_budget_limits`)."""
    scopes = [("", pipeline.budget)] + [(name, step.budget)
                                        for name, step in pipeline.steps.items()]
    return [{"step": step, "unit": unit, "limit": limit, "soft": budget.soft}
            for step, budget in scopes if budget is not None
            for unit, limit in budget.limits.items()]


@public_api
async def budget_status(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, run_id: str
) -> list[dict[str, Any]] | None:
    """What ``run_id`` has spent against each budget limit (docs/reference.md, Budgets):
    the rows of :func:`budget_report`, None without budgets."""
    rows, _source = await budget_report(client, keys, pipeline, run_id)
    return rows


async def budget_report(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, run_id: str
) -> tuple[list[dict[str, Any]] | None, str]:
    """What ``run_id`` has spent against each budget limit, from the run's hash (exact,
    as the commits charged it), and where the limits came from: ``"workers"``, the
    limits the workers recorded at their start (what they enforce), or ``"app"``, this
    process's own import of ``pipeline`` when no worker recorded any. One row per limit,
    ``{"step"}`` ("" for the run's budget), ``unit``, ``spent``, ``limit`` (raised by
    approved reviews), ``soft`` (the warning threshold: the fraction of the limit, raise
    included) and ``status`` (``ok``, ``warning``, ``exceeded``), and ``reserved``: what
    entries of the run that have not committed yet hold of the limit (a step's
    ``estimate=``). None for limits without a budget."""
    recorded = await recorded_budget_limits(client, keys)
    limits, source = (enforced_limits(pipeline), "app") if recorded is None \
        else (recorded, "workers")
    if not limits:
        return None, source
    held, reserving = await budget_hashes(client, keys, run_id)
    reserved = reserved_sums(reserving)
    rows = []
    for row in limits:
        step, unit = row["step"], row["unit"]
        field = step_field(step, unit) if step else unit
        spent = decode_spent(held.get(field))
        limit = row["limit"] + decode_spent(held.get(raise_field(field)))
        soft = limit * row["soft"]
        status = ("exceeded" if spent >= limit else "warning" if spent >= soft else "ok")
        rows.append({"step": step, "unit": unit, "spent": spent,
                     "reserved": reserved.get(field, 0.0), "limit": limit,
                     "soft": soft, "status": status})
    return rows, source


def is_call(steps: Mapping[str, object] | frozenset[str], event_type: str,
            fields: Mapping[str, str]) -> bool:
    """Whether the entry ``fields`` (of the stream of ``event_type``) stands for one
    handler call of a step in ``steps``, whose ``duration_ms`` and ``cost`` count: the
    call's first output. Not a copy of an entry: a ``dlq`` entry is the entry that failed
    (its producer's figures, counted by that entry already), an entry ``dlq replay`` put
    back (``replayed_from``) is that same entry again (and so is its dlq entry when it
    fails again). ``replay --from``'s copies name no step as producer and carry no
    figures: the new run's cost is what its own calls spend."""
    return (event_type != DLQ and "duration_ms" in fields and CALL_OF not in fields
            and REPLAYED_FROM not in fields and fields.get("producer", "") in steps)


class CallTally:
    """Sums handler calls per step: the outputs of one call all carry its figures, and
    count once (by its first: the others name it in ``call_of``); copies never count
    (:func:`is_call`). Only entries produced by the pipeline's steps count;
    ``correlation_id`` restricts to one run."""

    def __init__(self, pipeline: Pipeline, correlation_id: str | None = None) -> None:
        self.pipeline = pipeline
        self.correlation_id = correlation_id
        self._steps: dict[str, dict[str, Any]] = {}

    def add(self, fields: Mapping[str, str], event_type: str) -> None:
        """Count the entry ``fields`` of the stream of ``event_type`` if it is a call."""
        if not is_call(self.pipeline.steps, event_type, fields):
            return
        producer = fields["producer"]
        cid = correlation_of(fields, self.pipeline.correlation_field) or ""
        if self.correlation_id is not None and cid != self.correlation_id:
            return
        _add(self._steps.setdefault(producer, {"calls": 0, "duration_ms": 0.0, "cost": {}}),
             fields)

    def summary(self) -> dict[str, Any]:
        """``{"steps": {step: {"calls", "duration_ms", "cost": {unit: sum}}}, "total"}``,
        steps in pipeline order."""
        ordered = {name: self._steps[name] for name in self.pipeline.steps if name in self._steps}
        total: dict[str, Any] = {"calls": 0, "duration_ms": 0.0, "cost": {}}
        for summary in ordered.values():
            total["calls"] += summary["calls"]
            total["duration_ms"] += summary["duration_ms"]
            for unit, amount in summary["cost"].items():
                total["cost"][unit] = total["cost"].get(unit, 0) + amount
        for summary in (*ordered.values(), total):
            summary["duration_ms"] = round(summary["duration_ms"], 3)
        return {"steps": ordered, "total": total}


def _add(summary: dict[str, Any], fields: Mapping[str, str]) -> None:
    summary["calls"] += 1
    with contextlib.suppress(ValueError):
        summary["duration_ms"] += float(fields["duration_ms"])
    raw = fields.get("cost")
    if not raw:
        return
    try:
        cost = _json.loads(raw)
    except (_json.JSONDecodeError, ValueError):
        return
    if isinstance(cost, dict):
        for unit, amount in cost.items():
            if isinstance(amount, int | float) and not isinstance(amount, bool):
                summary["cost"][unit] = summary["cost"].get(unit, 0) + amount
