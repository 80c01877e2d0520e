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

import redis.asyncio as aioredis

from printery.keys import DLQ, REVIEW, REVIEW_DECIDED, StreamKeys
from printery.transport.streams import Scripts

#: Event types that hold work for humans; never trimmed by :func:`trim_pipeline_streams`.
NEVER_TRIMMED = frozenset({DLQ, REVIEW, REVIEW_DECIDED})

# KEYS[1] stream; ARGV: retention ms ('' = no age limit), explicit cutoff ms ('' = none),
# '1' to trim a stream no group reads, '1' for approximate trimming.
# Returns {entries trimmed, the MINID used ('' when nothing was trimmed)}.
TRIM_LUA = """
local stream = KEYS[1]
local retention, keep_after = ARGV[1], ARGV[2]
local without_groups, approximate = ARGV[3] == '1', ARGV[4] == '1'
if redis.call('EXISTS', stream) == 0 then return {0, ''} end

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end

local bound = nil
local function lower(id)
  if bound == nil or less(id, bound) then bound = id end
end
if retention ~= '' then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  lower(string.format('%d-0', now_ms - tonumber(retention)))
end
if keep_after ~= '' then lower(keep_after .. '-0') end

local groups = redis.call('XINFO', 'GROUPS', stream)
if #groups == 0 and not without_groups then return {0, ''} end
for _, group in ipairs(groups) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  -- Never above what the group has read: later entries were delivered to no one yet.
  -- The last-delivered entry itself may go (read and, unless pending, acknowledged).
  local last_ms, last_seq = parse(info['last-delivered-id'])
  lower(string.format('%d-%d', last_ms, last_seq + 1))
  local pending = redis.call('XPENDING', stream, info['name'])
  if tonumber(pending[1]) > 0 then lower(pending[2]) end
end
if bound == nil then return {0, ''} end
local trimmed
if approximate then
  trimmed = redis.call('XTRIM', stream, 'MINID', '~', bound)
else
  trimmed = redis.call('XTRIM', stream, 'MINID', bound)
end
return {trimmed, bound}
"""


@dataclass(frozen=True, slots=True)
class TrimResult:
    """What one trim did: ``trimmed`` entries removed, everything below ``minid`` gone."""

    stream: str
    trimmed: int
    minid: str


async def trim_stream(
    client: aioredis.Redis,
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
    reply = cast(list[Any], await runner.call(TRIM_LUA, [stream], args))
    return TrimResult(stream=stream, trimmed=int(reply[0]), minid=_text(reply[1]))


async def trim_pipeline_streams(
    client: aioredis.Redis,
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["NEVER_TRIMMED", "TrimResult", "trim_pipeline_streams", "trim_stream"]
