"""The service's start: every consumer group of the pipeline placed where it must start
(:mod:`printery.transport.groups`), and what changed said in the log."""

from __future__ import annotations

from printery.keys import StreamKeys
from printery.logging import get_logger
from printery.pipeline.dag import Pipeline
from printery.store import Redis
from printery.transport.groups import END, RENAMED, Reader, place_groups

__all__ = ["prepare_groups", "readers_of"]

log = get_logger("printery.service")


def readers_of(pipeline: Pipeline) -> list[Reader]:
    """Every consumer group of ``pipeline``: each step on each type it consumes, with
    the name it was renamed from."""
    return [Reader(event_type, step.name, step.renamed_from)
            for step in pipeline.steps.values() for event_type in step.consumes]


async def prepare_groups(client: Redis, keys: StreamKeys, pipeline: Pipeline) -> None:
    """Create the pipeline's groups in every partition; a group that starts at the end
    of its stream (the pipeline has run here before) and a rename are logged, naming
    the step, the stream and the id."""
    for placed in await place_groups(client, keys, readers_of(pipeline)):
        reader = placed.reader
        if placed.how == END:
            log.info("new consumer group starts at the end of its stream", step=reader.group,
                     stream=placed.stream, id=placed.at)
        elif placed.how == RENAMED:
            log.info("consumer group renamed", step=reader.group,
                     renamed_from=reader.renamed_from, stream=placed.stream, id=placed.at,
                     pending_moved=placed.moved)
