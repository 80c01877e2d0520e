"""The service's start: every consumer group of the pipeline placed where it must start,
as any start of the pipeline does (:mod:`printery.runtime.groups`).

Its namesake in other layers (the same job there): :mod:`printery.transport.groups`."""

from __future__ import annotations

from printery.pipeline.dag import Pipeline, readers_of
from printery.runtime.groups import place_pipeline_groups
from printery.store import Redis
from printery.wire.keys import StreamKeys

__all__ = ["prepare_groups"]


async def prepare_groups(client: Redis, keys: StreamKeys, pipeline: Pipeline) -> None:
    """Create the pipeline's groups in every partition (logged where one starts at the
    end of its stream, or takes a renamed step's place)."""
    await place_pipeline_groups(client, keys, readers_of(pipeline))
