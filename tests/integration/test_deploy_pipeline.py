"""The deployment pipeline end to end: real server, real HTTP services and webhook sink."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from printery.deploy.app import approved_request
from printery.testing import wait_for
from support.deploy import DeployRun, fast_settings, start_pipeline, stop_pipeline


@pytest.fixture
async def run(client: aioredis.Redis, prefix: str) -> AsyncIterator[DeployRun]:
    started = await start_pipeline(client, prefix, fast_settings())
    yield started
    await stop_pipeline(started)


async def test_full_event_flow(run: DeployRun, monkeypatch: pytest.MonkeyPatch) -> None:
    dep = await run.emit(run.request(dependencies=[
        {"service": "ledger", "health_url": run.sandbox.url("/svc/healthy/2.1.0"), "version": ">=2.0,<3"}
    ]))
    finished = await run.finished(dep)
    assert finished["status"] == "succeeded", finished
    assert finished["reasons"] == []
    assert set(finished["steps"]) == {"validator", "dependency-checker", "health-monitor"}
    for event_type in ("deployment:started", "deployment:validated", "dependencies:checked",
                       "health:checked", "deployment:finished"):
        assert len(await run.entries(event_type, dep)) == 1, event_type
    (note,) = await run.sent(dep, 1)
    assert note["status"] == "delivered" and note["fallback_for"] is None
    posts = await run.sandbox.wait_for_posts(1)
    assert len(posts) == 1
    assert posts[0].json["deployment_id"] == dep
    assert posts[0].headers["X-Printery-Idempotency-Key"]
    entry = (await run.entries("deployment:finished", dep))[0]
    assert entry["producer"] == "aggregator" and float(entry["duration_ms"]) >= 0


async def test_validator_processing(run: DeployRun) -> None:
    bad = run.request(service="Bad Name", version="one", environment="moon",
                      health_url="ftp://x", dependencies=[{"service": "a", "health_url": "http://a"},
                                                          {"service": "a", "health_url": "http://a"}])
    dep = await run.emit(bad)
    finished = await run.finished(dep)
    assert finished["status"] == "rejected"
    codes = {r["code"] for r in finished["reasons"]}
    assert {"invalid_field", "invalid_version", "unknown_environment", "invalid_url",
            "duplicate_dependency"} <= codes
    (rejected,) = await run.entries("deployment:rejected", dep)
    assert rejected["data"]["request"] == bad
    assert await run.entries("deployment:validated", dep) == []
    not_object = await run.client.xadd(run.keys.stream("deployment:started"), {"data": "[1, 2]"})
    assert not_object
    rows = await wait_for(lambda: run.entries("deployment:rejected"), timeout=10)
    await wait_for(lambda: _len_at_least(run, "deployment:rejected", 2), timeout=10)
    codes = [r["code"] for row in await run.entries("deployment:rejected") for r in row["data"]["reasons"]]
    assert "malformed_event" in codes and rows


async def _len_at_least(run: DeployRun, event_type: str, n: int) -> bool:
    return len(await run.entries(event_type)) >= n


async def test_dependency_checking(run: DeployRun) -> None:
    closed = "http://127.0.0.1:9/healthz"
    dep = await run.emit(run.request(dependencies=[
        {"service": "ok", "health_url": run.sandbox.url("/svc/healthy/2.0.0")},
        {"service": "broken", "health_url": run.sandbox.url("/svc/failing")},
        {"service": "gone", "health_url": closed},
        {"service": "old", "health_url": run.sandbox.url("/svc/healthy/1.0.0"), "version": ">=2"},
    ]))
    finished = await run.finished(dep)
    assert finished["status"] == "blocked"
    by_field = {r["field"]: r["code"] for r in finished["reasons"]}
    assert by_field == {
        "dependencies[1]": "dependency_unhealthy",
        "dependencies[2]": "dependency_unreachable",
        "dependencies[3]": "dependency_version_mismatch",
    }
    (checked,) = await run.entries("dependencies:checked", dep)
    statuses = [r["status"] for r in checked["data"]["results"]]
    assert statuses == ["healthy", "unhealthy", "unreachable", "version_mismatch"]


async def test_health_monitoring(run: DeployRun) -> None:
    healthy = await run.emit(run.request())
    failing = await run.emit(run.request(health_url=run.sandbox.url("/svc/failing")))
    old = await run.emit(run.request(health_url=run.sandbox.url("/svc/healthy/1.0.0")))
    skipped = await run.emit(run.request(health_url=None))
    assert (await run.finished(healthy))["status"] == "succeeded"
    (checked,) = await run.entries("health:checked", healthy)
    assert checked["data"]["status"] == "healthy" and checked["data"]["consecutive_successes"] == 2
    for dep in (failing, old):
        finished = await run.finished(dep)
        assert finished["status"] == "unhealthy"
        assert [r["code"] for r in finished["reasons"]] == ["service_unhealthy"]
    assert (await run.finished(skipped))["status"] == "succeeded"
    (checked,) = await run.entries("health:checked", skipped)
    assert checked["data"]["status"] == "skipped"


async def test_notifications(run: DeployRun, monkeypatch: pytest.MonkeyPatch) -> None:
    delivered = await run.emit(run.request())
    (note,) = await run.sent(delivered, 1)
    assert note["status"] == "delivered"
    failing = await run.emit(run.request(notify=[f"webhook+{run.sandbox.url('/hooks/fail')}", "log"]))
    notes = await run.sent(failing, 3)
    by_key = {(n["channel"], n["fallback_for"]): n for n in notes}
    failed_channel = f"webhook+{run.sandbox.url('/hooks/fail')}"
    assert by_key[(failed_channel, None)]["status"] == "failed"
    assert by_key[(failed_channel, None)]["attempts"] == 2, "1 + retries attempts"
    assert by_key[("log", failed_channel)]["status"] == "delivered", "fallback carries fallback_for"
    assert by_key[("log", None)]["status"] == "delivered", "the requested log channel is separate"
    reviews = await wait_for(lambda: run.entries("review", failing), timeout=10)
    assert reviews[0]["kind"] == "delivery_failed" and reviews[0]["step"] == "notifier"
    fail_posts = [p for p in run.sandbox.received if p.path == "/hooks/fail"]
    assert len({p.headers["X-Printery-Idempotency-Key"] for p in fail_posts}) == 1


async def test_webhook_signature(client: aioredis.Redis, prefix: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRINTERY_WEBHOOK_SECRET", "hook-secret")
    run = await start_pipeline(client, prefix, fast_settings())
    try:
        dep = await run.emit(run.request())
        await run.finished(dep)
        (post,) = await run.sandbox.wait_for_posts(1)
        expected = "sha256=" + hmac.new(b"hook-secret", post.body, hashlib.sha256).hexdigest()
        assert post.headers["X-Printery-Signature"] == expected
    finally:
        await stop_pipeline(run)


async def test_approval_gate(run: DeployRun) -> None:
    waiting = await run.emit(run.request(environment="production"))
    reviews = await wait_for(lambda: run.entries("review", waiting), timeout=10)
    assert reviews[0]["kind"] == "approval" and reviews[0]["step"] == "validator"
    assert (reviews[0]["resume_type"], reviews[0]["reject_type"]) == (
        "deployment:validated", "deployment:rejected")
    assert await run.entries("deployment:validated", waiting) == []
    assert await run.entries("deployment:finished", waiting) == []
    # What `printery review approve` writes: the request as submitted, normalized again,
    # with approved_by.
    assert reviews[0]["data"] == run.request(environment="production")
    request = approved_request(reviews[0]["data"], waiting, "bob", fast_settings())
    assert request["approved_by"] == "bob" and request["dependencies"] == []
    envelope = run.codec.new("deployment:validated", request, producer="printery-cli")
    await run.client.xadd(run.keys.stream("deployment:validated"), run.codec.encode(envelope))
    assert (await run.finished(waiting))["status"] == "succeeded"

    refused = await run.emit(run.request(environment="production"))
    reviews = await wait_for(lambda: run.entries("review", refused), timeout=10)
    rejected = {"deployment_id": refused, "request": reviews[0]["data"],
                "reasons": [{"code": "rejected_by_reviewer", "field": "", "message": "no"}]}
    envelope = run.codec.new("deployment:rejected", rejected, producer="printery-cli")
    await run.client.xadd(run.keys.stream("deployment:rejected"), run.codec.encode(envelope))
    finished = await run.finished(refused)
    assert finished["status"] == "rejected"
    assert finished["reasons"][0]["code"] == "rejected_by_reviewer"


async def test_same_ingress_twice_gives_one_finish_and_one_post(run: DeployRun) -> None:
    data = run.request(deployment_id="dep-twice-1")
    await run.emit(data, idempotency_key="same-key")
    await run.emit(data, idempotency_key="same-key")
    await run.emit(data)  # same deployment id, other key: recorded, not run again
    await run.finished("dep-twice-1")
    await run.sent("dep-twice-1", 1)
    await wait_for(lambda: _all_acked(run, "deployment:started", "validator"), timeout=10)
    assert len(await run.entries("deployment:finished", "dep-twice-1")) == 1
    assert len(await run.entries("deployment:started", "dep-twice-1")) == 3
    assert len([p for p in run.sandbox.received if p.json["deployment_id"] == "dep-twice-1"]) == 1


async def _all_acked(run: DeployRun, event_type: str, group: str) -> bool:
    groups = {g["name"]: g for g in await run.client.xinfo_groups(run.keys.stream(event_type))}
    return bool(groups[group]["pending"] == 0 and groups[group]["lag"] == 0)


async def test_branch_that_never_reports_fails_with_branch_timeout(
    client: aioredis.Redis, prefix: str
) -> None:
    settings = fast_settings(aggregator={"branch_deadline": 0.5})
    run = await start_pipeline(client, prefix, settings,
                               only=["validator", "dependency-checker", "aggregator", "notifier"])
    try:
        dep = await run.emit(run.request())
        finished = await run.finished(dep)
        assert finished["status"] == "failed"
        assert [(r["code"], r["field"]) for r in finished["reasons"]] == [
            ("branch_timeout", "health-monitor")]
        reviews = await wait_for(lambda: run.entries("review", dep), timeout=10)
        assert reviews[0]["kind"] == "branch_timeout"
    finally:
        await stop_pipeline(run)


async def test_200_deployments_at_once(client: aioredis.Redis, prefix: str) -> None:
    # 200 health watches at once, each probing every 50 ms, against a sandbox served by
    # the same event loop as the five workers on a shared 2-core machine: the 1.5 s
    # deadline of the other tests is about the machine, not the pipeline.
    run = await start_pipeline(client, prefix, fast_settings(health_monitor={"deadline": 10}))
    try:
        ids = await asyncio.gather(*(run.emit(run.request(notify=["log"])) for _ in range(200)))

        async def all_finished() -> bool:
            return len(await run.entries("deployment:finished")) >= 200

        await wait_for(all_finished, timeout=60)
        finished = await run.entries("deployment:finished")
    finally:
        await stop_pipeline(run)
    per_id = [f["deployment_id"] for f in finished]
    assert sorted(per_id) == sorted(ids), "each deployment finished exactly once"
    assert [f["data"] for f in finished if f["data"]["status"] != "succeeded"] == []
