"""Reading a run's history back from the streams: every entry of one correlation id.

Streams are append-only history; these helpers scan them with XRANGE in chunks
(O(stream length)): fine for operator use (``trace``, ``replay``, ``cost``), not for a
hot path. An entry belongs to a run by :func:`~printery.wire.envelope.correlation_of`: its
correlation field, else the id inside its ``data`` (what an external producer that wrote
only ``data`` leaves), so such entries are found like any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from printery.base import _json
from printery.store import Redis
from printery.store.scan import scan_stream
from printery.wire.envelope import correlation_of
from printery.wire.fields import DELIVERIES

__all__ = ["decode_fields", "find_entries", "id_order"]


async def find_entries(
    client: Redis, stream: str, field: str, value: str
) -> list[tuple[str, dict[str, str]]]:
    """Entries of ``stream`` of the run ``value`` (correlation ``field``), oldest first."""
    return [(i, f) async for i, f in scan_stream(client, stream)
            if correlation_of(f, field) == value]


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair (milliseconds, sequence); (0, 0) for text
    that is no entry id (a client's ``Last-Event-ID``, say)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


#: Fields that hold a number, shown as one (``"deliveries": 1``).
_NUMBERS: dict[str, Callable[[str], int | float]] = {
    "attempt": int, DELIVERIES: int, "duration_ms": float,
}


def decode_fields(fields: Mapping[str, str]) -> dict[str, Any]:
    """An entry's fields as a reader wants them: ``data`` and ``cost`` parsed from JSON
    and the counts as numbers, each where possible (else kept as written)."""
    out: dict[str, Any] = dict(fields)
    for name in ("data", "cost"):
        raw = fields.get(name)
        if raw is not None:
            try:
                out[name] = _json.loads(raw)
            except (_json.JSONDecodeError, ValueError):
                out[name] = raw
    for name, number in _NUMBERS.items():
        raw = fields.get(name)
        if raw is not None:
            with contextlib.suppress(ValueError):
                out[name] = number(raw)
    return out

