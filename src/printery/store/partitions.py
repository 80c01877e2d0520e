"""The key layout lives in the server (docs/reference.md, Partitions): ``<prefix>:layout``.

The partition count is part of the data, not of each process's settings: every key a
run touches is named by it. The first ``printery-workers`` process on a prefix records it
(a hash written once, by one script: ``partitions``, ``written_at``, ``written_by``,
``source``); every later process, :class:`~printery.Client`, ``printery`` command and the
HTTP API reads it, so nobody has to be given the same N by hand, and nobody given another
one looks silently in the wrong keys.

What is recorded on the first start: the ``partitions`` setting when one is given; else
3 x the master count on a cluster (its masters when the record is written: the record,
not the master count, decides afterwards, so adding a master renames nothing); else 1 on
one server. Migration from the keys before the record: a process that finds no record
writes it from its setting; without a setting it refuses to guess when the pipeline's
partitioned streams exist already (``<prefix>:{p0}:<event type>``: N unknown).

An explicit setting that disagrees with the record is a configuration error (exit 2)
naming both counts. A reader that finds no record (no worker started yet) uses its
setting or the same default, without writing it.
"""

from __future__ import annotations

from collections.abc import Iterable

from printery.base._util import now_rfc3339
from printery.base.errors import ConfigError
from printery.settings.config import Settings
from printery.store import Redis
from printery.store.layout import existing_streams, master_count, read_layout, record_layout
from printery.transport.streams import one_slot
from printery.wire.keys import MAX_PARTITIONS, StreamKeys

__all__ = ["default_partitions", "read_partitions", "resolve_keys"]

#: Partitions per master on a cluster with no setting (README, "Choosing N").
PER_MASTER = 3


async def read_partitions(client: Redis, prefix: str) -> int | None:
    """The partition count recorded for ``prefix``, None when there is no record."""
    raw = await read_layout(client, prefix)
    return None if raw is None else _count(prefix, raw)


async def default_partitions(client: Redis) -> tuple[int, str]:
    """What a first start with no setting records, and why: 3 x the master count on a
    cluster, 1 on one server."""
    masters = await master_count(client)
    if masters is None:
        return 1, "one server"
    return min(MAX_PARTITIONS, max(2, PER_MASTER * masters)), f"{PER_MASTER} x {masters} masters"


async def resolve_keys(
    client: Redis, settings: Settings, *, event_types: Iterable[str] = (),
    writer: str | None = None, setting_source: str | None = None,
) -> StreamKeys:
    """The keys of ``settings``'s prefix in its recorded layout. ``writer`` (a
    ``printery-workers`` process) records the layout when there is none; ``event_types``
    (the pipeline's) are looked for as partitioned streams before a default is recorded.
    :class:`ConfigError` when the setting disagrees with the record, or when a writer
    with no setting finds partitioned streams and no record."""
    prefix, given = settings.stream_prefix, settings.transport.partitions
    label = f"transport.partitions ({setting_source})" if setting_source else "transport.partitions"
    recorded = await read_partitions(client, prefix)
    if recorded is None and writer is not None:
        if given is not None:
            count, source = given, "setting"
        else:
            await _refuse_to_guess(client, prefix, event_types)
            count, source = await default_partitions(client)
        raw = await record_layout(client, prefix, count, written_at=now_rfc3339(),
                                  writer=writer, source=source)
        recorded = _count(prefix, raw)
    if recorded is None:  # a reader before any worker: what the first worker would record
        recorded = given if given is not None else (await default_partitions(client))[0]
    elif given is not None and given != recorded:
        raise ConfigError(
            label, given,
            f"{prefix}:layout records {recorded} partitions, this setting gives {given}: "
            f"the count belongs to the data; leave the setting out (or set it to {recorded}), "
            "or drain and use another stream prefix to change it")
    if one_slot(client) and recorded < 2:
        raise ConfigError(label, recorded, "2 or more on a cluster (redis+cluster://): one "
                          "partition's keys carry no hash tag")
    return StreamKeys(prefix, recorded)


async def _refuse_to_guess(client: Redis, prefix: str, event_types: Iterable[str]) -> None:
    """Streams of partition 0 exist and nobody recorded how many partitions there are:
    a default could be another count than theirs (migration needs the setting once)."""
    part0 = StreamKeys(prefix, 2, 0)  # partition 0's names are the same for every N >= 2
    found = await existing_streams(client, [part0.stream(event_type) for event_type in event_types])
    if found:
        raise ConfigError(
            "transport.partitions", None,
            f"partitioned streams exist under {prefix!r} ({found[0]}) and {prefix}:layout "
            "records no partition count: give the count they were written with once "
            "(--partitions N, PRINTERY_PARTITIONS or [transport] partitions); it is then recorded")


def _count(prefix: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_PARTITIONS:
        raise ConfigError(f"{prefix}:layout", text, f"a partition count 1..{MAX_PARTITIONS}")
    return int(text)
