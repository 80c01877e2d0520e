"""Stream retention (issue 6): trim what every group has acknowledged, nothing else.

A stream entry may be dropped only when no consumer group can still need it: it is
below the oldest *pending* entry of every group (read, not acknowledged) and not above
any group's last-delivered id (never read at all). On top of that a retention age keeps
recent history for inspection and replay. The bound is computed and applied inside one
script call, so a group cannot move (or be created) between the two.

``dlq``, ``review`` and ``review:decided`` are never trimmed automatically: they hold
what a human has to look at. :func:`trim_stream` trims whatever key it is given (the
caller decides); :func:`trim_pipeline_streams` is the safe entry point that skips them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from printery.store import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.keys import DLQ, REVIEW, REVIEW_DECIDED, StreamKeys

#: Event types that hold work for humans; never trimmed by :func:`trim_pipeline_streams`.
NEVER_TRIMMED = frozenset({DLQ, REVIEW, REVIEW_DECIDED})

#: Trims below the safe bound (``trim.lua``: its keys, arguments and reply).
TRIM = script("trim")


@dataclass(frozen=True, slots=True)
class TrimResult:
    """What one trim did: ``trimmed`` entries removed, everything below ``minid`` gone."""

    stream: str
    trimmed: int
    minid: str


async def trim_stream(
    client: Redis,
    stream: str,
    *,
    retention: float | None = None,
    keep_after_ms: int | None = None,
    trim_without_groups: bool = False,
    approximate: bool = False,
    scripts: Scripts | None = None,
) -> TrimResult:
    """Trim ``stream`` (XTRIM MINID) below the safe bound.

    The bound is the lowest of: every group's oldest pending id, the id just after every
    group's last-delivered id, ``now - retention`` (seconds, server clock) and ``keep_after_ms``
    (an entry-id timestamp). A stream that no group reads is left alone unless
    ``trim_without_groups`` (a group created later would start from its beginning).
    ``approximate`` trims whole macro nodes only (cheaper; never removes more).
    """
    runner = scripts or Scripts(client)
    args = [
        "" if retention is None else str(int(retention * 1000)),
        "" if keep_after_ms is None else str(int(keep_after_ms)),
        "1" if trim_without_groups else "0",
        "1" if approximate else "0",
    ]
    reply = cast(list[Any], await runner.call(TRIM, [stream], args))
    return TrimResult(stream=stream, trimmed=int(reply[0]), minid=str(reply[1]))


async def trim_pipeline_streams(
    client: Redis,
    keys: StreamKeys,
    event_types: Iterable[str],
    retention_s: float,
    *,
    approximate: bool = True,
    trim_without_groups: bool = False,
) -> dict[str, int]:
    """Trim each event type's stream with :func:`trim_stream`; ``dlq``, ``review`` and
    ``review:decided`` are skipped whatever ``event_types`` says. Returns entries trimmed
    per event type (summed over the partitions)."""
    scripts = Scripts(client)
    trimmed: dict[str, int] = {}
    for event_type in event_types:
        if event_type in NEVER_TRIMMED:
            continue
        for part in keys.each():
            result = await trim_stream(
                client, part.stream(event_type), retention=retention_s,
                approximate=approximate, trim_without_groups=trim_without_groups,
                scripts=scripts,
            )
            trimmed[event_type] = trimmed.get(event_type, 0) + result.trimmed
    return trimmed


__all__ = ["NEVER_TRIMMED", "TrimResult", "trim_pipeline_streams", "trim_stream"]
