"""A pipeline's start, whoever starts it (the service, or an application running
``Pipeline.build_workers`` under its own manager): every consumer group of the pipeline
placed where it must start (:mod:`printery.transport.groups`: at 0 on the pipeline's
first start on this server, at the end of its stream for a group added later, in the
place of the group it was ``renamed_from``), and what changed said in the log.

Its namesake in other layers (the same job there): :mod:`printery.service.groups`."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from printery.store import Redis
from printery.transport.groups import END, RENAMED, Placement, Reader, place_groups
from printery.wire.keys import StreamKeys

__all__ = ["place_pipeline_groups"]

log = structlog.get_logger("printery.service")


async def place_pipeline_groups(client: Redis, keys: StreamKeys,
                                readers: Sequence[Reader]) -> list[Placement]:
    """Place every group of ``readers`` (all of one pipeline's) in every partition; a
    group that starts at the end of its stream (the pipeline has run here before) and a
    rename are logged, naming the step, the stream and the id."""
    placed = await place_groups(client, keys, readers)
    for placement in placed:
        reader = placement.reader
        if placement.how == END:
            log.info("new consumer group starts at the end of its stream", step=reader.group,
                     stream=placement.stream, id=placement.at)
        elif placement.how == RENAMED:
            log.info("consumer group renamed", step=reader.group,
                     renamed_from=reader.renamed_from, stream=placement.stream,
                     id=placement.at, pending_moved=placement.moved)
    return placed
