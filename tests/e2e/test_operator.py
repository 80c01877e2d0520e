"""`printery` as a subprocess against the real server: emit, streams, status, dlq, trace,
cost, replay, pipeline show, secrets and the no-server message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from printery.servers.process import ServerProcess

STARTED = "deployment:started"


def cli(url: str | None, prefix: str, *args: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = [sys.executable, "-m", "printery.cli.operator"]
    if url is not None:
        base += ["--redis-url", url]
    full_env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    full_env.update(env or {})
    return subprocess.run([*base, "--stream-prefix", prefix, *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=full_env)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def r(server: ServerProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def entry(prefix: str, cid: str, **fields: str) -> dict[str, str]:
    base = {"data": json.dumps({"deployment_id": cid}), "type": "x", "event_id": "e",
            "deployment_id": cid, "idempotency_key": "k", "attempt": "1",
            "produced_at": "2026-01-01T00:00:00.000Z", "producer": "external"}
    base.update(fields)
    return base


def test_no_url_and_no_server_says_how_to_start_one(tmp_path: Path, prefix: str) -> None:
    proc = cli(None, prefix, "--data-dir", str(tmp_path / "nothing"), "streams",
               env={"PRINTERY_DATA_DIR": ""})
    assert proc.returncode == 1
    assert "printery-workers" in proc.stderr and "--redis-url" in proc.stderr


def test_bad_setting_exits_2(server: ServerProcess) -> None:
    proc = cli(server.url, "bad prefix", "streams")
    assert proc.returncode == 2 and "stream_prefix" in proc.stderr


def test_emit_from_each_source(server: ServerProcess, prefix: str, r: redis.Redis,
                               tmp_path: Path) -> None:
    request = {"service": "billing-api", "version": "1.4.2", "environment": "staging",
               "requested_by": "alice"}
    assert cli(server.url, prefix, "emit").returncode == 2

    ids = [cli(server.url, prefix, "emit", "--data", json.dumps(request)).stdout.strip()]
    path = tmp_path / "req.json"
    path.write_text(json.dumps({**request, "deployment_id": "dep-file-1"}))
    ids.append(cli(server.url, prefix, "emit", "--file", str(path)).stdout.strip())
    ids.append(as_json(cli(server.url, prefix, "emit", "--file", "-", "--json",
                           stdin=json.dumps(request)))["deployment_id"])
    ids.append(cli(server.url, prefix, "emit", "--service", "svc", "--version", "1.0.0",
                   "--environment", "staging", "--requested-by", "carol",
                   "--dependency", "ledger=http://127.0.0.1:1/h@>=2.0,<3",
                   "--dependency", "auth=http://u@127.0.0.1:2/h",
                   "--notify", "log").stdout.strip())
    ids.append(cli(server.url, prefix, "emit", "--example").stdout.strip())
    assert ids[1] == "dep-file-1"
    assert all(i.startswith("dep-") for i in ids) and len(set(ids)) == 5

    entries = r.xrange(f"{prefix}:{STARTED}")
    assert [f["deployment_id"] for _, f in entries] == ids
    for _, fields in entries:
        data = json.loads(fields["data"])
        assert data["deployment_id"] == fields["deployment_id"]
        assert fields["producer"] == "printery-cli" and fields["type"] == STARTED
        assert fields["attempt"] == "1" and fields["event_id"] and fields["produced_at"]
        assert fields["idempotency_key"] == f"{STARTED}:{fields['deployment_id']}"
    flags = json.loads(entries[3][1]["data"])
    assert flags["dependencies"] == [
        {"service": "ledger", "health_url": "http://127.0.0.1:1/h", "version": ">=2.0,<3"},
        {"service": "auth", "health_url": "http://u@127.0.0.1:2/h"},
    ]
    assert flags["notify"] == ["log"] and flags["requested_by"] == "carol"
    assert cli(server.url, prefix, "emit", "--data", "{nope").returncode == 2


def test_emit_wait_times_out_with_3(server: ServerProcess, prefix: str) -> None:
    begun = time.monotonic()
    proc = cli(server.url, prefix, "emit", "--example", "--wait", "--timeout", "1")
    assert proc.returncode == 3, proc.stderr
    assert "timed out" in proc.stderr and time.monotonic() - begun < 15


def test_streams_show_length_groups_pending_undelivered_lag(server: ServerProcess, prefix: str,
                                                            r: redis.Redis) -> None:
    """Each figure under the name of what it holds: ``undelivered`` the count no consumer
    was given yet, ``lag_s`` the seconds the oldest owed entry has waited."""
    key = f"{prefix}:{STARTED}"
    for n in range(3):
        r.xadd(key, entry(prefix, f"dep-{n}"))
    r.xgroup_create(key, "validator", id="0")
    r.xreadgroup("validator", "c1", {key: ">"}, count=1)
    rows = as_json(cli(server.url, prefix, "streams", "--json"))
    by_type = {row["type"]: row for row in rows}
    assert {"dlq", "review", "review:decided", "deployment:finished"} <= set(by_type)
    started = by_type[STARTED]
    assert started["length"] == 3 and started["stream"] == key
    [group] = started["groups"]
    assert (group["name"], group["pending"], group["undelivered"]) == ("validator", 1, 2)
    assert "lag" not in group and 0.0 <= group["lag_s"] < 60.0
    assert by_type["dlq"]["length"] == 0
    human = cli(server.url, prefix, "streams")
    assert human.returncode == 0 and "validator" in human.stdout
    header = human.stdout.splitlines()[0].split()
    assert header == ["stream", "length", "group", "consumers", "pending", "undelivered", "lag_s"]


async def test_status_lists_registered_processes(server: ServerProcess, prefix: str) -> None:
    import redis.asyncio as aioredis

    from printery.service.registry import ProcessRegistry
    from printery.wire.keys import StreamKeys

    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    registry = ProcessRegistry(client, StreamKeys(prefix), "hostA:4242", ttl=30, interval=10)
    # The shape printery-workers writes: process fields at the top, then its workers.
    await registry.beat({"host": "hostA", "pid": 4242, "started_at": "t0",
                         "process_id": "hostA:4242",
                         "workers": {"validator": {"state": "running", "processed": 7}}})
    await client.aclose()
    rows = as_json(cli(server.url, prefix, "status", "--json"))
    assert [row["process_id"] for row in rows] == ["hostA:4242"]
    assert rows[0]["workers"]["validator"]["state"] == "running"
    human = cli(server.url, prefix, "status").stdout
    assert "hostA:4242" in human and "running" in human


def test_pipeline_show_text_and_mermaid(prefix: str) -> None:
    text = cli(None, prefix, "pipeline", "show")
    assert text.returncode == 0
    assert "health-monitor" in text.stdout and "deployment:started" in text.stdout
    mermaid = cli(None, prefix, "pipeline", "show", "--mermaid").stdout
    assert mermaid.startswith("flowchart LR") and "-->|deployment:validated|" in mermaid
    doc = as_json(cli(None, prefix, "pipeline", "show", "--json"))
    assert [s["name"] for s in doc["steps"]] == [
        "validator", "dependency-checker", "health-monitor", "aggregator", "notifier"]


def _dlq_entry(prefix: str, cid: str, n: int) -> dict[str, str]:
    return entry(prefix, cid, attempt="2", type=STARTED, error="boom", reason_code="handler_error",
                 worker="validator", deliveries="5", failed_at="2026-01-01T00:00:01Z",
                 source_stream=f"{prefix}:{STARTED}", source_id=f"1-{n}")


def test_dlq_list_show_replay_purge(server: ServerProcess, prefix: str, r: redis.Redis) -> None:
    dlq, source = f"{prefix}:dlq", f"{prefix}:{STARTED}"
    ids = [r.xadd(dlq, _dlq_entry(prefix, f"dep-{n}", n)) for n in range(4)]
    rows = as_json(cli(server.url, prefix, "dlq", "list", "--json"))
    assert [row["id"] for row in rows] == ids
    assert rows[0]["reason_code"] == "handler_error" and rows[0]["deployment_id"] == "dep-0"
    shown = as_json(cli(server.url, prefix, "dlq", "show", ids[1], "--json"))
    assert shown["error"] == "boom" and shown["data"] == {"deployment_id": "dep-1"}
    assert cli(server.url, prefix, "dlq", "show", "1-999").returncode == 1

    done = as_json(cli(server.url, prefix, "dlq", "replay", ids[0], "--json"))
    assert done[0]["replayed"] is True
    [(_, fields)] = r.xrange(source)
    assert fields["attempt"] == "3" and fields["replayed_from"] == ids[0]
    assert fields["deployment_id"] == "dep-0"
    assert fields["data"] == json.dumps({"deployment_id": "dep-0"})
    assert not {"error", "reason_code", "worker", "deliveries", "failed_at", "source_stream",
                "source_id"} & set(fields)
    assert [i for i, _ in r.xrange(dlq)] == ids[1:]
    # Replaying it again: gone, exit 1, nothing written twice.
    assert cli(server.url, prefix, "dlq", "replay", ids[0]).returncode == 1
    assert r.xlen(source) == 1

    assert cli(server.url, prefix, "dlq", "purge", ids[1]).returncode == 0
    assert cli(server.url, prefix, "dlq", "purge", "--all").returncode == 2
    assert cli(server.url, prefix, "dlq", "purge", "1-12345").returncode == 1
    assert cli(server.url, prefix, "dlq", "replay", "--all").returncode == 0
    assert r.xlen(dlq) == 0 and r.xlen(source) == 3
    r.xadd(dlq, _dlq_entry(prefix, "dep-9", 9))
    assert cli(server.url, prefix, "dlq", "purge", "--all", "--yes").returncode == 0
    assert r.xlen(dlq) == 0


def test_dlq_replay_is_one_transaction_under_concurrency(server: ServerProcess, prefix: str,
                                                         r: redis.Redis) -> None:
    """Several operators replaying the same entries at once: each is re-added exactly once."""
    dlq, source = f"{prefix}:dlq", f"{prefix}:{STARTED}"
    for n in range(20):
        r.xadd(dlq, _dlq_entry(prefix, f"dep-{n}", n))
    base = [sys.executable, "-m", "printery.cli.operator", "--redis-url", server.url,
            "--stream-prefix", prefix, "dlq", "replay", "--all", "--json"]
    procs = [subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    replayed = [row["id"] for out in outputs if out for row in json.loads(out) if row["replayed"]]
    assert len(replayed) == len(set(replayed))
    assert r.xlen(dlq) == 0
    assert sorted(f["deployment_id"] for _, f in r.xrange(source)) == sorted(
        f"dep-{n}" for n in range(20))


def test_trace_orders_entries_and_shows_durations(server: ServerProcess, prefix: str,
                                                  r: redis.Redis) -> None:
    cid = "dep-trace-1"
    now = int(time.time() * 1000)
    writes = [  # (stream, ms offset, extra fields), written out of time order
        ("deployment:finished", 300, {"producer": "aggregator", "duration_ms": "1.500",
                                      "data": json.dumps({"status": "succeeded"})}),
        (STARTED, 0, {}),
        ("deployment:validated", 100, {"producer": "validator", "duration_ms": "2.250"}),
        ("health:checked", 250, {"producer": "health-monitor", "duration_ms": "120.000",
                                 "cost": json.dumps({"probes": 3, "usd": 0.00007 + 0.00007}),
                                 "replay_of": "dep-0"}),
        ("review", 260, {"producer": "aggregator", "kind": "branch_timeout"}),
        ("dlq", 280, {"producer": "external", "reason_code": "undecodable",
                      "worker": "validator"}),
    ]
    for stream, offset, extra in writes:
        r.xadd(f"{prefix}:{stream}", entry(prefix, cid, **extra), id=f"{now + offset}-0")
    r.xadd(f"{prefix}:{STARTED}", entry(prefix, "dep-other"))
    rows = as_json(cli(server.url, prefix, "trace", cid, "--json"))
    assert [row["stream"] for row in rows] == [
        STARTED, "deployment:validated", "health:checked", "review", "dlq", "deployment:finished"]
    assert [row["at_ms"] for row in rows] == [0, 100, 250, 260, 280, 300]
    assert [row["since_previous_ms"] for row in rows] == [0, 100, 150, 10, 20, 20]
    assert rows[1]["duration_ms"] == 2.25 and rows[2]["cost"] == {"probes": 3,
                                                                   "usd": 0.00007 + 0.00007}
    assert rows[2]["replay_of"] == "dep-0"
    human = cli(server.url, prefix, "trace", cid)
    assert human.returncode == 0 and "probes=3" in human.stdout and "succeeded" in human.stdout
    # A cost to six digits (not usd=0.00014000000000000001); a dead letter said as one,
    # by the worker that wrote it (not the failed entry's producer).
    assert "probes=3,usd=0.00014 " in human.stdout, human.stdout
    (dead,) = [line for line in human.stdout.splitlines() if " dlq " in line]
    assert "dead-lettered by validator: undecodable" in dead and "external" not in dead
    assert cli(server.url, prefix, "trace", "dep-nope").returncode == 1


def test_cost_sums_exactly_per_step_and_unit(server: ServerProcess, prefix: str,
                                             r: redis.Redis) -> None:
    def put(stream: str, cid: str, producer: str, duration: str, cost: dict[str, Any] | None,
            **extra: str) -> None:
        fields = entry(prefix, cid, producer=producer, duration_ms=duration, **extra)
        if cost is not None:
            fields["cost"] = json.dumps(cost)
        r.xadd(f"{prefix}:{stream}", fields)

    put("dependencies:checked", "dep-a", "dependency-checker", "10.250", {"probes": 2})
    put("health:checked", "dep-a", "health-monitor", "100.500", {"probes": 5})
    put("health:checked", "dep-b", "health-monitor", "50.250", {"probes": 1})
    # One notifier call writing three outputs (the later ones name the first): counted
    # once; a second call with the same figures counts again.
    for channel in ("a", "b", "c"):
        put("notification:sent", "dep-a", "notifier", "7.125",
            {"webhook_posts": 4, "bytes_posted": 1000}, channel=channel,
            **({"call_of": "first"} if channel != "a" else {}), event_id=f"n-{channel}")
    put("notification:sent", "dep-a", "notifier", "7.125",
        {"webhook_posts": 4, "bytes_posted": 1000}, channel="a", event_id="n-again")
    put(STARTED, "dep-a", "printery-cli", "1.000", {"probes": 99})  # not a step: ignored

    summary = as_json(cli(server.url, prefix, "cost", "--json"))
    assert summary["steps"] == {
        "dependency-checker": {"calls": 1, "duration_ms": 10.25, "cost": {"probes": 2}},
        "health-monitor": {"calls": 2, "duration_ms": 150.75, "cost": {"probes": 6}},
        "notifier": {"calls": 2, "duration_ms": 14.25,
                     "cost": {"webhook_posts": 8, "bytes_posted": 2000}},
    }
    assert summary["total"] == {"calls": 5, "duration_ms": 175.25,
                                "cost": {"probes": 8, "webhook_posts": 8, "bytes_posted": 2000}}
    one = as_json(cli(server.url, prefix, "cost", "dep-b", "--json"))
    assert one["steps"] == {"health-monitor": {"calls": 1, "duration_ms": 50.25,
                                               "cost": {"probes": 1}}}
    recent = as_json(cli(server.url, prefix, "cost", "--since", "10m", "--json"))
    assert recent["total"]["calls"] == 5
    assert cli(server.url, prefix, "cost", "--since", "soon").returncode == 2
    assert "health-monitor" in cli(server.url, prefix, "cost").stdout


def test_replay_from_ingress_and_errors(server: ServerProcess, prefix: str,
                                        r: redis.Redis) -> None:
    cid = "dep-rp-1"
    request = {"deployment_id": cid, "service": "svc", "version": "1.0.0",
               "environment": "staging", "requested_by": "alice"}
    r.xadd(f"{prefix}:{STARTED}", entry(prefix, cid, data=json.dumps(request)))
    r.xadd(f"{prefix}:deployment:validated",
           entry(prefix, cid, producer="validator", data=json.dumps(request)))

    first = as_json(cli(server.url, prefix, "replay", cid, "--json"))
    assert first["deployment_id"] == f"{cid}-r1" and first["replay_of"] == cid
    assert cli(server.url, prefix, "replay", cid).stdout.strip() == f"{cid}-r2"
    entries = r.xrange(f"{prefix}:{STARTED}")
    assert [f["deployment_id"] for _, f in entries] == [cid, f"{cid}-r1", f"{cid}-r2"]
    fields = entries[1][1]
    assert fields["replay_of"] == cid and fields["producer"] == "printery-cli"
    assert json.loads(fields["data"]) == {**request, "deployment_id": f"{cid}-r1"}
    assert fields["idempotency_key"] == f"{STARTED}:{cid}-r1" and fields["attempt"] == "1"

    hm = as_json(cli(server.url, prefix, "replay", cid, "--from", "health-monitor",
                     "--as", "dep-custom", "--json"))
    assert hm["deployment_id"] == "dep-custom"
    [(_, validated)] = [e for e in r.xrange(f"{prefix}:deployment:validated")
                        if e[1]["deployment_id"] == "dep-custom"]
    assert validated["replay_of"] == cid and validated["type"] == "deployment:validated"

    unknown = cli(server.url, prefix, "replay", "dep-nope")
    assert unknown.returncode == 1 and "dep-nope" in unknown.stderr
    step = cli(server.url, prefix, "replay", cid, "--from", "nosuchstep")
    assert step.returncode == 1 and "unknown step" in step.stderr
    taken = cli(server.url, prefix, "replay", cid, "--as", "dep-custom")
    assert taken.returncode == 1 and "already used" in taken.stderr
    # A new id no run may have is a usage error, and nothing is written (it used to run,
    # and end rejected, or say an empty id was "already used").
    before = r.xlen(f"{prefix}:{STARTED}")
    for bad in ("bad id \u2603", "", "y" * 300):
        refused = cli(server.url, prefix, "replay", cid, "--as", bad)
        assert refused.returncode == 2 and "--as" in refused.stderr, refused.stderr
        assert "already used" not in refused.stderr
    refused = cli(server.url, prefix, "replay", cid, "--from", "health-monitor", "--as", "a\tb")
    assert refused.returncode == 2 and "control character" in refused.stderr
    assert r.xlen(f"{prefix}:{STARTED}") == before


def test_no_secret_in_json_output(server: ServerProcess, prefix: str, r: redis.Redis) -> None:
    r.execute_command("ACL", "SETUSER", "opuser", "on", ">s3cretpw", "~*", "&*", "+@all")
    host_port = server.url.split("://", 1)[1]
    url = f"redis://opuser:s3cretpw@{host_port}"
    r.xadd(f"{prefix}:dlq", _dlq_entry(prefix, "dep-s", 1))
    outputs = [cli(url, prefix, *args, "--json")
               for args in (("streams",), ("dlq", "list"), ("status",), ("cost",))]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr
        assert "s3cretpw" not in proc.stdout + proc.stderr
    bad = cli(f"redis://opuser:wrongpw@{host_port}", prefix, "streams", "--json")
    assert bad.returncode == 1 and "wrongpw" not in bad.stdout + bad.stderr
