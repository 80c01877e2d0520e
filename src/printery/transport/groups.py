"""Where a pipeline's consumer groups start (docs/reference.md, Streams and entries).

A pipeline's first start on a server creates its groups at id 0, so entries published
before it are processed. A group created later, for a pipeline that has run here before
(a step added, a step renamed without ``renamed_from``), starts at the end of its stream
as it is then: changing a pipeline never hands it the retained history (``printery
backfill`` does, on purpose). A step ``renamed_from`` an old name takes the old group's
place: its last-delivered id and its pending entries, then the old group is destroyed.

"Has run here before" is each partition's record of known groups
(:attr:`~printery.wire.keys.StreamKeys.known_groups`), or, on a server of the time before the
record, any consumer group on the pipeline's streams. The decision and the creations are
one script per partition (``groups.lua``: the record and the partition's streams share
its hash tag), so two processes starting at once on a fresh server agree that it is the
first start.

Its namesakes in other layers (the same job there): :mod:`printery.runtime.groups`,
:mod:`printery.service.groups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from printery.base._util import as_text
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.keys import StreamKeys

__all__ = ["Placement", "Reader", "place_groups", "record_field"]

GROUPS_LUA = script("groups")

#: What ``groups.lua`` did with a group: it was there; created at 0; created at the end
#: of its stream; created in the place of the group it was renamed from.
EXISTS, START, END, RENAMED = "exists", "start", "end", "renamed"


@dataclass(frozen=True, slots=True)
class Reader:
    """One consumer group of a pipeline: the step ``group`` reading ``event_type``, and
    the name it had before (its ``renamed_from``), if any."""

    event_type: str
    group: str
    renamed_from: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one group of one partition's stream was found or put: ``how`` is one of
    :data:`EXISTS`, :data:`START`, :data:`END`, :data:`RENAMED`; ``at`` the id it starts
    after; ``moved`` the pending entries taken from the old group."""

    stream: str
    reader: Reader
    how: str
    at: str
    moved: int = 0


def record_field(event_type: str, group: str) -> str:
    """A group's field in the record of known groups."""
    return f"{event_type}\t{group}"


async def place_groups(client: Redis, keys: StreamKeys, readers: Sequence[Reader], *,
                       recover: bool = False) -> list[Placement]:
    """Create every group of ``readers`` on its stream in every partition where it must
    start (see the module's docstring); what was done with each.

    ``recover``: for a worker whose group is missing (its read found it gone, or it runs
    without a service): no rename; a group the record knows (its stream was deleted) or
    any group where there is no record comes back at 0, as it always did; a group the
    record does not know (renamed away since: an old process still running) starts at
    the end of its stream, never replaying the history."""
    placed: list[Placement] = []
    scripts = Scripts(client)
    for part in keys.each():
        streams = list(dict.fromkeys(part.stream(r.event_type) for r in readers))
        args: list[str | int] = ["recover" if recover else "start"]
        for r in readers:
            old = "" if recover else r.renamed_from or ""
            args += [streams.index(part.stream(r.event_type)) + 2, r.group, old,
                     record_field(r.event_type, r.group), record_field(r.event_type, old)]
        reply = await scripts.call(GROUPS_LUA, [part.known_groups, *streams], args)
        for r, (how, at, moved) in zip(readers, reply, strict=True):
            placed.append(Placement(part.stream(r.event_type), r, as_text(how), as_text(at),
                                    int(moved)))
    return placed
