"""`printery emit --wait` and `printery replay` against the real deployment pipeline,
run in-process (workers from the public API) while the command runs as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from printery.servers.process import ServerProcess
from printery.testing import wait_for
from support.deploy import DeployRun, fast_settings, start_pipeline, stop_pipeline
from support.operator_cli import cli


@pytest.fixture
async def run(client: aioredis.Redis, prefix: str) -> AsyncIterator[DeployRun]:
    pipeline = await start_pipeline(client, prefix, fast_settings())
    yield pipeline
    await stop_pipeline(pipeline)


async def test_emit_wait_exit_codes_and_replay(run: DeployRun, server: ServerProcess,
                                               prefix: str) -> None:
    good = run.request(deployment_id="dep-ok-1")
    bad = run.request(version="not-semver")
    (ok_code, ok_out, ok_err), (bad_code, bad_out, _) = await asyncio.gather(
        cli(server.url, prefix, "emit", "--data", json.dumps(good), "--wait", "--timeout", "60",
            "--json"),
        cli(server.url, prefix, "emit", "--data", json.dumps(bad), "--wait", "--timeout", "60"),
    )
    assert ok_code == 0, ok_err
    doc = json.loads(ok_out)
    assert doc["deployment_id"] == "dep-ok-1" and doc["status"] == "succeeded"
    assert doc["finished"]["data"]["status"] == "succeeded"
    assert bad_code == 1 and "rejected" in bad_out and "invalid_version" in bad_out

    # The same id again is not run again; --wait finds the earlier outcome at once.
    code, out, err = await cli(server.url, prefix, "emit", "--data", json.dumps(good), "--wait",
                               "--timeout", "20")
    assert code == 0 and "succeeded" in out, err

    # Replay from the ingress and from health-monitor: a second finish under each new id.
    code, out, err = await cli(server.url, prefix, "replay", "dep-ok-1", "--json")
    assert code == 0, err
    assert json.loads(out)["deployment_id"] == "dep-ok-1-r1"
    code, out, err = await cli(server.url, prefix, "replay", "dep-ok-1", "--from",
                               "health-monitor")
    assert code == 0, err
    assert out.strip() == "dep-ok-1-r2"
    for new_id in ("dep-ok-1-r1", "dep-ok-1-r2"):
        finished = await run.finished(new_id, timeout=40)
        assert finished["status"] == "succeeded"
        [entry] = await run.entries("deployment:finished", new_id)
        assert entry["replay_of"] == "dep-ok-1"
    assert len(await run.entries("deployment:finished", "dep-ok-1")) == 1

    async def traced() -> str:
        code, out, _ = await cli(server.url, prefix, "trace", "dep-ok-1-r1", "--json")
        rows = json.loads(out) if code == 0 else []
        return out if any(r["stream"] == "notification:sent" for r in rows) else ""

    rows = json.loads(await wait_for(traced, timeout=40, interval=0.5))
    assert all(r.get("replay_of") == "dep-ok-1" for r in rows)
    assert all("duration_ms" in r for r in rows if r["producer"] != "printery-cli")


async def _emit_waiting(url: str, prefix: str, *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "printery.cli.operator", "--redis-url", url,
        "--stream-prefix", prefix, "emit", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def test_emit_wait_on_a_production_request_names_the_review_then_follows_the_approval(
        run: DeployRun, server: ServerProcess, prefix: str, client: aioredis.Redis) -> None:
    """The review entry holds the request exactly as submitted (no defaults filled in);
    `emit --wait` says the deployment waits for approval, names the review id, and the
    approval lets it finish (the approval normalizes the request, as the validator does)."""
    submitted = run.request(deployment_id="dep-prod-w1", environment="production")
    proc = await _emit_waiting(server.url, prefix, "--data", json.dumps(submitted), "--wait",
                               "--timeout", "60")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip() == "dep-prod-w1"
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert "waits for approval" in line, line
        [(review_id, review)] = await client.xrange(f"{prefix}:review")
        assert f"review {review_id}" in line
        assert json.loads(review["data"]) == submitted
        code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "bob")
        assert code == 0, err
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0 and "dep-prod-w1: succeeded" in out.decode()
    [validated] = await run.entries("deployment:validated", "dep-prod-w1")
    assert validated["data"] == {**submitted, "approved_by": "bob", "dependencies": []}


async def test_emit_wait_on_a_dead_lettered_request_returns_at_once(
        run: DeployRun, server: ServerProcess, prefix: str, tmp_path: Path) -> None:
    """Too large for the service's payload limit (not the operator's, who allows more):
    the request goes to dlq, and --wait says so with exit 1 instead of sitting out its
    120 s timeout (the helper gives up after 60 s)."""
    big = tmp_path / "big.json"
    big.write_text(json.dumps(run.request(deployment_id="dep-big-1", note="x" * 1_100_000)))
    roomy = tmp_path / "roomy.toml"
    roomy.write_text("[transport]\npayload_limit_bytes = 4194304\n")
    code, out, err = await cli(server.url, prefix, "--config", str(roomy), "emit", "--file",
                               str(big), "--wait", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["status"] == "dead_lettered" and doc["deployment_id"] == "dep-big-1"
    assert doc["dlq"]["reason_code"] == "payload_too_large"
    assert doc["dlq"]["source_id"] == doc["entry_id"]
    big.write_text(json.dumps(run.request(deployment_id="dep-big-2", note="x" * 1_100_000)))
    code, out, _ = await cli(server.url, prefix, "--config", str(roomy), "emit", "--file",
                             str(big), "--wait")
    assert code == 1 and "dep-big-2: dead_lettered (payload_too_large)" in out
    # Within the operator's own limit, it is refused before anything is published.
    big.write_text(json.dumps(run.request(deployment_id="dep-big-3", note="x" * 1_100_000)))
    code, _, err = await cli(server.url, prefix, "emit", "--file", str(big), "--wait")
    assert code == 1 and "dep-big-3: payload_too_large (not published)" in err
