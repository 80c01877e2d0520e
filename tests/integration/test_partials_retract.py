"""A retraction on a server that is slow to answer (runtime/partials.py): the attempt's
end waits at most a second for it, but the verdict is still written once the server
answers. Cut short with its batch, it left the draft open for ever (what the random
composition fuzz found under load). A real server, stopped with SIGSTOP."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from printery.runtime import partials
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from printery.wire.keys import StreamKeys


@dataclass
class _Envelope:
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class _Attempt:
    worker: str
    attempt: int
    correlation_id: str
    envelope: Any = field(default_factory=_Envelope)


async def test_a_retraction_the_server_answers_late_is_still_written(
    own_server: ServerProcess,
) -> None:
    client = aioredis.Redis.from_url(own_server.url, decode_responses=True)
    keys = StreamKeys("slow")
    writer = partials.PartialWriter(client, keys)
    token = partials.using(writer)
    attempt = _Attempt("draft", 1, "run-1")
    stream = keys.of("run-1").partials("run-1")
    pid = own_server.pid
    assert pid is not None
    try:
        # The writer's client has no connection yet: its write connects to the stopped
        # server (the handshake waits for a reply) when the wait runs out.
        os.kill(pid, signal.SIGSTOP)
        try:
            begun = time.monotonic()
            await partials.withdraw(attempt, [{"code": "timeout", "field": "", "message": "late"}])
            waited = time.monotonic() - begun
        finally:
            os.kill(pid, signal.SIGCONT)
        assert waited < partials.RETRACT_WAIT_S + 1, "the attempt's end did not wait for the server"

        async def verdict() -> list[dict[str, str]]:
            return [f for _, f in await client.xrange(stream) if f["kind"] == partials.VERDICT]

        (written,) = await wait_for(verdict, timeout=10, message="the retraction")
        assert written["passed"] == "0" and '"timeout"' in written["reasons"]
    finally:
        partials.using(None)
        del token
        await writer.close()
        await client.aclose()
