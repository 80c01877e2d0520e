"""What a run's followers get of its partials (reference: streaming through the gate):
:class:`Partial` and :class:`Verdict` items beside its entries.

The producer's side is :mod:`printery.runtime.partials`: one capped stream per run of
partials and verdicts. A follower reads that stream beside the run's entries: what is
on it when it joins, less what the gate closed already (only the attempts in progress,
from their start: a late follower sees the draft being written, not the retracted
ones), then live; the two are merged by time, a partial before an entry of the same
millisecond (a verdict is written before what its gate commits, so no follower meets an
outcome before the verdict that led to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from printery.base import _json
from printery.runs.history import id_order
from printery.runtime.partials import RESTART, VERDICT

__all__ = ["POSITION", "Draft", "Drafts", "Partial", "Shown", "ShownSoFar", "Verdict",
           "in_progress", "merged", "read_shown", "shown_of"]

#: The name under which the event stream's ids (and a reconnect's ``Last-Event-ID``)
#: carry the position in the run's partials stream: no event type starts with ``~``.
POSITION = "~partials"


@dataclass(frozen=True, slots=True)
class Partial:
    """A piece of an attempt's output as it was produced: provisional until its
    :class:`Verdict` (a plain step's attempt is 1). ``id`` is its place in the run's
    partials stream."""

    run_id: str
    step: str
    attempt: int
    text: str
    id: str = field(default="", compare=False)
    #: The Map item whose draft it is (None: not a Map's item).
    item: int | None = None

    def as_event(self) -> dict[str, Any]:
        """The ``data`` of its ``partial`` event."""
        return _with_item({"step": self.step, "attempt": self.attempt, "text": self.text},
                          self.item)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's judgement of an attempt that showed partials: ``passed``, they are
    its output; else they are retracted, for ``reasons`` (``{code, field, message}``)."""

    run_id: str
    step: str
    attempt: int
    passed: bool
    reasons: list[dict[str, Any]]
    id: str = field(default="", compare=False)
    item: int | None = None

    def as_event(self) -> dict[str, Any]:
        """The ``data`` of its ``verdict`` event."""
        return _with_item({"step": self.step, "attempt": self.attempt, "passed": self.passed,
                           "reasons": self.reasons}, self.item)


def _with_item(data: dict[str, Any], item: int | None) -> dict[str, Any]:
    if item is not None:
        data["item"] = item
    return data


Shown = Partial | Verdict


def shown_of(run_id: str, entry_id: str, fields: Mapping[str, str]) -> Shown | None:
    """One entry of a run's partials stream as what followers get (None: not one)."""
    try:
        step, attempt = fields["step"], int(fields["attempt"])
        item = int(fields["item"]) if fields.get("item") else None
        if fields.get("kind") in (VERDICT, RESTART):
            reasons = _json.loads(fields.get("reasons") or "[]")
            return Verdict(run_id, step, attempt, fields.get("passed") == "1",
                           reasons if isinstance(reasons, list) else [], entry_id, item)
        return Partial(run_id, step, attempt, fields["text"], entry_id, item)
    except (KeyError, ValueError):
        return None  # not written by printery: nothing to show


def in_progress(items: Sequence[Shown]) -> list[Shown]:
    """The partials of the attempts in progress: each step's (each Map item's) after its
    last verdict."""
    closed: dict[tuple[str, int | None], int] = {}
    for n, item in enumerate(items):
        if isinstance(item, Verdict):
            closed[item.step, item.item] = n
    return [item for n, item in enumerate(items)
            if isinstance(item, Partial) and n > closed.get((item.step, item.item), -1)]


def merged(entries: Iterable[dict[str, Any]], shown: Iterable[Shown]) -> list[
    dict[str, Any] | Shown
]:
    """``entries`` (in run order) and ``shown`` (in their stream's order) as one list, by
    millisecond, a partial or verdict before an entry of its millisecond."""
    out: list[dict[str, Any] | Shown] = []
    pending = list(shown)
    at = 0
    for entry in entries:
        ms = id_order(str(entry["id"]))[0]
        while at < len(pending) and id_order(pending[at].id)[0] <= ms:
            out.append(pending[at])
            at += 1
        out.append(entry)
    out.extend(pending[at:])
    return out


#: Entries of a partials stream read at once.
_CHUNK = 1000


@dataclass
class ShownSoFar:
    """One follower's view of a run's partials stream (``stream``): what was on it when
    the follower joined (``items``), and the last id it read (``last``)."""

    run_id: str
    stream: str
    items: list[Shown]
    last: str = "0-0"
    #: The drafts (step, item) this follower was given and no verdict closed yet.
    open: set[tuple[str, int | None]] = field(default_factory=set)

    def passed_on(self, items: Iterable[Shown]) -> list[Shown]:
        """``items`` less the verdicts that close no draft this follower has (a restart
        mark after a delivery that did retract; a verdict of a draft it never saw)."""
        given = []
        for item in items:
            key = (item.step, item.item)
            if isinstance(item, Partial):
                self.open.add(key)
            elif key in self.open:
                self.open.discard(key)
            else:
                continue
            given.append(item)
        return given

    def new(self, items: Iterable[Shown], seen: Mapping[str, str] | None) -> list[Shown]:
        """``items`` less those a follower with ``seen`` positions was given (an event
        stream's reconnect)."""
        given = (seen or {}).get(POSITION)
        if not given:
            return list(items)
        mark = id_order(given)
        return [item for item in items if id_order(item.id) > mark]

    def head(self, seen: Mapping[str, str] | None, until: int | None) -> list[Shown]:
        """What a follower gets of what was on the stream when it joined: a new one, the
        attempts in progress (none once the run has ended); a reconnect, everything after
        the last partial or verdict it was given (the verdicts and drafts it missed), or,
        given none, after its last entry and the attempts in progress. ``until``: the
        outcome's millisecond (nothing after the outcome is given)."""
        if seen and seen.get(POSITION):
            given = id_order(seen[POSITION])  # the drafts open then are this follower's
            self.passed_on(item for item in self.items if id_order(item.id) <= given)
            found = self.new(self.items, seen)
        elif seen:
            mark = max(id_order(position)[0] for position in seen.values())
            going = {item.id for item in in_progress(self.items)}
            found = [item for item in self.items
                     if item.id in going or id_order(item.id)[0] > mark]
        elif until is not None:
            return []
        else:
            found = in_progress(self.items)
        if until is not None:
            found = [item for item in found if id_order(item.id)[0] <= until]
        return self.passed_on(found)

    def add(self, rows: Iterable[tuple[str, str, Mapping[str, str]]], stream: str | None,
            seen: Mapping[str, str] | None) -> list[Shown]:
        """The rows of ``stream`` among ``rows`` (a tail's batch), as what to give."""
        found = []
        for row_stream, entry_id, fields in rows:
            if row_stream != stream:
                continue
            self.last = entry_id
            item = shown_of(self.run_id, entry_id, fields)
            if item is not None:
                found.append(item)
        return self.passed_on(self.new(found, seen))

    async def before(self, client: Any, outcome: Mapping[str, Any]) -> list[Shown]:
        """What was written before ``outcome`` and not read yet: a follower that joined
        a partition's read under way gets the verdict before the outcome it led to."""
        cutoff = id_order(str(outcome["id"]))[0]
        rows = await client.xrange(self.stream, f"({self.last}", "+", count=_CHUNK)
        found = []
        for entry_id, fields in rows:
            if id_order(entry_id)[0] > cutoff:
                break
            self.last = entry_id
            item = shown_of(self.run_id, entry_id, fields)
            if item is not None:
                found.append(item)
        return self.passed_on(found)


async def read_shown(client: Any, run_id: str, stream: str) -> ShownSoFar:
    """Everything on a run's partials stream now (it is capped)."""
    items: list[Shown] = []
    lower, last = "-", "0-0"
    while True:
        rows = await client.xrange(stream, lower, "+", count=_CHUNK)
        for entry_id, fields in rows:
            item = shown_of(run_id, entry_id, fields)
            if item is not None:
                items.append(item)
        if rows:
            last = rows[-1][0]
            lower = "(" + last
        if len(rows) < _CHUNK:
            return ShownSoFar(run_id, stream, items, last)


#: What became of a draft: written (no verdict yet), passed its gate, retracted.
PROVISIONAL, COMMITTED, RETRACTED = "provisional", "committed", "retracted"


@dataclass
class Draft:
    """One attempt's output as a follower saw it written: its text so far, its state
    (:data:`PROVISIONAL` until its verdict) and, retracted, the verdict's reasons."""

    step: str
    attempt: int
    text: str
    state: str = PROVISIONAL
    reasons: list[dict[str, Any]] = field(default_factory=list)
    item: int | None = None


class Drafts:
    """The drafts a follower has seen, in order (the console's run page shows them)."""

    def __init__(self) -> None:
        self.drafts: list[Draft] = []

    def add(self, item: Shown) -> None:
        """Add a partial to its step's open draft (a new one for a new attempt, or for
        the next delivery of a plain step), or close that draft with its verdict."""
        open_ = next((d for d in reversed(self.drafts) if d.step == item.step
                      and d.item == item.item and d.state == PROVISIONAL), None)
        if isinstance(item, Partial):
            if open_ is not None and open_.attempt == item.attempt:
                open_.text += item.text
            else:
                self.drafts.append(Draft(item.step, item.attempt, item.text, item=item.item))
        elif open_ is not None and open_.attempt == item.attempt:
            open_.state = COMMITTED if item.passed else RETRACTED
            open_.reasons = list(item.reasons)
