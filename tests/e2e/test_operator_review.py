"""`printery review` as a subprocess: the decisions of docs/reference.md, Escalation
kinds, each written to `review:decided` together with its output and the deletion of the
review entry."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from printery.deploy.app import delivery_key
from printery.deploy.sandbox import Sandbox
from printery.servers.process import ServerProcess
from support.operator_cli import cli

REQUEST = {"deployment_id": "dep-prod-1", "service": "billing-api", "version": "1.4.2",
           "environment": "production", "requested_by": "alice", "approved_by": None,
           "health_url": None, "dependencies": [], "notify": ["log"]}


async def add_review(client: aioredis.Redis, prefix: str, kind: str, data: dict[str, Any],
                     cid: str = "dep-prod-1") -> str:
    return str(await client.xadd(f"{prefix}:review", {
        "data": json.dumps(data), "type": "review", "event_id": "evt-1", "deployment_id": cid,
        "idempotency_key": f"review:{kind}:{cid}", "attempt": "1",
        "produced_at": "2026-01-01T00:00:00.000Z", "producer": "validator", "kind": kind,
        "step": "validator", "reason": "why", "source_stream": f"{prefix}:deployment:started",
        "source_id": "1-0"}))


async def test_approval_approve_and_reject(server: ServerProcess, prefix: str,
                                           client: aioredis.Redis) -> None:
    review_id = await add_review(client, prefix, "approval", REQUEST)
    code, out, _ = await cli(server.url, prefix, "review", "list", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [review_id]

    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "alice")
    assert code == 1 and "alice" in err
    assert await client.xlen(f"{prefix}:review") == 1, "a refused approval changes nothing"
    assert await client.xlen(f"{prefix}:deployment:validated") == 0

    code, out, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "bob",
                               "--note", "looks fine", "--json")
    assert code == 0, err
    assert json.loads(out)["decision"] == "approved"
    [(_, validated)] = await client.xrange(f"{prefix}:deployment:validated")
    assert json.loads(validated["data"]) == {**REQUEST, "approved_by": "bob"}
    assert validated["producer"] == "printery-cli" and validated["deployment_id"] == "dep-prod-1"
    assert validated["idempotency_key"] == "deployment:validated:dep-prod-1"
    assert await client.xlen(f"{prefix}:review") == 0
    [(_, decided)] = await client.xrange(f"{prefix}:review:decided")
    assert {k: decided[k] for k in ("review_id", "deployment_id", "decision", "by", "note")} == {
        "review_id": review_id, "deployment_id": "dep-prod-1", "decision": "approved",
        "by": "bob", "note": "looks fine"}
    assert decided["decided_at"]

    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "bob")
    assert code == 1 and "already decided" in err
    code, _, _ = await cli(server.url, prefix, "review", "reject", "1-1", "--by", "bob")
    assert code == 1

    other = await add_review(client, prefix, "approval", {**REQUEST, "deployment_id": "dep-2"},
                             cid="dep-2")
    code, _, err = await cli(server.url, prefix, "review", "reject", other, "--by", "carol",
                             "--note", "not on a Friday")
    assert code == 0, err
    [(_, rejected)] = await client.xrange(f"{prefix}:deployment:rejected")
    assert json.loads(rejected["data"]) == {
        "deployment_id": "dep-2",
        "reasons": [{"code": "rejected_by_reviewer", "field": "", "message": "not on a Friday"}],
        "request": {**REQUEST, "deployment_id": "dep-2"}}
    decisions = [f["decision"] for _, f in await client.xrange(f"{prefix}:review:decided")]
    assert decisions == ["approved", "rejected"]


async def test_delivery_failed_retry_and_close(server: ServerProcess, prefix: str,
                                               client: aioredis.Redis) -> None:
    sandbox = Sandbox()
    await sandbox.start()
    try:
        finished = {"deployment_id": "dep-d", "status": "succeeded", "reasons": [], "steps": {}}
        good = f"webhook+{sandbox.url('/hooks/ok')}"
        bad = f"webhook+{sandbox.url('/hooks/fail')}"
        failing = await add_review(client, prefix, "delivery_failed",
                                   {**finished, "channel": bad}, cid="dep-d")
        code, _, err = await cli(server.url, prefix, "review", "approve", failing, "--by", "ops")
        assert code == 1 and "retry failed" in err
        assert await client.xlen(f"{prefix}:review") == 1, "a failed retry leaves it open"

        retry = await add_review(client, prefix, "delivery_failed",
                                 {**finished, "channel": good}, cid="dep-d")
        code, out, err = await cli(server.url, prefix, "review", "approve", retry, "--by", "ops",
                                   "--json")
        assert code == 0, err
        assert json.loads(out)["delivered"] is True
        posts = [p for p in sandbox.received if p.path == "/hooks/ok"]
        assert len(posts) == 1 and posts[0].json == finished
        headers = {k.lower(): v for k, v in posts[0].headers.items()}
        assert headers["x-printery-idempotency-key"] == delivery_key("dep-d", good)

        code, _, err = await cli(server.url, prefix, "review", "reject", failing, "--by", "ops")
        assert code == 0, err
        assert await client.xlen(f"{prefix}:review") == 0
        decided = [f["decision"] for _, f in await client.xrange(f"{prefix}:review:decided")]
        assert decided == ["approved", "rejected"]
    finally:
        await sandbox.stop()


async def test_branch_timeout_records_only(server: ServerProcess, prefix: str,
                                           client: aioredis.Redis) -> None:
    review_id = await add_review(client, prefix, "branch_timeout",
                                 {"deployment_id": "dep-t", "status": "failed"}, cid="dep-t")
    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "ops")
    assert code == 0, err
    streams = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    assert sorted(streams) == [f"{prefix}:review", f"{prefix}:review:decided"]
    assert await client.xlen(f"{prefix}:review") == 0


async def test_an_approval_of_a_request_that_no_longer_validates_is_refused(
        server: ServerProcess, prefix: str, client: aioredis.Redis) -> None:
    """The review entry holds the request as submitted; approving validates it again, so
    what it writes is the normalized request or nothing at all."""
    review_id = await add_review(client, prefix, "approval",
                                 {**REQUEST, "environment": "moon"}, cid="dep-moon")
    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "bob")
    assert code == 1 and "unknown_environment" in err
    assert await client.xlen(f"{prefix}:review") == 1
    assert await client.exists(f"{prefix}:deployment:validated") == 0


async def test_review_list_pages(server: ServerProcess, prefix: str,
                                 client: aioredis.Redis) -> None:
    ids = [await add_review(client, prefix, "approval", REQUEST, cid=f"dep-{n}")
           for n in range(3)]
    code, out, err = await cli(server.url, prefix, "review", "list", "--json", "--limit", "2")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ids[:2]
    assert f"more: printery review list --after {ids[1]}" in err
    code, out, err = await cli(server.url, prefix, "review", "list", "--json",
                               "--after", ids[1])
    assert code == 0 and [r["id"] for r in json.loads(out)] == ids[2:] and "more" not in err
    code, _, err = await cli(server.url, prefix, "review", "list", "--after", "junk")
    assert code == 2 and "not 'junk'" in err
