"""The layout lives in the server, end to end (docs/reference.md, Partitions, issue 31):
on a real cluster, ``printery-workers`` with a cluster URL and no partitions setting
starts and records 3 x the master count; the HTTP API, a second process and every
``printery`` command find the recorded count; a disagreeing setting exits 2 naming both
counts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from redis.cluster import RedisCluster

from support.cluster import ValkeyCluster
from support.operator_cli import cli_sync
from support.service import run_cli, spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def request(cid: str) -> dict[str, object]:
    return {"deployment_id": cid, "service": "billing-api", "version": "1.0.0",
            "environment": "development", "requested_by": "alice", "notify": ["log"]}


def test_a_cluster_url_with_no_partitions_setting(cluster: ValkeyCluster, prefix: str, tmp_path: Path) -> None:
    first = cluster.nodes[0]
    r = RedisCluster(host=first.server.host, port=first.port, decode_responses=True)
    service = spawn(["--redis-url", cluster.url, "--stream-prefix", prefix], cwd=tmp_path)
    second = None
    try:
        service.wait_until(lambda: r.hget(f"{prefix}:layout", "partitions") == "9",
                           what="the layout recorded")
        # The HTTP API submits in the recorded layout (restarted over it) and the run ends.
        service.wait_until(lambda: service.get("/readyz").status_code == 200, what="ready")
        submitted = httpx.post(service.http_base + "/v1/runs", json={"data": request("dep-lay-1")},
                               timeout=10)
        assert submitted.status_code in (200, 201, 202), submitted.text
        # A second process with no setting reads the record; so do the commands.
        second = spawn(["--redis-url", cluster.url, "--stream-prefix", prefix], cwd=tmp_path)
        done = cli_sync(cluster.url, prefix, "watch", "dep-lay-1", "--json", "--timeout", "30")
        assert done.returncode == 0, done.stderr
        emitted = cli_sync(cluster.url, prefix, "emit", "--data", json.dumps(request("dep-lay-2")),
                           "--wait", "--json", "--timeout", "30")
        assert emitted.returncode == 0 and json.loads(emitted.stdout)["status"] == "succeeded", emitted.stderr
        rows = json.loads(cli_sync(cluster.url, prefix, "streams", "--json").stdout)
        assert {row["partition"] for row in rows if row["type"] == "deployment:started"} == set(range(9))
        assert second.proc.poll() is None
        # A disagreeing setting: exit 2 naming both counts, for a command and a process.
        refused = cli_sync(cluster.url, prefix, "streams", env={"PRINTERY_PARTITIONS": "6"})
        assert refused.returncode == 2 and "records 9 partitions, this setting gives 6" in refused.stderr
        process = run_cli(["--redis-url", cluster.url, "--stream-prefix", prefix, "--partitions", "6",
                           "--http-addr", "off"], cwd=tmp_path, timeout=60)
        assert process.returncode == 2, process.stdout + process.stderr
        assert "records 9 partitions, this setting gives 6" in process.stdout + process.stderr
    finally:
        for handle in (second, service):
            if handle is not None:
                handle.stop()
        r.close()
