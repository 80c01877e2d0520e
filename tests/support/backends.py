"""A backend for the contract suite (tests/contract): one server or a cluster, with a
client from printery's own ``connect`` and keys of one partition."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from printery.wire.keys import StreamKeys

#: Partitions of the backend's keys: the tests use one of them (``keys``), the overview
#: tests all of them, spread over the cluster's masters.
PARTITIONS = 3


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    client: aioredis.Redis
    #: One partition's keys (``<prefix>:{p1}:...``): one slot on the cluster.
    keys: StreamKeys
    #: Every partition's keys.
    whole: StreamKeys
