"""Connections open to a server that restarts (transport/channel.py): the channels that
keep a connection of their own (a Map's collector counts, the committer, the record
lookup, the limit store) drop one the old server closed before their next round trip, as
the pool does, so the first round trip after a restart is not a failed delivery.

Before: a Map's collector counted its first item after a restart on the connection the
old server had closed, got ``ConnectionError: Connection closed by server`` and burned a
delivery of that item's result (with ``max_deliveries=1`` the run failed), and a
:class:`~printery.Client` that had submitted before the restart failed its next submit."""

from __future__ import annotations

import asyncio
from typing import Any

from printery import Client, Map, Message, Pipeline
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from printery.transport.channel import DirectChannel
from printery.transport.connection import connect
from support.spine import pipeline_starter


async def test_a_channel_reconnects_by_itself_after_the_server_restarts(
    own_server: ServerProcess,
) -> None:
    client = connect(own_server.url, block_ms=100)
    channel = DirectChannel(client)
    try:
        assert await channel.commands([("PING",)]) == ["PONG"]
        await asyncio.to_thread(own_server.stop)
        await asyncio.to_thread(own_server.start)
        assert await client.ping()  # the pool's connection: checked before reuse
        # The channel's connection was closed by the old server: dropped before the send.
        assert await channel.commands([("PING",)]) == ["PONG"]
        (reply,) = await channel.transactions([[("MULTI",), ("SET", "k", "v"), ("EXEC",)]])
        assert reply == ["OK"]
    finally:
        await channel.close()
        await client.aclose()


def _words(message: Message) -> list[Any]:
    return list(message.data["words"])


async def _upper(message: Message) -> dict[str, Any]:
    return {"text": str(message.data).upper()}


async def test_a_map_collects_after_a_server_restart_without_burning_a_delivery(
    own_server: ServerProcess,
) -> None:
    pipeline = Pipeline("docs", ingress=["document"])
    pipeline.add(Map("words", consumes="document", produces="merged", split=_words,
                     each=_upper))
    prefix = unique_prefix()
    client = connect(own_server.url, block_ms=100)
    try:
        # One delivery only: a collect that fails once on a stale connection fails the run.
        async with pipeline_starter(own_server.url, client, prefix, max_deliveries=1) as start:
            submitter = await start(pipeline)
            before = await submitter.submit({"words": ["a", "b"]})
            assert (await submitter.result(before, timeout=20)).status == "merged"
            await asyncio.to_thread(own_server.stop)
            await asyncio.to_thread(own_server.start)
            # A client of its own after the restart: the workers' connections are the
            # stale ones here (the collector's counts above all).
            async with Client(own_server.url, stream_prefix=prefix, app=pipeline) as fresh:
                after = await fresh.submit({"words": ["c", "d", "e"]})
                result = await fresh.result(after, timeout=30)
            assert (result.status, result.data) == (
                "merged", {"items": [{"text": "C"}, {"text": "D"}, {"text": "E"}], "failed": []})
            assert await client.xlen(f"{prefix}:dlq") == 0
            # And the client that submitted before the restart submits again at once.
            again = await submitter.submit({"words": ["f"]})
            assert (await submitter.result(again, timeout=30)).status == "merged"
    finally:
        await client.aclose()
