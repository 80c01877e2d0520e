"""Listing runs (docs/reference.md, The API: /v1; Runs; Commands): what ``GET /v1/runs``,
:meth:`printery.Client.runs` and ``printery runs`` answer, a page of runs newest first.

The runs come from the run index (:mod:`printery.runs.index`), never from a scan of the
keyspace: every run by its start, or with a status the runs of that status by when they
got it (an ended status: by their end). A page goes on from a position (:class:`Cursor`:
the score and id of the last run of the previous page), not an offset, so runs that
start while a client pages shift nothing and every run is listed once. A run's cost is
what ``GET /v1/runs/{id}`` says (:func:`~printery.runs.reader.run_cost` over the run's
entries as :meth:`~printery.runs.reader.RunReader.history` reads them), the entries of a
whole page read in one scan of each partition's streams from the oldest start on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from printery.base.errors import InvalidInput
from printery.base.reason import Reason
from printery.pipeline.dag import run_id_problem
from printery.runs.cost import parse_duration
from printery.runs.history import id_order
from printery.runs.reader import RunReader, run_cost
from printery.runtime.run_index import RUNNING, now_ms
from printery.store.run_index import newest_after, run_rows, run_starts
from printery.store.scan import scan_stream
from printery.wire.keys import partition_of

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Cursor", "RunListing", "RunSummary", "list_runs",
           "listing_of", "listing_of_query", "page_entries"]

#: Runs on a page unless asked otherwise, and the most one page holds.
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000


def _rfc3339(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


@dataclass(frozen=True)
class RunSummary:
    """One run of a listing: its id, status (``running`` until its outcome), when it
    started and ended (UTC; ``ended`` None while it runs) and what its steps spent, per
    unit (as ``RunResult.cost``). ``cursor``: its position in the listing it came from,
    the ``after`` of the page that follows it."""

    run_id: str
    status: str
    started: datetime
    ended: datetime | None
    cost: dict[str, float] = field(default_factory=dict)
    cursor: str = field(default="", compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """As ``GET /v1/runs`` lists it: the times ISO 8601 (RFC 3339, UTC, ms)."""
        return {"run_id": self.run_id, "status": self.status,
                "started": _rfc3339(_ms(self.started)),
                "ended": None if self.ended is None else _rfc3339(_ms(self.ended)),
                "cost": dict(self.cost)}


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


class Cursor(NamedTuple):
    """A position in a listing: the run index's score of a run (ms) and its id, written
    ``<ms>:<run id>``."""

    score: int
    run_id: str

    def __str__(self) -> str:
        return f"{self.score}:{self.run_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The position ``text`` names; :class:`InvalidInput` (``invalid_after``) for
        text no listing wrote."""
        score, sep, run_id = text.partition(":")
        if not (sep and score.isdigit() and len(score) <= 16 and run_id
                and len(run_id) <= 1024):
            raise InvalidInput([Reason("invalid_after", "after",
                                       "a cursor from a listing's Link (or RunSummary.cursor)")])
        return cls(int(score), run_id)


class RunListing(NamedTuple):
    """What one listing asks for (validated: :func:`listing_of`)."""

    status: str | None = None
    since_s: float | None = None
    limit: int = DEFAULT_LIMIT
    after: Cursor | None = None


def listing_of(status: str | None = None, since: float | str | None = None,
               limit: int = DEFAULT_LIMIT, after: str | None = None) -> RunListing:
    """A listing's arguments checked: ``status`` a status name (1 to 256 characters, no
    control character), ``since`` seconds or a duration (``10m``, ``2h``, ``1d``),
    ``limit`` 1 to :data:`MAX_LIMIT`, ``after`` a cursor. Raises :class:`InvalidInput`
    whose reason's code names the argument (``invalid_status``, ``invalid_since``,
    ``invalid_limit``, ``invalid_after``)."""
    if status is not None and (not isinstance(status, str) or run_id_problem(status)):
        raise InvalidInput([Reason("invalid_status", "status", "a run status: 1 to 256 "
                                   "characters, none of them a control character")])
    since_s: float | None = None
    if since is not None:
        try:
            since_s = parse_duration(since) if isinstance(since, str) else float(since)
        except (TypeError, ValueError) as exc:
            raise InvalidInput([Reason("invalid_since", "since", str(exc))]) from None
        if not 0 <= since_s < float("inf"):
            raise InvalidInput([Reason("invalid_since", "since", "a duration of 0 or more")])
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput([Reason("invalid_limit", "limit",
                                   f"a whole number from 1 to {MAX_LIMIT}")])
    return RunListing(status, since_s, limit, None if after is None else Cursor.parse(after))


def listing_of_query(query: Mapping[str, str]) -> RunListing:
    """:func:`listing_of` from the text of a query string (``GET /v1/runs``)."""
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    if not (raw_limit.isdigit() and len(raw_limit) <= 6):
        raise InvalidInput([Reason("invalid_limit", "limit",
                                   f"a whole number from 1 to {MAX_LIMIT}")])
    return listing_of(query.get("status"), query.get("since"), int(raw_limit), query.get("after"))


async def list_runs(reader: RunReader, listing: RunListing) -> tuple[list[RunSummary], str | None]:
    """A page of runs newest first, and the cursor of the next page (None: this page is
    not full, nothing follows). With a status, a run listed is of that status now (a
    failed run a replay continued has left it): a page may then hold fewer runs than
    the limit and still be followed by another."""
    since_ms = None if listing.since_s is None else now_ms() - int(listing.since_s * 1000)
    found = await newest_after(reader.client, reader.keys, listing.status or "", listing.limit,
                               after=listing.after,
                               since_ms=since_ms)
    run_ids = [run_id for run_id, _ in found]
    rows = await run_rows(reader.client, reader.keys, run_ids)
    listed = [(run_id, score, row) for (run_id, score), row in zip(found, rows, strict=True)
              if row[0] and (listing.status is None or (row[1] or RUNNING) == listing.status)]
    entries = await page_entries(reader, [run_id for run_id, _, _ in listed])
    page = [RunSummary(run_id, status or RUNNING, _moment(started),
                       _moment(ended) if ended else None,
                       dict(run_cost(reader.pipeline, entries[run_id])["total"]["cost"]),
                       str(Cursor(score, run_id)))
            for run_id, score, (started, status, ended) in listed]
    following = str(Cursor(found[-1][1], found[-1][0])) if len(found) == listing.limit else None
    return page, following


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def page_entries(reader: RunReader, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each run's entries so far, in order, as :meth:`RunReader.history` gives them, for
    the runs of a page together: each partition's streams are read once, from the
    oldest start of its runs on the page (the beginning when one has no start record),
    and a run keeps its own entries from its own start."""
    found: dict[str, list[dict[str, Any]]] = {run_id: [] for run_id in run_ids}
    starts = dict(zip(run_ids, await run_starts(reader.client, reader.keys, run_ids),
                      strict=True))
    # A run's entries begin at its start's millisecond (another stream's entry of that
    # millisecond may sort before its first one), as history() reads them.
    begin = {run_id: (id_order(start)[0], 0) if start else (0, 0)
             for run_id, start in starts.items()}
    by_partition: dict[int, list[str]] = {}
    for run_id in run_ids:
        by_partition.setdefault(partition_of(run_id, reader.keys.partitions), []).append(run_id)
    for runs in by_partition.values():
        oldest = min(begin[run_id] for run_id in runs)
        start = "-" if oldest == (0, 0) else f"{oldest[0]}-0"
        wanted = set(runs)
        for stream in reader.streams_of(runs[0]):
            async for entry_id, fields in scan_stream(reader.client, stream, start):
                run_id = reader.run_of(fields)
                if run_id in wanted and id_order(entry_id) >= begin[run_id]:
                    found[run_id].append(reader.view(entry_id, stream, fields))
    return {run_id: reader.order.sort(entries) for run_id, entries in found.items()}
