"""The one outage policy (printery.store.outage) against a real server that is down, comes
up late, or refuses a command: what is unreachable is waited out with backoff, until a
deadline, a give-up or the stop; anything else the server answers is raised at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from printery.servers.process import ServerProcess
from printery.store import CommandRefused, Outage, unreachable
from printery.transport.connection import connect


async def test_a_server_that_comes_up_late_is_waited_for(own_server: ServerProcess) -> None:
    own_server.stop()
    client = connect(own_server.url)
    attempts: list[int] = []
    twice = asyncio.Event()

    def attempt(exc: BaseException, n: int, delay: float) -> None:
        assert unreachable(exc) and 0 < delay <= 2.0
        attempts.append(n)
        if n >= 2:
            twice.set()

    outage = Outage("test", on_attempt=attempt)
    answer = asyncio.create_task(outage.retrying(client.ping))
    try:
        await asyncio.wait_for(twice.wait(), 10)
        assert not outage.connected and not answer.done()
        await asyncio.to_thread(own_server.start)
        assert await asyncio.wait_for(answer, 15) is True
    finally:
        answer.cancel()
        await client.aclose()
    assert attempts[:2] == [1, 2] and outage.connected


async def test_a_deadline_a_give_up_and_the_stop_end_the_wait(own_server: ServerProcess) -> None:
    own_server.stop()
    client = connect(own_server.url)
    try:
        begun = time.monotonic()
        with pytest.raises(TimeoutError, match="server unreachable"):
            await Outage("test").retrying(client.ping, deadline=time.monotonic() + 0.5)
        assert time.monotonic() - begun < 5

        with pytest.raises(Exception) as given_up:
            await Outage("test").retrying(client.ping, give_up=lambda: True)
        assert unreachable(given_up.value)

        stopping = asyncio.Event()
        stopper = Outage("test", stopping, on_attempt=lambda *_: stopping.set())
        begun = time.monotonic()
        with pytest.raises(Exception) as stopped:
            await stopper.retrying(client.ping)
        assert unreachable(stopped.value) and time.monotonic() - begun < 5
    finally:
        await client.aclose()


async def test_a_refusal_is_raised_at_once(own_server: ServerProcess) -> None:
    client = connect(own_server.url)
    attempts: list[int] = []
    try:
        await client.set("not-a-stream", "text")
        outage = Outage("test", on_attempt=lambda _exc, n, _delay: attempts.append(n))
        with pytest.raises(CommandRefused, match="WRONGTYPE"):
            await outage.retrying(lambda: client.xlen("not-a-stream"))
    finally:
        await client.aclose()
    assert attempts == [] and outage.connected
