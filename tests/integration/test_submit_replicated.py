"""Acknowledged submits survive a failover (issue 31): a submit waits for a replica to
have it (``WAIT 1``, on the connection that wrote it) when the master it was written to
has one, so a kill -9 of that master right after the acknowledgement loses none;
``[transport] submit_wait = 0`` turns the wait off."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from printery import Output
from printery.pipeline.dag import Pipeline
from printery.runs.facade import Runs
from printery.servers.process import ServerProcess
from printery.transport.connection import connect
from printery.wire.envelope import DEFAULT_PAYLOAD_LIMIT
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster


def _pipeline() -> Pipeline:
    pipeline = Pipeline("p", ingress=["in"])

    @pipeline.step("s", consumes=["in"], produces=["out"])
    async def step(message: object) -> Output:
        return Output("out", {})

    return pipeline


async def _in_sync(client: Any, timeout: float = 30) -> None:
    """Until the replica is online (its first sync done: before, a WAIT could not be
    answered and is not sent)."""
    deadline = time.monotonic() + timeout
    while (await client.info("replication")).get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica did not come online"
        await asyncio.sleep(0.05)


@pytest.mark.slow  # a master and its replica of its own, started and synced
async def test_a_submit_waits_for_the_replica_of_one_server(tmp_path: Path) -> None:
    # The replica's first sync at once (the server's default waits 5 s for more replicas).
    master = ServerProcess(tmp_path / "master", extra_args=["--repl-diskless-sync-delay", "0"])
    master.start()
    replica = ServerProcess(tmp_path / "replica", extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    client = connect(master.url)

    async def waits() -> int:
        return int((await client.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0))

    try:
        await _in_sync(client)
        keys = StreamKeys(f"wait:{uuid.uuid4().hex[:8]}")
        runs = Runs(client, keys, _pipeline(), payload_limit=DEFAULT_PAYLOAD_LIMIT)
        await asyncio.gather(*(runs.submit({"n": n}) for n in range(50)))
        await runs.close()
        waited = await waits()
        assert 1 <= waited <= 50  # submits in flight together share one WAIT
        off = Runs(client, keys, _pipeline(), payload_limit=DEFAULT_PAYLOAD_LIMIT, replicated=0)
        await off.submit({"n": "off"})
        await off.close()
        assert await waits() == waited
        assert await client.xlen(keys.stream("in")) == 51
    finally:
        await client.aclose()
        replica.stop()
        master.stop()


async def test_acknowledged_submits_survive_a_kill_of_their_master(own_cluster: ValkeyCluster) -> None:
    client = connect(own_cluster.url)
    keys = StreamKeys(f"wait:{uuid.uuid4().hex[:8]}", 3)
    runs = Runs(client, keys, _pipeline(), payload_limit=DEFAULT_PAYLOAD_LIMIT)
    try:
        victim = own_cluster.master_of(keys.at(0).stream("in"))
        mine = [run for run in (f"run-{n}" for n in range(600))
                if own_cluster.master_of(keys.of(run).stream("in")) is victim]
        acknowledged = await asyncio.gather(*(runs.submit({"n": run}, run_id=run) for run in mine))
        assert len(acknowledged) >= 100
        waited = int(victim.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
        # At once after the last acknowledgement: kill -9; the replica takes over.
        promoted = await asyncio.to_thread(own_cluster.kill_master, victim)
        with promoted.client() as node:
            on_promoted = {entry_id for part in keys.each()
                           if own_cluster.master_of(part.stream("in")) is promoted
                           for entry_id, _ in node.xrange(part.stream("in"))}
        assert waited >= 1
        assert {entry_id for _, entry_id in acknowledged} <= on_promoted
    finally:
        await runs.close()
        await client.aclose()
