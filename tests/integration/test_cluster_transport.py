"""printery's transport on a real cluster (docs/reference.md, Partitions):
``redis+cluster://`` gives the cluster client; the wire channel sends each transaction and
script to the master of its slot, follows a failover (MOVED after a manual one, a dead
node after a kill -9), and a SCAN sees the keys of every master."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from printery.service.registry import ProcessRegistry, list_processes
from printery.testing import wait_for_sync
from printery.transport.channel import DirectChannel
from printery.transport.connection import connect
from printery.transport.limit_store import WAIT_FOR_SLOT, Ask, Bound, LimitStore, Report
from printery.transport.scripts import Script
from printery.transport.streams import CONNECTION_ERRORS, one_slot
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster

_INCR_SOURCE = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
INCR_LUA = Script("incr", _INCR_SOURCE, hashlib.sha1(_INCR_SOURCE.encode()).hexdigest())


def _keys(n: int) -> list[str]:
    return [f"ct:{{p{i}}}:counter" for i in range(n)]


def _increments(keys: list[str]) -> list[list[tuple[object, ...]]]:
    return [[("MULTI",), ("INCR", key), ("SET", key.replace("counter", "seen"), "1"), ("EXEC",)]
            for key in keys]


async def test_cluster_url_gives_a_cluster_client_with_every_master_scanned(cluster: ValkeyCluster) -> None:
    client = connect(cluster.url)
    try:
        assert one_slot(client)
        keys = _keys(30)
        assert len({cluster.master_of(key).port for key in keys}) == 3
        for key in keys:
            await client.set(key, 0)
        found = {key async for key in client.scan_iter(match="ct:*", count=100)}
        assert set(keys) <= found
    finally:
        await client.aclose()


async def test_channel_routes_each_transaction_and_script_to_its_master(cluster: ValkeyCluster) -> None:
    client = connect(cluster.url)
    channel = DirectChannel(client)
    keys = [f"route:{{p{i}}}:counter" for i in range(12)]
    try:
        replies = await channel.transactions(_increments(keys))
        assert replies == [[1, "OK"]] * len(keys)
        scripted = await channel.scripts(INCR_LUA, [([key], [10]) for key in keys])
        assert scripted == [11] * len(keys)
        for key in keys:  # each landed on its own master, read there directly
            with cluster.master_of(key).client() as node:
                assert node.get(key) == "11"
        assert await channel.commands([("GET", key) for key in keys]) == ["11"] * len(keys)
    finally:
        await channel.close()
        await client.aclose()


async def test_channel_follows_a_manual_failover_without_an_error(own_cluster: ValkeyCluster) -> None:
    """After CLUSTER FAILOVER the old master is a replica answering MOVED: the channel
    reads the slot map again and sends there; nothing ran twice."""
    client = connect(own_cluster.url)
    channel = DirectChannel(client)
    keys = _keys(12)
    try:
        assert await channel.transactions(_increments(keys)) == [[1, "OK"]] * len(keys)
        old = own_cluster.master_of(keys[0])
        replica = own_cluster.replica_of(old)
        replica.call("CLUSTER", "FAILOVER")  # answers at once; the switch follows
        await asyncio.to_thread(
            wait_for_sync, lambda: own_cluster.master_of(keys[0]) is replica, timeout=30,
            message="the replica promoted by CLUSTER FAILOVER")
        await asyncio.to_thread(own_cluster.wait_healthy)
        assert await channel.transactions(_increments(keys)) == [[2, "OK"]] * len(keys)
        assert await channel.commands([("GET", key) for key in keys]) == ["2"] * len(keys)
    finally:
        await channel.close()
        await client.aclose()


async def test_channel_round_trip_on_a_killed_master_is_a_connection_error(
    own_cluster: ValkeyCluster,
) -> None:
    """A round trip on a master killed under the channel fails as a connection error
    (callers retry: it may or may not have run); the retry reaches the promoted replica."""
    client = connect(own_cluster.url)
    channel = DirectChannel(client)
    keys = _keys(12)
    try:
        assert await channel.transactions(_increments(keys)) == [[1, "OK"]] * len(keys)
        await asyncio.to_thread(own_cluster.kill_master, own_cluster.master_of(keys[0]))
        with pytest.raises(RedisConnectionError):
            await channel.transactions(_increments(keys))
        replies = await channel.transactions(_increments(keys))
        assert all(reply[0] in (2, 3) for reply in replies), replies
    finally:
        await channel.close()
        await client.aclose()


async def test_channel_after_a_master_is_killed(own_cluster: ValkeyCluster) -> None:
    """After a kill -9 of a master, the pooled client and the channel reach its promoted
    replica, and every write WAIT confirmed is there."""
    client = connect(own_cluster.url)
    channel = DirectChannel(client)
    keys = _keys(12)
    try:
        assert await channel.transactions(_increments(keys)) == [[1, "OK"]] * len(keys)
        victim = own_cluster.master_of(keys[0])
        with victim.client() as node:
            assert node.execute_command("WAIT", 1, 5000) == 1
        await asyncio.to_thread(own_cluster.kill_master, victim)
        # A cluster transaction of the pooled client meeting the dead node: its error
        # must not poison the client's slot map (redis-py 6.4 stored it as a MOVED and
        # every later command raised AttributeError; transport/cluster.py).
        with contextlib.suppress(*CONNECTION_ERRORS):
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(keys[0])
                await pipe.execute()
        assert int(await client.get(keys[0])) == 1
        # The channel routes by the (now refreshed) slot map: to the promoted replica.
        replies = await channel.transactions(_increments(keys))
        assert replies == [[2, "OK"]] * len(keys)
        # The pooled cluster client gets there too (its own retries absorb the dead node).
        values = [await client.get(key) for key in keys]
        assert [int(v) for v in values] == [reply[0] for reply in replies]
    finally:
        await channel.close()
        await client.aclose()


async def test_a_transaction_reading_a_hash_on_the_cluster_client(cluster: ValkeyCluster) -> None:
    """redis-py 6.4's cluster transaction passes ``keys=`` to HGETALL's reply callback
    (a TypeError after EXEC); the client connect() makes parses it."""
    client = connect(cluster.url)
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.hset("tx:{p1}:join", mapping={"a": "1"})
            pipe.hgetall("tx:{p1}:join")
            assert await pipe.execute() == [1, {"a": "1"}]
    finally:
        await client.aclose()


async def test_limits_of_several_keys_admit_in_one_script_on_the_cluster(cluster: ValkeyCluster) -> None:
    """Every limit shares the ``{limit}`` hash tag: one ask checking two limits (each of
    four keys) is one script on one master (without it: CROSSSLOT)."""
    keys = StreamKeys("ctlimits")
    client = connect(cluster.url)
    store = LimitStore(client, window_ms=60_000, lease_ms=60_000)
    model, tenant = Bound(keys.limit("model"), 1, 0, 0), Bound(keys.limit("tenant"), 2, 0, 0)
    try:
        # model allows one call at a time: one of the two admitted, the other waits
        assert await store.apply("a", [], [Ask(2, [model, tenant])]) == [(1, WAIT_FOR_SLOT)]
        assert await store.apply("b", [], [Ask(1, [model, tenant])]) == [(0, WAIT_FOR_SLOT)]
        assert await store.apply("a", [Report(model.base, 0, 0.0)], []) == []
        assert await store.apply("b", [], [Ask(1, [model, tenant])]) == [(1, 0)]
    finally:
        await store.close()
        await client.aclose()


async def test_stream_reads_are_routed_without_asking_the_server_for_their_keys(
    cluster: ValkeyCluster,
) -> None:
    """XREADGROUP is routed from its own arguments: no COMMAND GETKEYS round trip per
    read (redis-py's default for commands with movable keys)."""
    client = connect(cluster.url)
    stream = "reads:{p4}:s"

    def getkeys_calls() -> int:
        return sum(int(node.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0))
                   for node in cluster.masters())

    try:
        await client.xgroup_create(stream, "g", id="0", mkstream=True)
        await client.xadd(stream, {"a": "1"})
        before = await asyncio.to_thread(getkeys_calls)
        for _ in range(5):
            await client.xreadgroup("g", "c", {stream: ">"}, count=10, block=10)
        assert await asyncio.to_thread(getkeys_calls) == before
    finally:
        await client.aclose()


async def test_the_process_registry_lists_processes_of_every_master(cluster: ValkeyCluster) -> None:
    keys = StreamKeys("ctreg")
    client = connect(cluster.url)
    ids = [f"proc-{i}" for i in range(12)]
    try:
        assert len({cluster.master_of(keys.process(pid)).port for pid in ids}) == 3
        for pid in ids:  # the key and the process index: two slots, so no transaction
            await ProcessRegistry(client, keys, pid).beat({"pid": 1})
        listed = await list_processes(client, keys)
        assert sorted(p["process_id"] for p in listed) == sorted(ids)
    finally:
        await client.aclose()


async def test_the_run_index_forgets_old_runs_on_every_master(cluster: ValkeyCluster) -> None:
    """The retention sweep's forgetting (one script per partition, the run's info hash
    named in the script) runs on each partition's master."""
    from printery.runs.index import RunIndexReader
    from printery.runtime.run_index import RunIndex, RunMark, now_ms
    from printery.testing import unique_prefix

    keys = StreamKeys(unique_prefix("forget"), 6)
    index = RunIndex(keys)
    reads = RunIndexReader(index.keys)
    client = connect(cluster.url)
    channel = DirectChannel(client)
    runs = [f"run-{n}" for n in range(24)]
    long_ago = now_ms() - 3600_000
    try:
        writes = [[("MULTI",), *index.within(keys.of(run)).writes(
                       [RunMark(run, True, "succeeded")], long_ago), ("EXEC",)]
                  for run in runs]
        await channel.transactions(writes)
        assert len({cluster.master_of(keys.of(run).run_info(run)).port for run in runs}) == 3
        assert (await reads.summary(client))["runs"] == len(runs)
        assert await reads.forget_ended(client, retention_s=60) == len(runs)
        assert (await reads.summary(client))["runs"] == 0
    finally:
        await channel.close()
        await client.aclose()
