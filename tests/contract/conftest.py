"""The contract suite's one fixture: a backend (the session's single server, or the
session's cluster), with a client from printery's own ``connect`` and keys of one
partition, so that every key a behaviour touches is in one cluster slot as it is in the
engine. Each test is written once and runs on both (watermill's ``pubsub/tests`` is the
model); a behaviour that holds on one and not the other is a failure of the contract."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from printery.testing import unique_prefix
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.backends import PARTITIONS, Backend


@pytest.fixture(params=["server", pytest.param("cluster", marks=pytest.mark.cluster)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    target = request.getfixturevalue(request.param)
    client = connect(target.url)
    whole = StreamKeys(unique_prefix("contract"), partitions=PARTITIONS)
    try:
        yield Backend(request.param, target.url, client, whole.at(1), whole)
    finally:
        await client.aclose()
