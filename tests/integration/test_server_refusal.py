"""A server that refuses the credentials is configuration, not an outage: a client, a
follower and a command say so at once instead of backing off until their deadline
(``AuthenticationError`` is a ``ConnectionError`` in the client library)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from printery import Client, Message, Pipeline, ServerRefused, TransportError
from printery.servers.process import ServerProcess
from printery.store import Outage
from support.operator_cli import cli_sync


@pytest.fixture
async def wrong_url(server: ServerProcess, client: aioredis.Redis) -> AsyncIterator[str]:
    """The URL of a user that exists, with a password that is not its own."""
    user = f"u{uuid.uuid4().hex[:8]}"
    await client.execute_command("ACL", "SETUSER", user, "on", ">right", "~*", "+@all")
    host_port = server.url.removeprefix("redis://")
    yield f"redis://{user}:wrong@{host_port}"
    await client.execute_command("ACL", "DELUSER", user)


def _pipeline() -> Pipeline:
    p = Pipeline("refused", ingress=["in"])

    @p.step("s", consumes=["in"], produces=["out"])
    async def s(message: Message) -> None:
        return None

    return p


async def test_a_client_says_credentials_at_once(wrong_url: str) -> None:
    with pytest.raises(ServerRefused, match="refused the credentials") as caught:
        async with Client(wrong_url, app=_pipeline()):
            pass
    assert isinstance(caught.value, TransportError)  # still caught as a server problem


async def test_a_follower_does_not_wait_a_refusal_out(wrong_url: str) -> None:
    refused = aioredis.Redis.from_url(wrong_url)
    try:
        with pytest.raises(ServerRefused, match="refused the credentials"):
            # Until this deadline an outage is waited out; a refusal is raised at once.
            await Outage("test").retrying(refused.ping, deadline=time.monotonic() + 30)
    finally:
        await refused.aclose()


def test_a_command_says_credentials(wrong_url: str, prefix: str) -> None:
    result = cli_sync(wrong_url, prefix, "streams")
    assert result.returncode == 1
    assert "refused the credentials" in result.stderr
    assert "wrong" not in result.stderr  # the password is not printed
