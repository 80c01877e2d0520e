"""Secure connections (issue 6 item 7): ``rediss://`` with a CA the test generates, and an
ACL user allowed only the commands printery needs (the rule is documented in
docs/security.md; keep the two in sync)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import trustme
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError

from printery import Budget, ConsumerSettings, Limit, Pipeline, StreamWorker
from printery.base.errors import Reject, Retry
from printery.runtime.handler import Message, Output
from printery.servers.process import ServerProcess
from printery.service.registry import ProcessRegistry, list_processes
from printery.service.retention import trim_stream
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.acl import acl_denials, acl_rule
from support.spine import CODEC, outputs_by_n, publish, running_pipeline
from support.tls_proxy import TlsProxy


async def _relay_run(client: aioredis.Redis, keys: StreamKeys, n: int) -> StreamWorker:
    """Exercise everything a stream worker does: reads, commits, retries (redeliver),
    dead letters, leases (visibility 0.6 s; handler runs 0.5 s), claims."""
    attempts: dict[int, int] = {}

    async def handler(msg: Message) -> Output:
        i = int(msg.data["n"])
        attempts[i] = attempts.get(i, 0) + 1
        if i == 0:
            raise Reject("bad_input", "entry 0 is rejected")
        if i == 1 and attempts[i] == 1:
            raise Retry("once more")
        if i == 2:
            await asyncio.sleep(0.5)
        return Output("out", msg.data)

    worker = StreamWorker(
        "w", client=client, keys=keys, consumes=["in"], handler=handler, codec=CODEC,
        settings=ConsumerSettings(block_ms=100, visibility_timeout=0.6, claim_interval=0.1,
                                  retry_backoff_ms=20),
    )
    manager = WorkerManager(drain_timeout=2)
    manager.register(worker)
    await manager.start_all()
    try:
        await publish(client, keys, "in", n)
        await wait_for(lambda: _xlen_at_least(client, keys.stream("out"), n - 1), timeout=15)
        await wait_for(lambda: _xlen_at_least(client, keys.dlq, 1), timeout=5)
    finally:
        await manager.stop_all(2)
    assert await outputs_by_n(client, keys, "out") == {i: 1 for i in range(1, n)}
    assert worker.stats().errors >= 1  # the retry happened
    return worker


async def _xlen_at_least(client: aioredis.Redis, key: str, n: int) -> bool:
    return int(await client.xlen(key)) >= n


# -- TLS -------------------------------------------------------------------------------


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    path = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(path))
    return authority, path


async def test_stream_worker_over_rediss(
    server: ServerProcess, prefix: str, ca: tuple[trustme.CA, Path], tmp_path: Path
) -> None:
    authority, ca_path = ca
    async with TlsProxy("127.0.0.1", server.port, authority) as proxy:
        url = f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={ca_path}"
        client = connect(url, block_ms=100)
        try:
            assert await client.ping()
            await _relay_run(client, StreamKeys(prefix), 10)
        finally:
            await client.aclose()
        assert proxy.connections >= 2  # the blocking reads have their own connections

        # A CA the client does not trust: the handshake fails, nothing is sent.
        other = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other))
        stranger = connect(f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={other}")
        with pytest.raises(RedisConnectionError) as failure:
            await stranger.ping()
        assert isinstance(failure.value.__context__, ssl.SSLError) or "certificate" in str(
            failure.value
        ).lower()
        await stranger.aclose()
        # Plain text against the TLS port is refused too.
        plain = aioredis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=3,
                               socket_connect_timeout=3)
        with pytest.raises((RedisConnectionError, ResponseError, TimeoutError, OSError)):
            await plain.ping()
        await plain.aclose()


# -- ACL -------------------------------------------------------------------------------


async def test_stream_worker_registry_and_trim_under_minimal_acl_user(
    server: ServerProcess, prefix: str, client: aioredis.Redis
) -> None:
    user, password = f"printery-{prefix.rsplit(':', 1)[-1]}", "s3cret-pw"
    await client.execute_command("ACL", "SETUSER", user, *acl_rule(prefix, password))
    await client.execute_command("ACL", "LOG", "RESET")
    limited = connect(f"redis://{user}:{password}@127.0.0.1:{server.port}/0", block_ms=100)
    try:
        keys = StreamKeys(prefix)
        await _relay_run(limited, keys, 10)
        registry = ProcessRegistry(limited, keys, "proc-1", interval=0.1, ttl=5)
        await registry.beat({"pid": 1})
        assert [p.get("pid") for p in await list_processes(limited, keys)] == [1]
        await registry.remove()
        result = await trim_stream(limited, keys.stream("in"), retention=0)
        assert result.trimmed >= 1
        denied = acl_denials(await client.execute_command("ACL", "LOG"), user)
        assert denied == [], f"commands the rule misses: {denied}"

        # Outside its prefix, and anything not on the list, is refused.
        with pytest.raises(NoPermissionError):
            await limited.set("elsewhere:key", "1")
        with pytest.raises(NoPermissionError):
            await limited.execute_command("FLUSHALL")
        with pytest.raises(NoPermissionError):
            await limited.execute_command("CONFIG", "GET", "dir")
    finally:
        await limited.aclose()
        await client.execute_command("ACL", "DELUSER", user)


async def test_budgets_and_limits_under_minimal_acl_user(
    server: ServerProcess, prefix: str, client: aioredis.Redis
) -> None:
    """A pipeline with a budget that stops a run and a step behind every kind of limit
    runs under the documented rule: nothing it sends is refused."""
    user, password = f"printery-b-{prefix.rsplit(':', 1)[-1]}", "s3cret-pw"
    await client.execute_command("ACL", "SETUSER", user, *acl_rule(prefix, password))
    await client.execute_command("ACL", "LOG", "RESET")
    limited = connect(f"redis://{user}:{password}@127.0.0.1:{server.port}/0", block_ms=100)
    pipeline = Pipeline("acl", ingress=["job"], cost_units=["usd", "tokens"],
                        budget=Budget(usd=2, soft=0.5), outcomes=())

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["usd", "tokens"],
                   limits=[Limit("api", concurrency=2, requests_per_minute=1000,
                                 tokens_per_minute=100_000)],
                   budget=Budget(tokens=1_000))
    async def work(message: Message) -> Output:
        message.report_cost("usd", 1)
        message.report_cost("tokens", 10)
        return Output("done", message.data, idempotency_key=f"done:{message.data['n']}")

    keys = StreamKeys(prefix)
    try:
        async with running_pipeline(pipeline, client=limited, keys=keys,
                                    settings=ConsumerSettings(block_ms=100)):
            for n in range(3):  # one at a time: the third finds the run at its limit
                await limited.xadd(keys.stream("job"), {
                    "data": f'{{"n": {n}}}', "correlation_id": "r1", "idempotency_key": f"j{n}"})
                await wait_for(lambda n=n: _xlen_at_least(
                    limited, keys.stream("done" if n < 2 else "budget:exceeded"), min(n + 1, 2)
                    if n < 2 else 1), timeout=15)
        assert await limited.xlen(keys.stream("done")) == 2
        assert await limited.xlen(keys.stream("budget:warning")) == 1
        denied = acl_denials(await client.execute_command("ACL", "LOG"), user)
        assert denied == [], f"commands the rule misses: {denied}"
    finally:
        await limited.aclose()
        await client.execute_command("ACL", "DELUSER", user)
