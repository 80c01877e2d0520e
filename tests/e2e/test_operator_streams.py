"""`printery` reading what others wrote: entries that external producers published with
only `data` (docs/reference.md, Streams and entries), dead letters shown in full, counts
as numbers, unknown ids, and stream data that tries to drive the operator's terminal."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from printery.servers.process import ServerProcess
from support.operator_cli import cli_sync as cli

STARTED = "deployment:started"
# An OSC sequence (sets the window title / a hyperlink), a CSI one, a C1 OSC, a bell.
HOSTILE = "\x1b]0;pwned\x07\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\\x1b[2J\x9d52;c;Zm9v\x9c\x07"


@pytest.fixture
def r(server: ServerProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def ok_json(proc: Any) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def request(cid: str, **extra: Any) -> str:
    return json.dumps({"deployment_id": cid, "service": "svc", "version": "1.0.0",
                       "environment": "staging", "requested_by": "alice", **extra})


def full_entry(cid: str, producer: str, data: str, **extra: str) -> dict[str, str]:
    return {"data": data, "type": "x", "event_id": "e", "deployment_id": cid,
            "idempotency_key": "k", "attempt": "1", "produced_at": "2026-01-01T00:00:00.000Z",
            "producer": producer, **extra}


def test_data_only_entries_are_traced_replayed_and_costed(server: ServerProcess, prefix: str,
                                                         r: redis.Redis) -> None:
    cid = "dep-ext-1"
    now = int(time.time() * 1000)
    # An external producer writes only `data`; the validator's output carries the field;
    # a repeated start of the same id, again only `data`.
    r.xadd(f"{prefix}:{STARTED}", {"data": request(cid)}, id=f"{now}-0")
    r.xadd(f"{prefix}:deployment:validated",
           full_entry(cid, "validator", request(cid), duration_ms="2.000"), id=f"{now + 10}-0")
    r.xadd(f"{prefix}:{STARTED}", {"data": request(cid)}, id=f"{now + 20}-0")
    r.xadd(f"{prefix}:{STARTED}", {"data": request("dep-ext-other")}, id=f"{now + 30}-0")

    rows = ok_json(cli(server.url, prefix, "trace", cid, "--json"))
    assert [(row["stream"], row["at_ms"]) for row in rows] == [
        (STARTED, 0), ("deployment:validated", 10), (STARTED, 20)]
    assert cli(server.url, prefix, "trace", cid).stdout.count(STARTED) == 2

    done = ok_json(cli(server.url, prefix, "replay", cid, "--json"))
    assert done["deployment_id"] == f"{cid}-r1" and done["replay_of"] == cid
    copies = [f for _, f in r.xrange(f"{prefix}:{STARTED}") if f.get("replay_of") == cid]
    assert [json.loads(f["data"])["deployment_id"] for f in copies] == [f"{cid}-r1"]
    # The data-only ids count as used: the next default id is -r2, not -r1 again.
    r.xadd(f"{prefix}:{STARTED}", {"data": request(f"{cid}-r2")})
    assert ok_json(cli(server.url, prefix, "replay", cid, "--json"))["deployment_id"] == f"{cid}-r3"

    summary = ok_json(cli(server.url, prefix, "cost", cid, "--json"))
    assert summary["steps"] == {"validator": {"calls": 1, "duration_ms": 2.0, "cost": {}}}


def test_cost_of_an_unknown_id_exits_1_and_a_known_one_without_figures_0(
        server: ServerProcess, prefix: str, r: redis.Redis) -> None:
    unknown = cli(server.url, prefix, "cost", "dep-nope", "--json")
    assert unknown.returncode == 1 and "dep-nope" in unknown.stderr and unknown.stdout == ""
    assert cli(server.url, prefix, "cost", "dep-nope").returncode == 1
    r.xadd(f"{prefix}:{STARTED}", {"data": request("dep-waiting")})
    waiting = ok_json(cli(server.url, prefix, "cost", "dep-waiting", "--json"))
    assert waiting["steps"] == {} and waiting["total"]["calls"] == 0
    assert ok_json(cli(server.url, prefix, "cost", "--json"))["total"]["calls"] == 0


def _dead_letter(prefix: str, cid: str, data: str, **extra: str) -> dict[str, str]:
    return {**full_entry(cid, "external", data, type=STARTED, attempt="2"),
            "error": "boom", "reason_code": "handler_error", "worker": "validator",
            "deliveries": "5", "failed_at": "2026-01-01T00:00:01Z",
            "source_stream": f"{prefix}:{STARTED}", "source_id": "1-1",
            "traceback": "Traceback (most recent call last):\n  File \"x.py\"\nValueError: boom",
            **extra}


def test_dlq_list_and_show_give_every_field_as_json_and_a_readable_view(
        server: ServerProcess, prefix: str, r: redis.Redis) -> None:
    data = request("dep-d1", notify=["log"])
    entry_id = r.xadd(f"{prefix}:dlq", _dead_letter(prefix, "dep-d1", data))
    # An undecodable data-only entry: no id field, data not JSON.
    bare_id = r.xadd(f"{prefix}:dlq", {"data": "{nope", "error": "bad", "reason_code": "undecodable",
                                       "worker": "validator", "deliveries": "1"})
    rows = ok_json(cli(server.url, prefix, "dlq", "list", "--json"))
    assert [row["id"] for row in rows] == [entry_id, bare_id]
    assert rows[0]["data"] == json.loads(data)
    assert rows[0]["deployment_id"] == "dep-d1" and rows[0]["producer"] == "external"
    assert rows[0]["deliveries"] == 5 and rows[0]["attempt"] == 2
    assert rows[0]["traceback"].endswith("ValueError: boom")
    assert rows[1]["data"] == "{nope" and rows[1]["deployment_id"] == ""

    shown = ok_json(cli(server.url, prefix, "dlq", "show", entry_id, "--json"))
    assert shown == rows[0]
    human = cli(server.url, prefix, "dlq", "show", entry_id)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert f"id: {entry_id}" in lines and "deliveries: 5" in lines
    start = lines.index("data:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    assert json.loads("\n".join(lines[start + 1:end])) == json.loads(data)
    assert "  ValueError: boom" in lines and "{'" not in human.stdout
    table = cli(server.url, prefix, "dlq", "list").stdout.splitlines()
    assert table[0].split() == ["id", "worker", "reason_code", "deployment_id", "deliveries",
                                "source_stream", "error"]


def test_tables_are_named_after_the_pipelines_correlation_field(
        server: ServerProcess, prefix: str, r: redis.Redis) -> None:
    """An app whose correlation field is `doc_id`: the columns say so, and a producer that
    put the id only in `data` is found there."""
    r.xadd(f"{prefix}:dlq", {"data": json.dumps({"doc_id": "doc-7", "text": "x"}),
                             "error": "boom", "reason_code": "handler_error", "worker": "extract",
                             "deliveries": "5", "source_stream": f"{prefix}:doc:submitted"})
    r.xadd(f"{prefix}:review", {"data": json.dumps({"doc_id": "doc-8"}), "kind": "approval",
                                "step": "gate", "reason": "why"})
    app = ("--app", "examples.docflow:pipeline")
    [row] = ok_json(cli(server.url, prefix, *app, "dlq", "list", "--json"))
    assert row["doc_id"] == "doc-7" and "deployment_id" not in row
    header = cli(server.url, prefix, *app, "dlq", "list").stdout.splitlines()[0].split()
    assert "doc_id" in header and "deployment_id" not in header
    [review] = ok_json(cli(server.url, prefix, *app, "review", "list", "--json"))
    assert review["doc_id"] == "doc-8" and "deployment_id" not in review
    header = cli(server.url, prefix, *app, "review", "list").stdout.splitlines()[0].split()
    assert header == ["id", "kind", "step", "doc_id", "reason"]


def test_stream_data_cannot_drive_the_operators_terminal(server: ServerProcess, prefix: str,
                                                         r: redis.Redis) -> None:
    cid = "dep-esc-1"
    data = json.dumps({"deployment_id": cid, "status": HOSTILE})
    entry_id = r.xadd(f"{prefix}:dlq", _dead_letter(prefix, cid, data, error=f"bad {HOSTILE} news",
                                                    traceback=f"line1\n{HOSTILE}\nline3"))
    r.xadd(f"{prefix}:deployment:finished",
           full_entry(cid, f"aggregator{HOSTILE}", data, kind=HOSTILE))
    outputs = {
        "dlq list": cli(server.url, prefix, "dlq", "list"),
        "dlq show": cli(server.url, prefix, "dlq", "show", entry_id),
        "trace": cli(server.url, prefix, "trace", cid),
        "dlq list --json": cli(server.url, prefix, "dlq", "list", "--json"),
        "dlq show --json": cli(server.url, prefix, "dlq", "show", entry_id, "--json"),
        "trace --json": cli(server.url, prefix, "trace", cid, "--json"),
    }
    for name, proc in outputs.items():
        assert proc.returncode == 0, (name, proc.stderr)
        controls = [c for c in proc.stdout if c not in "\n" and (ord(c) < 32 or 127 <= ord(c) < 160)]
        assert controls == [], name
    assert "bad" in outputs["dlq list"].stdout and "pwned" not in outputs["dlq list"].stdout
    assert "line3" in outputs["dlq show"].stdout
    # JSON keeps the data exactly: only its encoding is inert.
    [row] = json.loads(outputs["dlq list --json"].stdout)
    assert row["data"]["status"] == HOSTILE and row["error"] == f"bad {HOSTILE} news"
