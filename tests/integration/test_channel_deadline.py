"""The wire channel's bound on a round trip (transport/channel.py): a server that stops
answering (SIGSTOP, a real process) fails the round trip with ``TimeoutError`` after the
client's socket timeout, the waiting task is left uncancelled, and the channel works
again once the server does."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import redis.asyncio as aioredis

from printery.servers.process import ServerProcess
from printery.transport.channel import DirectChannel


async def test_a_round_trip_past_the_socket_timeout_raises_and_the_channel_recovers(
    own_server: ServerProcess,
) -> None:
    client = aioredis.Redis.from_url(own_server.url, decode_responses=True, socket_timeout=0.5)
    channel = DirectChannel(client)
    pid = own_server.pid
    assert pid is not None
    try:
        assert await channel.commands([("PING",)]) == ["PONG"]
        os.kill(pid, signal.SIGSTOP)
        try:
            begun = time.monotonic()
            stuck = asyncio.create_task(channel.commands([("PING",)]))
            done, _ = await asyncio.wait({stuck}, timeout=10)
            waited = time.monotonic() - begun
        finally:
            os.kill(pid, signal.SIGCONT)
        assert done, "the round trip is bounded"
        assert isinstance(stuck.exception(), TimeoutError), stuck.exception()
        assert not stuck.cancelled() and stuck.cancelling() == 0, "a timeout, not a cancellation"
        assert waited >= 0.5, "not before the socket timeout"
        assert await channel.commands([("PING",)]) == ["PONG"], "a new connection after the drop"
        (reply,) = await channel.transactions([[("MULTI",), ("SET", "k", "v"), ("GET", "k"), ("EXEC",)]])
        assert reply == ["OK", "v"]
    finally:
        await channel.close()
        await client.aclose()
