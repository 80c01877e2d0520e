"""The cluster fixture itself: six real Valkey processes form a cluster whose slots are
spread over three masters; a kill -9 of a master gets its replica promoted; a write that
``WAIT 1`` confirmed on the replica survives the kill (what "no loss" needs here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from support.cluster import ValkeyCluster


def _cluster_client(cluster: ValkeyCluster) -> RedisCluster:
    first = cluster.nodes[0]
    return RedisCluster(host=first.server.host, port=first.port, decode_responses=True)


def test_cluster_forms_with_three_masters_each_with_a_replica(cluster: ValkeyCluster) -> None:
    masters = cluster.masters()
    assert len(masters) == 3
    owned = sorted((int(start), int(end)) for start, end, *_ in cluster.nodes[0].call("CLUSTER", "SLOTS"))
    assert owned[0][0] == 0 and owned[-1][1] == 16383 and len(owned) == 3
    assert all(owned[i][1] + 1 == owned[i + 1][0] for i in range(2)), owned
    for master in masters:
        replica = cluster.replica_of(master)
        assert replica.info("replication")["master_link_status"] == "up"


def test_kill_master_promotes_its_replica_and_loses_no_waited_write(own_cluster: ValkeyCluster) -> None:
    rc = _cluster_client(own_cluster)
    try:
        keys = [f"fixture:{{k{i}}}" for i in range(300)]
        slots = {rc.keyslot(key) for key in keys}
        assert len({own_cluster.master_of(key).port for key in keys}) == 3, "keys span every master"
        for key in keys:
            rc.set(key, key)
        victim = own_cluster.master_of(keys[0])
        # Every key on the victim is confirmed on its replica before the kill.
        with victim.client() as conn:
            assert conn.execute_command("WAIT", 1, 5000) == 1
        on_victim = [key for key in keys if own_cluster.master_of(key) is victim]
        replica = own_cluster.replica_of(victim)

        promoted = own_cluster.kill_master(victim)

        assert promoted is replica and not victim.alive
        assert promoted.info("replication")["role"] == "master"
        assert own_cluster.master_of(keys[0]) is promoted
        assert len(own_cluster.masters()) == 3
        # The cluster client follows MOVED to the new master; nothing acknowledged is gone.
        # (Its first command to the dead node fails over to refreshing the slot map.)
        assert on_victim and [rc.get(key) for key in on_victim] == on_victim
        assert rc.mget_nonatomic(keys) == keys
        assert len(slots) > 3
    finally:
        rc.close()


def test_a_plain_client_on_the_wrong_node_is_told_moved(cluster: ValkeyCluster) -> None:
    key = "fixture:{moved}"
    owner = cluster.master_of(key)
    other = next(node for node in cluster.masters() if node is not owner)
    with other.client() as conn, pytest.raises(MovedError) as refused:
        conn.set(key, "x")
    assert str(refused.value).endswith(owner.address)


class _LostIntroduction(ValkeyCluster):
    """A cluster whose last node's introduction is lost, as a handshake that a loaded
    machine did not answer within the node timeout is dropped."""

    def _meet(self) -> None:
        first = self.nodes[0]
        for node in self.nodes[1:-1]:
            node.call("CLUSTER", "MEET", first.server.host, first.port, first.bus_port)


def test_a_lost_introduction_is_made_again(tmp_path: Path) -> None:
    """Before: one MEET, then a wait of 30 s for every node to know every other; a
    dropped handshake left a node out for good and the formation timed out."""
    with _LostIntroduction(tmp_path / "cluster") as formed:
        assert not formed.problems()
        assert len(formed.masters()) == 3
        known = str(formed.nodes[0].call("CLUSTER", "NODES"))
        assert formed.nodes[-1].id in known
