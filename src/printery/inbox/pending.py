"""Pending entries (reference: failures): entries a consumer group was delivered and has not
acknowledged, for ``printery pending``.

Read from the server alone (``XPENDING`` of every group of the pipeline on every stream
and partition, then each entry's fields for its run), so it answers whether or not a
worker runs. An entry is named as commands name entries (``<id>@p<k>`` with several
partitions, :meth:`~printery.wire.keys.StreamKeys.entry_ref`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from printery.runs.history import id_order
from printery.runtime.run_index import RunIndex
from printery.runtime.writes import dead_letter_write
from printery.store import CommandRefused, Redis, ServerError
from printery.store.scan import read_entries, read_entry
from printery.transport.dead_letter import write_dead_letter
from printery.transport.scripts import Scripts
from printery.transport.streams import CONNECTION_ERRORS, pending_range
from printery.wire.envelope import Codec, correlation_of
from printery.wire.keys import StreamKeys

__all__ = ["OPERATOR", "PendingEntry", "dead_letter_pending", "find_pending", "pending_entries"]

#: The ``reason_code`` of an entry an operator dead-lettered (``printery pending dlq``).
OPERATOR = "operator"
#: Its ``error`` when the operator gave no reason.
OPERATOR_ERROR = "dead-lettered by an operator"

#: Entries asked for per XPENDING call (a page; every page is read).
PAGE = 1000


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """One entry pending in one group: ``worker`` is the group (the step), ``consumer``
    the consumer holding it, ``deliveries`` how often Redis delivered it, ``idle_ms``
    since its last delivery (or lease renewal), ``run_id`` the run it belongs to ("" when
    it names none, or when the entry itself is gone from its stream)."""

    keys: StreamKeys
    event_type: str
    entry_id: str
    worker: str
    consumer: str
    deliveries: int
    idle_ms: int
    run_id: str = ""

    @property
    def ref(self) -> str:
        """The entry as commands name it."""
        return self.keys.entry_ref(self.entry_id)

    @property
    def stream(self) -> str:
        return self.keys.stream(self.event_type)

    def view(self) -> dict[str, Any]:
        """As ``printery pending --json`` shows it."""
        row: dict[str, Any] = {
            "id": self.ref, "stream": self.stream, "type": self.event_type,
            "worker": self.worker, "consumer": self.consumer, "deliveries": self.deliveries,
            "idle_ms": self.idle_ms, "run_id": self.run_id,
        }
        if self.keys.partitioned:
            row["partition"] = self.keys.partition
        return row


def _pairs(
    groups: Mapping[str, Sequence[str]], worker: str | None
) -> list[tuple[str, str]]:
    """``(event type, group)`` of every group reading a stream (of ``worker`` only)."""
    return [(event_type, group) for event_type, names in groups.items() for group in names
            if worker is None or group == worker]


async def _page(
    client: Redis, stream: str, group: str, start: str, count: int
) -> list[dict[str, Any]]:
    """One page of ``XPENDING stream group start + count``; empty when the stream or
    the group does not exist (no worker ever started on it)."""
    try:
        rows = await pending_range(client, stream, group, start, "+", count)
    except CommandRefused as exc:
        if isinstance(exc, CONNECTION_ERRORS) or "NOGROUP" not in str(exc):
            raise
        return []
    return rows


def _entry(part: StreamKeys, event_type: str, group: str, row: Mapping[str, Any]) -> PendingEntry:
    return PendingEntry(part, event_type, str(row["message_id"]), group,
                        str(row["consumer"]), int(row["times_delivered"]),
                        int(row["time_since_delivered"]))


async def _with_runs(
    client: Redis, entries: list[PendingEntry], correlation_field: str
) -> list[PendingEntry]:
    """``entries`` with the run each belongs to, read from its fields (one pipelined
    round trip per page)."""
    done: list[PendingEntry] = []
    for start in range(0, len(entries), PAGE):
        chunk = entries[start:start + PAGE]
        found = await read_entries(client, [(entry.stream, entry.entry_id) for entry in chunk])
        for entry, fields in zip(chunk, found, strict=True):
            run_id = "" if fields is None else correlation_of(fields, correlation_field) or ""
            done.append(PendingEntry(entry.keys, entry.event_type, entry.entry_id,
                                     entry.worker, entry.consumer, entry.deliveries,
                                     entry.idle_ms, run_id))
    return done


async def pending_entries(
    client: Redis,
    keys: StreamKeys,
    groups: Mapping[str, Sequence[str]],
    correlation_field: str,
    *,
    worker: str | None = None,
) -> list[PendingEntry]:
    """Every entry pending in a group of ``groups`` (event type -> the groups reading its
    stream, :meth:`Pipeline.groups <printery.Pipeline.groups>`), of ``worker``'s group
    only when given, on every partition; oldest first (by entry id, then stream and
    group)."""
    found: list[PendingEntry] = []
    for event_type, group in _pairs(groups, worker):
        for part in keys.each():
            stream, start = part.stream(event_type), "-"
            while True:
                rows = await _page(client, stream, group, start, PAGE)
                found += [_entry(part, event_type, group, row) for row in rows]
                if len(rows) < PAGE:
                    break
                start = "(" + str(rows[-1]["message_id"])
    found = await _with_runs(client, found, correlation_field)
    found.sort(key=lambda e: (id_order(e.entry_id), e.stream, e.worker))
    return found


async def find_pending(
    client: Redis,
    keys: StreamKeys,
    groups: Mapping[str, Sequence[str]],
    correlation_field: str,
    ref: str,
    *,
    worker: str | None = None,
) -> list[PendingEntry]:
    """The entry named ``ref`` (``<id>`` or ``<id>@p<k>``) in every group (of ``worker``
    only when given) that holds it pending: none, one, or several when groups of several
    steps hold the same entry (or, with a bare id, entries of several partitions)."""
    parts, entry_id = keys.resolve_ref(ref)
    if id_order(entry_id) == (0, 0) and entry_id not in ("0-0", "0"):
        return []  # not an entry id at all
    found: list[PendingEntry] = []
    for event_type, group in _pairs(groups, worker):
        for part in parts:
            try:
                rows = await pending_range(client, part.stream(event_type), group, entry_id,
                                           entry_id, 1)
            except ServerError as exc:
                if isinstance(exc, CONNECTION_ERRORS):
                    raise
                continue  # no such stream or group, or an id the server refuses
            found += [_entry(part, event_type, group, row) for row in rows]
    return await _with_runs(client, found, correlation_field)


async def dead_letter_pending(
    client: Redis,
    entry: PendingEntry,
    codec: Codec,
    *,
    reason: str = "",
    ingress: Sequence[str] = (),
    outcomes: Sequence[str] = (),
) -> str | None:
    """Dead-letter one pending ``entry`` by hand (reference: failures): its ``dlq`` entry
    (``reason_code`` :data:`OPERATOR`, ``error`` the ``reason`` or
    :data:`OPERATOR_ERROR`), its run's ``run:failed`` outcome and the run index's writes
    (``ingress`` and ``outcomes`` are the pipeline's), and its acknowledgement, in the
    one script the workers dead-letter with, fenced on the entry still being pending in
    its group (whoever holds it). The dlq entry's id as commands name it, or None when
    the entry is no longer pending (acknowledged or dead-lettered meanwhile)."""
    part = entry.keys
    fields = await read_entry(client, entry.stream, entry.entry_id) or {}
    write = dead_letter_write(
        part, codec, group=entry.worker, stream=entry.stream, entry_id=entry.entry_id,
        consumer="", fields=fields, reason_code=OPERATOR, error=reason or OPERATOR_ERROR,
        deliveries=entry.deliveries,
        index=RunIndex(part, ingress=ingress, outcomes=outcomes))
    dlq_id = await write_dead_letter(Scripts(client), write)
    return None if dlq_id is None else part.entry_ref(dlq_id)

