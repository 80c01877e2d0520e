"""The operator's commands against ``printery-workers --partitions 3`` (docs/reference.md,
Partitions), on one server: runs submitted by ``emit`` land in their partitions and
finish; ``streams`` shows each partition's stream; ``trace``, ``cost`` and ``replay`` find
a run in its partition; ``dlq`` and ``review`` list every partition and act on an entry by
the id they list (``<id>@p<k>``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from printery.servers.process import ServerProcess
from printery.wire.keys import StreamKeys, partition_of
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

N = 3
STARTED = "deployment:started"


def ids_apart() -> list[str]:
    """A deployment id in each partition, in partition order."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < N:
        found.setdefault(partition_of(f"dep-part-{n}", N), f"dep-part-{n}")
        n += 1
    return [found[k] for k in range(N)]


def cli(server: ServerProcess, prefix: str, *args: str) -> Any:
    proc = cli_sync(server.url, prefix, *args, env={"PRINTERY_PARTITIONS": str(N)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def request(cid: str, environment: str = "development") -> str:
    return json.dumps({"deployment_id": cid, "service": "billing-api", "version": "1.0.0",
                       "environment": environment, "requested_by": "alice", "notify": ["log"]})


@pytest.fixture
def service(server: ServerProcess, prefix: str, tmp_path: Path) -> Iterator[ServiceHandle]:
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--partitions", str(N)],
                   cwd=tmp_path)
    yield handle
    handle.stop()


def test_runs_streams_trace_cost_and_replay_across_partitions(
    server: ServerProcess, prefix: str, service: ServiceHandle
) -> None:
    keys, r = StreamKeys(prefix, N), redis.Redis.from_url(server.url, decode_responses=True)
    runs = ids_apart()
    for cid in runs:
        done = cli(server, prefix, "emit", "--data", request(cid), "--wait", "--json",
                   "--timeout", "30")
        assert done["status"] == "succeeded", done
    for k in range(N):
        assert r.xlen(keys.at(k).stream("deployment:finished")) == 1
        assert r.xlen(keys.at(k).stream(STARTED)) == 1
    assert r.exists(f"{prefix}:{STARTED}") == 0, "no unpartitioned stream is written"

    rows = cli(server, prefix, "streams", "--json")
    started = [row for row in rows if row["type"] == STARTED]
    assert [(row["partition"], row["length"]) for row in started] == [(0, 1), (1, 1), (2, 1)]
    assert all(g["pending"] == 0 for row in started for g in row["groups"])
    assert f"{STARTED}@p2" in cli(server, prefix, "streams")

    trace = cli(server, prefix, "trace", runs[1], "--json")
    assert trace[0]["stream"] == STARTED
    assert trace[-1]["stream"] == "notification:sent"
    cost = cli(server, prefix, "cost", runs[1], "--json")
    assert set(cost["steps"]) >= {"validator", "aggregator", "notifier"}
    assert cli(server, prefix, "cost", "--json")["total"]["calls"] >= 3 * cost["total"]["calls"]

    replayed = cli(server, prefix, "replay", runs[2], "--json")
    new = replayed["deployment_id"]
    part = partition_of(new, N)
    assert [e["stream"] for e in replayed["entries"]] == [keys.at(part).stream(STARTED)]
    follow = cli_sync(server.url, prefix, "watch", new, "--json", "--timeout", "30",
                      env={"PRINTERY_PARTITIONS": str(N)})
    assert follow.returncode == 0, follow.stderr


def test_dlq_and_review_list_every_partition_and_act_by_listed_id(
    server: ServerProcess, prefix: str, service: ServiceHandle
) -> None:
    keys, r = StreamKeys(prefix, N), redis.Redis.from_url(server.url, decode_responses=True)
    runs = ids_apart()
    # Undecodable entries dead-letter in the partition they were read from.
    for k in range(N):
        r.xadd(keys.at(k).stream(STARTED), {"data": "{not json", "deployment_id": runs[k]})
    service.wait_until(lambda: sum(r.xlen(p.dlq) for p in keys.each()) == N, what="3 dead letters")
    letters = cli(server, prefix, "dlq", "list", "--json")
    assert sorted(row["id"].rsplit("@", 1)[1] for row in letters) == ["p0", "p1", "p2"]
    shown = cli(server, prefix, "dlq", "show", letters[0]["id"], "--json")
    assert shown["id"] == letters[0]["id"] and shown["reason_code"]
    replayed = cli(server, prefix, "dlq", "replay", letters[1]["id"], "--json")
    assert replayed[0]["replayed"] is True
    p = int(letters[1]["id"].rsplit("@p", 1)[1])
    assert replayed[0]["source_stream"] == keys.at(p).stream(STARTED)
    purged = cli(server, prefix, "dlq", "purge", "--all", "--yes", "--json")
    assert {row["id"] for row in purged} >= {letters[0]["id"], letters[2]["id"]}

    # A production request waits for approval: its review is in its run's partition.
    cid = runs[2]
    cli(server, prefix, "emit", "--data", request(cid + "-prod", "production"), "--json")
    part = partition_of(cid + "-prod", N)
    service.wait_until(lambda: r.xlen(keys.at(part).review) == 1, what="a review")
    (review,) = cli(server, prefix, "review", "list", "--json")
    assert review["id"].endswith(f"@p{part}") and review["deployment_id"] == cid + "-prod"
    decided = cli(server, prefix, "review", "approve", review["id"], "--by", "bob", "--json")
    assert decided["decision"] == "approved"
    service.wait_until(lambda: r.xlen(keys.at(part).stream("deployment:finished")) == 1,
                       what="the approved run finished")
    assert cli(server, prefix, "review", "list", "--json") == []
