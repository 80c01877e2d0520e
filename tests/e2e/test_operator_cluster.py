"""The operator's commands on a real cluster (docs/reference.md, Partitions, issue 18 item
2): ``printery-workers --partitions 3`` on ``redis+cluster://``; ``emit`` runs that
finish, ``streams`` shows every partition, ``trace``, ``cost`` and ``replay`` find a run
in its partition, ``dlq`` lists the dead letters of every partition (on every master) and
acts on one by its listed id, ``review list`` sees a review wherever it is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster

from printery.wire.keys import StreamKeys, partition_of
from support.cluster import ValkeyCluster
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

N = 3
STARTED = "deployment:started"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def ids_apart() -> list[str]:
    found: dict[int, str] = {}
    n = 0
    while len(found) < N:
        found.setdefault(partition_of(f"dep-cl-{n}", N), f"dep-cl-{n}")
        n += 1
    return [found[k] for k in range(N)]


def cli(cluster: ValkeyCluster, prefix: str, *args: str) -> Any:
    proc = cli_sync(cluster.url, prefix, *args, env={"PRINTERY_PARTITIONS": str(N)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def request(cid: str, environment: str = "development") -> str:
    return json.dumps({"deployment_id": cid, "service": "billing-api", "version": "1.0.0",
                       "environment": environment, "requested_by": "alice", "notify": ["log"]})


@pytest.fixture
def service(cluster: ValkeyCluster, prefix: str, tmp_path: Path) -> Iterator[ServiceHandle]:
    handle = spawn(["--redis-url", cluster.url, "--stream-prefix", prefix, "--partitions", str(N)],
                   cwd=tmp_path)
    yield handle
    handle.stop()


def test_operator_commands_see_every_partition_on_a_cluster(
    cluster: ValkeyCluster, prefix: str, service: ServiceHandle
) -> None:
    keys = StreamKeys(prefix, N)
    first = cluster.nodes[0]
    r = RedisCluster(host=first.server.host, port=first.port, decode_responses=True)
    runs = ids_apart()
    try:
        for cid in runs:
            done = cli(cluster, prefix, "emit", "--data", request(cid), "--wait", "--json",
                       "--timeout", "30")
            assert done["status"] == "succeeded", done
        rows = cli(cluster, prefix, "streams", "--json")
        started = [row for row in rows if row["type"] == STARTED]
        assert [(row["partition"], row["length"]) for row in started] == [(0, 1), (1, 1), (2, 1)]
        trace = cli(cluster, prefix, "trace", runs[1], "--json")
        assert trace[0]["stream"] == STARTED and trace[-1]["stream"] == "notification:sent"
        cost = cli(cluster, prefix, "cost", runs[1], "--json")
        assert set(cost["steps"]) >= {"validator", "aggregator", "notifier"}
        assert cli(cluster, prefix, "cost", "--json")["total"]["calls"] >= 3 * cost["total"]["calls"]
        replayed = cli(cluster, prefix, "replay", runs[2], "--json")
        part = partition_of(replayed["deployment_id"], N)
        assert [e["stream"] for e in replayed["entries"]] == [keys.at(part).stream(STARTED)]

        # Dead letters in every partition (on more than one master), listed and replayed.
        assert len({cluster.master_of(keys.at(k).dlq).port for k in range(N)}) > 1
        for k in range(N):
            r.xadd(keys.at(k).stream(STARTED), {"data": "{not json", "deployment_id": runs[k]})
        service.wait_until(lambda: sum(int(r.xlen(p.dlq)) for p in keys.each()) == N,
                           what="3 dead letters")
        letters = cli(cluster, prefix, "dlq", "list", "--json")
        assert sorted(row["id"].rsplit("@", 1)[1] for row in letters) == ["p0", "p1", "p2"]
        again = cli(cluster, prefix, "dlq", "replay", letters[1]["id"], "--json")
        assert again[0]["replayed"] is True

        cli(cluster, prefix, "emit", "--data", request("dep-cl-prod", "production"), "--json")
        part = partition_of("dep-cl-prod", N)
        service.wait_until(lambda: int(r.xlen(keys.at(part).review)) == 1, what="a review")
        (review,) = cli(cluster, prefix, "review", "list", "--json")
        assert review["id"].endswith(f"@p{part}")
    finally:
        r.close()
