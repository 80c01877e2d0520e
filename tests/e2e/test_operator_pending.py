"""``printery pending`` (docs/reference.md, Failures) as a subprocess against the real
server, with no worker running: entries are made pending the way a worker that died would
leave them (``XREADGROUP`` of the pipeline's groups, never acknowledged)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from printery.servers.process import ServerProcess
from printery.wire.keys import StreamKeys, partition_of
from support.operator_cli import cli_sync

STARTED, VALIDATED = "deployment:started", "deployment:validated"
#: The deployment pipeline's groups on deployment:validated.
VALIDATED_GROUPS = ("dependency-checker", "health-monitor", "aggregator")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def r(server: ServerProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def fields(cid: str, *, in_data_only: bool = False) -> dict[str, str]:
    base = {"data": json.dumps({"deployment_id": cid, "service": "api"}),
            "type": "x", "event_id": f"e-{cid}", "idempotency_key": f"k-{cid}",
            "attempt": "1", "produced_at": "2026-01-01T00:00:00.000Z", "producer": "test"}
    if not in_data_only:
        base["deployment_id"] = cid
    return base


def deliver(r: redis.Redis, stream: str, group: str, consumer: str, count: int = 10) -> list[str]:
    """Read what ``group`` has not read yet as ``consumer``, never acknowledging it."""
    with contextlib.suppress(redis.ResponseError):  # the group exists
        r.xgroup_create(stream, group, id="0", mkstream=True)
    reply = r.xreadgroup(group, consumer, {stream: ">"}, count=count)
    return [entry_id for _, entries in reply for entry_id, _ in entries]


def pending(server: ServerProcess, prefix: str, *args: str,
            partitions: int = 1) -> Any:
    proc = cli_sync(server.url, prefix, "pending", *args,
                    env={"PRINTERY_PARTITIONS": str(partitions)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def test_lists_every_groups_unacknowledged_entries_with_their_runs(
    server: ServerProcess, prefix: str, r: redis.Redis
) -> None:
    started, validated = f"{prefix}:{STARTED}", f"{prefix}:{VALIDATED}"
    assert pending(server, prefix, "--json") == []
    assert pending(server, prefix).strip() == "no pending entries"

    first = r.xadd(started, fields("dep-1"))
    second = r.xadd(started, fields("dep-2", in_data_only=True))
    acked = r.xadd(started, fields("dep-3"))
    assert deliver(r, started, "validator", "validator-0") == [first, second, acked]
    r.xack(started, "validator", acked)
    shared = r.xadd(validated, fields("dep-1"))
    deliver(r, validated, "dependency-checker", "dependency-checker-2")
    deliver(r, validated, "aggregator", "aggregator-0")
    deliver(r, validated, "aggregator", "aggregator-1")  # nothing left: nothing pending
    # Delivered twice to health-monitor (a claim after a crash counts a delivery).
    deliver(r, validated, "health-monitor", "health-monitor-0")
    r.xclaim(validated, "health-monitor", "health-monitor-1", 0, [shared])
    # An entry trimmed away while pending: still listed, its run unknown.
    gone = r.xadd(started, fields("dep-4"))
    deliver(r, started, "validator", "validator-1")
    r.xdel(started, gone)

    rows = pending(server, prefix, "--json")
    # By entry id, then stream, then worker: two streams' entries of one millisecond
    # sort by their sequence numbers, whichever was written first.
    expected = [(first, started, "validator"), (second, started, "validator"),
                *((shared, validated, group) for group in ("aggregator", "dependency-checker",
                                                          "health-monitor")),
                (gone, started, "validator")]
    expected.sort(key=lambda row: (tuple(int(part) for part in row[0].split("-")), row[1], row[2]))
    assert [(row["id"], row["worker"]) for row in rows] == [(i, w) for i, _, w in expected]
    by = {(row["id"], row["worker"]): row for row in rows}
    assert by[(first, "validator")] == {
        "id": first, "stream": started, "type": STARTED, "worker": "validator",
        "consumer": "validator-0", "deliveries": 1,
        "idle_ms": by[(first, "validator")]["idle_ms"], "run_id": "dep-1"}
    assert isinstance(by[(first, "validator")]["idle_ms"], int)
    assert by[(second, "validator")]["run_id"] == "dep-2", "the run read from data"
    assert by[(gone, "validator")]["run_id"] == ""
    assert by[(shared, "health-monitor")]["deliveries"] == 2
    assert by[(shared, "health-monitor")]["consumer"] == "health-monitor-1"
    assert by[(shared, "dependency-checker")]["stream"] == validated

    # --worker takes names and the aliases printery-workers takes.
    for name in ("dependency", "dependency-checker", "DEPENDENCY"):
        only = pending(server, prefix, "--worker", name, "--json")
        assert [(row["id"], row["worker"]) for row in only] == [(shared, "dependency-checker")]
    assert pending(server, prefix, "--worker", "notifier", "--json") == []
    refused = cli_sync(server.url, prefix, "pending", "--worker", "nobody")
    assert refused.returncode == 2
    assert "nobody" in refused.stderr and "dependency-checker" in refused.stderr

    text = pending(server, prefix).splitlines()
    assert text[0].split() == ["id", "worker", "stream", "consumer", "deliveries", "idle",
                               "deployment_id"]
    assert text[2].split()[:5] == [first, "validator", STARTED, "validator-0", "1"]
    assert text[2].split()[-1] == "dep-1"
    assert len(text) == 2 + len(rows)


def test_lists_every_partition_by_the_ids_commands_take(
    server: ServerProcess, prefix: str, r: redis.Redis
) -> None:
    n = 3
    keys = StreamKeys(prefix, n)
    runs: dict[int, str] = {}
    i = 0
    while len(runs) < n:
        runs.setdefault(partition_of(f"dep-{i}", n), f"dep-{i}")
        i += 1
    made = {}
    for k, cid in runs.items():
        stream = keys.at(k).stream(STARTED)
        made[k] = r.xadd(stream, fields(cid))
        deliver(r, stream, "validator", "validator-0")
    rows = pending(server, prefix, "--json", partitions=n)
    assert sorted((row["id"], row["run_id"], row["partition"]) for row in rows) == sorted(
        (f"{made[k]}@p{k}", runs[k], k) for k in range(n))
    assert {row["stream"] for row in rows} == {keys.at(k).stream(STARTED) for k in range(n)}
    # Settled by the id listed: the dead letter and the run's outcome in its partition.
    done = dlq_cli(server, prefix, f"{made[1]}@p1", "--json", partitions=n)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dlq_id"].endswith("@p1")
    assert r.xlen(keys.at(1).dlq) == 1 and r.xlen(keys.at(1).stream("run:failed")) == 1
    assert sorted(row["partition"] for row in pending(server, prefix, "--json",
                                                      partitions=n)) == [0, 2]


def dlq_cli(server: ServerProcess, prefix: str, *args: str,
            partitions: int = 1) -> subprocess.CompletedProcess[str]:
    return cli_sync(server.url, prefix, "pending", "dlq", *args,
                    env={"PRINTERY_PARTITIONS": str(partitions)})


def test_dlq_dead_letters_one_entry_ends_its_run_and_acknowledges_it(
    server: ServerProcess, prefix: str, r: redis.Redis
) -> None:
    keys = StreamKeys(prefix)
    started = keys.stream(STARTED)
    stuck = r.xadd(started, {**fields("dep-1"), "traceparent": TRACEPARENT})
    other = r.xadd(started, fields("dep-2"))
    deliver(r, started, "validator", "validator-0")
    r.xclaim(started, "validator", "validator-1", 0, [stuck])  # a second delivery

    done = dlq_cli(server, prefix, stuck, "--reason", "poisons the validator", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    [(dlq_id, letter)] = r.xrange(keys.dlq)
    assert shown["dlq_id"] == dlq_id and shown["id"] == stuck and shown["run_id"] == "dep-1"
    assert {k: letter[k] for k in ("reason_code", "error", "worker", "deliveries",
                                   "source_stream", "source_id", "deployment_id")} == {
        "reason_code": "operator", "error": "poisons the validator", "worker": "validator",
        "deliveries": "2", "source_stream": started, "source_id": stuck,
        "deployment_id": "dep-1"}
    assert letter["data"] == fields("dep-1")["data"], "the original entry travels with it"
    # The run ended failed, in the same step: its outcome names the dlq entry.
    [(_, outcome)] = r.xrange(keys.stream("run:failed"))
    assert outcome["deployment_id"] == "dep-1"
    assert json.loads(outcome["data"]) == {
        "status": "failed", "step": "validator", "reason_code": "operator",
        "error": "poisons the validator", "dlq_id": dlq_id}
    assert outcome["traceparent"] == TRACEPARENT
    assert r.hget(keys.run_info("dep-1"), "status") == "failed"
    watched = cli_sync(server.url, prefix, "watch", "dep-1", "--timeout", "10")
    assert watched.returncode == 1, (watched.stdout, watched.stderr)
    assert "run:failed" in watched.stdout and "operator" in watched.stdout
    # Acknowledged: no longer pending; the other entry still is.
    assert [row["id"] for row in pending(server, prefix, "--json")] == [other]
    again = dlq_cli(server, prefix, stuck)
    assert again.returncode == 1 and f"no pending entry {stuck}" in again.stderr
    assert r.xlen(keys.dlq) == 1

    text = dlq_cli(server, prefix, other)
    assert text.returncode == 0, text.stderr
    assert text.stdout.split()[:2] == ["dead-lettered", other] and "dep-2" in text.stdout
    [_, (_, letter)] = r.xrange(keys.dlq)
    assert (letter["reason_code"], letter["error"]) == ("operator", "dead-lettered by an operator")
    assert pending(server, prefix, "--json") == []


def test_dlq_of_an_unknown_or_shared_entry(
    server: ServerProcess, prefix: str, r: redis.Redis
) -> None:
    keys = StreamKeys(prefix)
    validated = keys.stream(VALIDATED)
    shared = r.xadd(validated, fields("dep-7"))
    for group in VALIDATED_GROUPS:
        deliver(r, validated, group, f"{group}-0")
    for unknown in ("1-1", "not-an-id", f"{shared}@p3"):
        done = dlq_cli(server, prefix, unknown)
        assert done.returncode == 1, (unknown, done.stderr)
        assert "no pending entry" in done.stderr and done.stderr.count("\n") == 1
    several = dlq_cli(server, prefix, shared)
    assert several.returncode == 2
    assert "--worker" in several.stderr
    assert all(group in several.stderr for group in VALIDATED_GROUPS)
    assert r.xlen(keys.dlq) == 0
    done = dlq_cli(server, prefix, shared, "--worker", "health", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["worker"] == "health-monitor"
    [(_, letter)] = r.xrange(keys.dlq)
    assert letter["worker"] == "health-monitor"
    assert sorted(row["worker"] for row in pending(server, prefix, "--json")) == [
        "aggregator", "dependency-checker"]
    assert dlq_cli(server, prefix, shared, "--worker", "notifier").returncode == 1


def test_two_operators_dead_letter_one_entry_once(
    server: ServerProcess, prefix: str, r: redis.Redis
) -> None:
    keys = StreamKeys(prefix)
    started = keys.stream(STARTED)
    stuck = r.xadd(started, fields("dep-9"))
    deliver(r, started, "validator", "validator-0")
    with ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(lambda _: dlq_cli(server, prefix, stuck).returncode, range(4)))
    assert codes == [0, 1, 1, 1]
    assert r.xlen(keys.dlq) == 1 and r.xlen(keys.stream("run:failed")) == 1
