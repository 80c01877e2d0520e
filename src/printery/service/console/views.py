"""What each console page shows, read from Redis: plain dicts for the templates.

Every read is bounded whatever the history holds: the overview and the runs list come
from the run index (:mod:`printery.runs.index`) and the process index, the streams'
figures from ``XLEN`` and ``XINFO GROUPS`` of the pipeline's own streams; only the page
of one run reads its entries (from its start record on, as ``/v1/runs/{id}`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from printery.base import _json
from printery.base.errors import ReviewInvalid, UnknownRun
from printery.inbox import dead_letters, reviews
from printery.pipeline.render import loop_summary, to_text
from printery.runs.facade import Runs
from printery.runs.history import id_order
from printery.runs.index import RunIndexReader
from printery.runs.partials import Draft
from printery.runs.reader import run_cost
from printery.runtime.run_index import RUNNING, run_status
from printery.service.api import step_summary
from printery.service.console.graph import ItemCounts, Layout, item_counts, layout
from printery.service.registry import list_processes
from printery.store import read_overview, waiting
from printery.wire.fields import REASON_CODE, WORKER
from printery.wire.keys import DLQ, REVIEW

__all__ = ["Views", "pretty"]

#: Runs on one page of the runs list; dead letters shown at most.
PAGE = 50
DLQ_SHOWN = 200
#: Open reviews one page of the console shows (each a form): the rest are paged.
REVIEWS_SHOWN = 50


def pretty(value: Any) -> str:
    """JSON as people read it (the data of an entry, a review, a dead letter)."""
    try:
        return _json.dumps_indented(value)
    except TypeError:
        return str(value)


class Views:
    """The pages' data over one :class:`~printery.runs.facade.Runs` (its client, keys and
    pipeline)."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.client = runs.redis
        self.keys = runs.keys
        self.pipeline = runs.pipeline
        self.index = RunIndexReader(runs.keys)

    async def overview(self) -> dict[str, Any]:
        processes = await list_processes(self.client, self.keys)
        workers = [{"process": f"{p.get('host', '?')}:{p.get('pid', '?')}", "name": name,
                    **(w if isinstance(w, dict) else {})}
                   for p in processes for name, w in sorted((p.get("workers") or {}).items())]
        streams = await self.streams()
        counts = await waiting(self.client, self.keys)
        recent, _ = await self.index.page(self.client, count=10)
        return {"processes": processes, "workers": workers, "streams": streams,
                "dlq": counts.dead_letters, "reviews": counts.reviews,
                "summary": await self.index.summary(self.client),
                "cost": await self.index.cost_last_hour(self.client), "recent": recent}

    async def streams(self) -> list[dict[str, Any]]:
        """Each stream of the pipeline (and ``dlq``, ``review``), its partitions summed:
        length, and per group its pending entries and ``lag_s`` (seconds its oldest owed
        entry has waited): the one :class:`~printery.store.StreamOverview`, two round trips
        whatever the partitions."""
        # Once each: a pipeline that escalates lists ``review`` among its own types.
        types = [*self.pipeline.event_types(), DLQ, REVIEW]
        return (await read_overview(self.client, self.keys, types)).by_type()

    async def run_list(self, *, query: str = "", status: str = "", offset: int = 0) -> (
        dict[str, Any]
    ):
        if query:
            rows = await self.index.find(self.client, query)
            total = len(rows)
        else:
            rows, total = await self.index.page(self.client, status=status, offset=offset,
                                                count=PAGE)
        summary = await self.index.summary(self.client)
        return {"runs": rows, "total": total, "query": query, "status": status,
                "offset": offset, "page": PAGE, "statuses": summary["statuses"]}

    async def run(self, run_id: str) -> dict[str, Any] | None:
        """One run's page, or None when the run index does not know it: an unknown id
        must not cost a read of every stream from its start (a run an external producer
        started is indexed once its first entry is handled)."""
        if not await self.index.find(self.client, run_id):
            return None
        try:
            entries = await self.runs.entries(run_id)
        except UnknownRun:
            return None
        return self.run_view(run_id, entries)

    def run_view(self, run_id: str, entries: list[dict[str, Any]],
                 drafts: list[Draft] | None = None) -> dict[str, Any]:
        """One run's page; ``drafts``: what its steps showed while they worked, as a live
        follower saw it (reference: streaming through the gate)."""
        outcome = self.runs.reader.outcome_of(entries)
        spent = run_cost(self.pipeline, entries)
        steps = step_summary(self.runs, entries, spent["steps"])
        start = id_order(entries[0]["id"])[0] if entries else 0
        timeline = [{
            "id": e["id"], "type": e.get("stream", ""), "producer": e.get("producer", ""),
            "at": id_order(e["id"])[0], "offset_ms": id_order(e["id"])[0] - start,
            "duration_ms": e.get("duration_ms"), "cost": e.get("cost") or {},
            "data": pretty(e.get("data")), "outcome": e is outcome,
            # A dead letter is said as one: its producer is the failed entry's, copied.
            "dead_letter": {"worker": e.get(WORKER, ""), "reason_code": e.get(REASON_CODE, "")}
            if e.get("stream") == DLQ else None,
        } for e in entries]
        status = run_status(outcome)
        states = {s["step"]: s["status"] for s in steps}
        return {"run_id": run_id, "status": status, "ended": status != RUNNING,
                "steps": steps, "timeline": timeline, "cost": spent["total"]["cost"],
                "graph": self.graph(states, item_counts(self.pipeline, entries)),
                "drafts": drafts or []}

    def graph(self, states: Mapping[str, str] | None = None,
              counts: Mapping[str, ItemCounts] | None = None) -> Layout:
        return layout(self.pipeline, states, counts)

    async def review_list(self, after: str = "") -> dict[str, Any]:
        """A page of open reviews (:data:`REVIEWS_SHOWN`, after the review ``after``; an
        ``after`` that is no review id starts from the oldest), how many are open, and
        where the next page starts ("" for none)."""
        try:
            found = await reviews.list_reviews(self.client, self.keys, self.pipeline,
                                               limit=REVIEWS_SHOWN, after=after)
        except ReviewInvalid:
            after = ""
            found = await reviews.list_reviews(self.client, self.keys, self.pipeline,
                                               limit=REVIEWS_SHOWN)
        total = (await waiting(self.client, self.keys)).reviews
        field = self.pipeline.correlation_field
        return {"reviews": [{**r, "run_id": r.get(field, ""), "pretty": pretty(r.get("data"))}
                            for r in found],
                "total": total, "after": after,
                "following": found[-1]["id"] if len(found) == REVIEWS_SHOWN else ""}

    async def dlq_list(self) -> dict[str, Any]:
        field = self.pipeline.correlation_field
        letters = await dead_letters.dead_letters(self.client, self.keys, field,
                                                  count=DLQ_SHOWN)
        total = (await waiting(self.client, self.keys)).dead_letters
        return {"letters": [{**d, "run_id": d.get(field, ""), "pretty": pretty(d.get("data"))}
                            for d in letters], "total": total}

    def pipeline_view(self) -> dict[str, Any]:
        loops = {name: loop_summary(step.loop) for name, step in self.pipeline.steps.items()
                 if step.loop is not None}
        return {"description": self.pipeline.describe(), "text": to_text(self.pipeline),
                "graph": self.graph(), "loops": loops}
