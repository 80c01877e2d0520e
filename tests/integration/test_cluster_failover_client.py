"""The cluster client through a failover (issue 31): its view of the cluster is rebuilt
from the URL's nodes, and from the nodes it last knew, when every node it listed is gone
(redis-py issue 3693 left it empty for good: ``Please provide at least one reachable
node: None``); a read of the map that finds no node is a connection error, which every
caller already waits out; no command the cluster client refuses in a pipeline (``TIME``)
is sent in one."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError

from printery.store.overview import event_type_lags
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster


def _emptied(client: object) -> None:
    """What redis-py 6.4 leaves after every node failed a command once (each failure
    removes its node from the startup nodes) and the client closed its connections."""
    manager = client.nodes_manager  # type: ignore[attr-defined]
    manager.startup_nodes.clear()


async def test_the_view_is_rebuilt_from_the_url_when_every_known_node_is_gone(cluster: ValkeyCluster) -> None:
    client = connect(f"redis+cluster://{cluster.nodes[1].address}")
    try:
        keys = [f"rebuild:{{p{i}}}:n" for i in range(9)]
        for key in keys:
            await client.set(key, "1")
        _emptied(client)
        await client.aclose()  # what a connection error does: the next command reads the map
        assert [await client.get(key) for key in keys] == ["1"] * 9
        assert cluster.nodes[1].address in client.nodes_manager.startup_nodes  # type: ignore[attr-defined]
        # A transaction reads the map itself (redis-py's transaction strategy).
        _emptied(client)
        await client.nodes_manager.initialize()  # type: ignore[attr-defined]
        async with client.pipeline(transaction=True) as pipe:
            pipe.incr(keys[0])
            pipe.get(keys[0])
            assert await pipe.execute() == [2, "2"]
    finally:
        await client.aclose()


async def test_a_dead_url_node_is_replaced_by_the_nodes_last_known(own_cluster: ValkeyCluster) -> None:
    key = "known:{p0}:n"
    victim = own_cluster.master_of(key)
    client = connect(f"redis+cluster://{victim.address}")  # the URL names the master killed
    try:
        await client.set(key, "before")
        with victim.client() as conn:
            assert conn.execute_command("WAIT", 1, 5000) == 1
        promoted = await asyncio.to_thread(own_cluster.kill_master, victim)
        _emptied(client)
        await client.aclose()
        # The URL's only node is dead: the nodes of the last map read answer instead.
        assert await client.get(key) == "before"
        assert own_cluster.master_of(key) is promoted
        await client.set(key, "during")
        await asyncio.to_thread(own_cluster.rejoin, victim)
        _emptied(client)
        await client.aclose()
        assert await client.get(key) == "during"
    finally:
        await client.aclose()


async def test_no_node_at_all_is_a_connection_error(own_cluster: ValkeyCluster) -> None:
    client = connect(own_cluster.url)
    try:
        await client.set("gone:{p0}", "1")
        await asyncio.to_thread(own_cluster.stop)
        _emptied(client)
        await client.aclose()
        try:
            await client.get("gone:{p0}")
        except RedisConnectionError as exc:
            assert "cluster unavailable" in str(exc)
        else:
            raise AssertionError("a cluster with no node answered")
    finally:
        await client.aclose()


async def test_queue_lag_on_a_cluster_asks_time_outside_the_pipeline(cluster: ValkeyCluster) -> None:
    client = connect(cluster.url)
    keys = StreamKeys("lagcluster", 9)
    try:
        for part in keys.each():
            stream = part.stream("job")
            await client.xgroup_create(stream, "g", id="0", mkstream=True)
            await client.xadd(stream, {"n": "1"}, id="1-1")
        await client.xreadgroup("g", "c", {keys.at(0).stream("job"): ">"}, count=1)
        lags = await event_type_lags(client, keys, "job")
        # Entry 1-1 was written at the epoch's first millisecond: decades of lag, pending
        # in partition 0 and undelivered in the others.
        assert set(lags) == {"g"} and lags["g"] > 1e9
    finally:
        await client.aclose()


async def test_a_script_loaded_before_a_failover_runs_on_the_promoted_replica(own_cluster: ValkeyCluster) -> None:
    key = "script:{p0}:n"
    victim = own_cluster.master_of(key)
    client = connect(f"redis+cluster://{victim.address}")
    source = "return redis.call('INCR', KEYS[1])"
    try:
        sha = await client.script_load(source)  # every master has it, no replica does
        assert await client.evalsha(sha, 1, key) == 1
        with victim.client() as conn:
            assert conn.execute_command("WAIT", 1, 5000) == 1
        promoted = await asyncio.to_thread(own_cluster.kill_master, victim)
        with promoted.client() as conn:
            assert conn.execute_command("SCRIPT", "EXISTS", sha) == [0]  # not replicated
        # NOSCRIPT from the promoted replica: sent again as EVAL of the source, which the
        # node then caches.
        assert await client.evalsha(sha, 1, key) == 2
        with promoted.client() as conn:
            assert conn.execute_command("SCRIPT", "EXISTS", sha) == [1]
        # A SCRIPT LOAD reaches every node the map routes a slot to, also one it still
        # names a replica (as a map read during a failover may).
        other = "return 7"
        routed = client.nodes_manager.get_node_from_slot(client.keyslot(key))  # type: ignore[attr-defined]
        routed.server_type = "replica"
        other_sha = await client.script_load(other)
        with promoted.client() as conn:
            assert conn.execute_command("SCRIPT", "EXISTS", other_sha) == [1]
    finally:
        await client.aclose()
