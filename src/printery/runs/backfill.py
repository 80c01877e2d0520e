"""``printery backfill``: hand a step, on purpose, the entries it was never given
(docs/reference.md, Where a group starts).

A group created after its pipeline first ran starts at the end of its stream
(:mod:`printery.transport.groups`), and the record of known groups says after which id.
A backfill copies the entries of the step's streams from that id back to ``since`` ago
(all that is retained without it) to the end of the same streams, each with
``replay_for`` = the step: the step handles them as new entries, every other reader of
the stream acknowledges them without running (as a replay's copies), and the record's
bound moves below the oldest copied, so a second backfill hands only what is older
still. A copy keeps the original's fields (run id, idempotency key: a step that has
committed that key already skips it as a duplicate) but its ``cost`` and
``duration_ms``, which were the writer's, not the copy's. Earlier copies (any entry with
``replay_for``) are not copied again.

Copies are written newest chunk first, each chunk in id order in one transaction with
the record's new bound (the stream and the record share the partition's slot), so an
interrupted backfill run again goes on where it stopped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from printery.base._util import as_text
from printery.base.errors import PrinteryError
from printery.pipeline.dag import Pipeline
from printery.store import Redis
from printery.transport.groups import record_field
from printery.transport.streams import public_api
from printery.wire.fields import REPLAY_FOR
from printery.wire.keys import StreamKeys

__all__ = ["BackfillError", "BackfillResult", "backfill"]

#: Entries copied per transaction.
CHUNK = 500
#: The writer's own fields, not the copy's.
_NOT_COPIED = frozenset({"cost", "duration_ms"})


class BackfillError(PrinteryError):
    """The step to backfill is not a step of the pipeline."""


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What was handed: ``count`` entries, per stream."""

    step: str
    count: int
    streams: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "count": self.count, "streams": dict(self.streams)}


@public_api
async def backfill(client: Redis, keys: StreamKeys, pipeline: Pipeline, step: str,
                   since_ms: int | None = None) -> BackfillResult:
    """Copy to ``step`` the entries of its streams it was never given, written at or
    after ``since_ms`` (unix ms; None: all retained). See the module's docstring."""
    if step not in pipeline.steps:
        raise BackfillError(f"unknown step {step!r}; steps: {', '.join(pipeline.steps)}")
    lower = "-" if since_ms is None else f"{since_ms}-0"
    counts: dict[str, int] = {}
    for part in keys.each():
        for event_type in pipeline.steps[step].consumes:
            stream, known = part.stream(event_type), record_field(event_type, step)
            began = await cast(Awaitable[Any], client.hget(part.known_groups, known))
            if began is None or not as_text(began).startswith("end "):
                continue  # a group given its stream from the start: nothing it missed
            copied = await _copy_back(client, part, stream, known, step, lower,
                                      as_text(began)[4:])
            if copied:
                counts[stream] = copied
    return BackfillResult(step, sum(counts.values()), counts)


async def _copy_back(client: Redis, part: StreamKeys, stream: str, known: str, step: str,
                     lower: str, upper: str) -> int:
    """Copy ``stream``'s entries from ``upper`` down to ``lower`` for ``step``, newest
    chunk first; how many."""
    copied = 0
    while True:
        batch = await client.xrevrange(stream, upper, lower, count=CHUNK)
        if not batch:
            return copied
        oldest = batch[-1][0]
        copies = [{k: v for k, v in fields.items() if k not in _NOT_COPIED} | {REPLAY_FOR: step}
                  for _, fields in reversed(batch) if REPLAY_FOR not in fields]
        async with client.pipeline(transaction=True) as pipe:
            for fields in copies:
                pipe.xadd(stream, fields)
            pipe.hset(part.known_groups, known, f"end ({oldest}")
            await pipe.execute()
        copied += len(copies)
        if len(batch) < CHUNK:
            return copied
        upper = f"({oldest}"
