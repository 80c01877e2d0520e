"""`printery emit --wait` and `printery replay` against the real deployment pipeline,
run in-process (workers from the public API) while the command runs as a subprocess."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from printery.testing import wait_for
from printery.transport.server import ServerProcess
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
