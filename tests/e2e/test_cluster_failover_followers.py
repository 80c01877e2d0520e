"""Followers through a master failover (issue 31): ``Client.result`` and an event
stream (``GET /v1/runs/{id}/events``, read the way an ``EventSource`` reads it: a cut
stream is opened again with ``Last-Event-ID``) follow a run on a 3+3 Valkey cluster while
the master of the run's partition is killed (kill -9) and comes back as a replica. Both
end with the run's outcome, the stream with no event twice; nothing restarts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from printery import Client
from printery.deploy.sandbox import Sandbox
from printery.store.partitions import read_partitions
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster
from support.service import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

CONFIG = """\
[transport]
visibility_timeout = 3
claim_interval = 0.5

[health_monitor]
interval = 0.05
consecutive = 1
deadline = 60
probe_timeout = 20
"""


async def _events(base: str, run_id: str, deadline: float) -> tuple[list[dict[str, Any]], list[str], int]:
    """The stream's events until it ends after the outcome; its ids; the reconnects."""
    found: list[dict[str, Any]] = []
    ids: list[str] = []
    reconnects = -1
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=60)) as http:
        while time.monotonic() < deadline:
            reconnects += 1
            headers = {"Last-Event-ID": ids[-1]} if ids else {}
            try:
                async with http.stream("GET", f"{base}/v1/runs/{run_id}/events", headers=headers) as response:
                    if response.status_code == 204:  # the outcome was given already
                        break
                    assert response.status_code == 200, await response.aread()
                    async for line in response.aiter_lines():
                        if line.startswith("id: "):
                            ids.append(line[4:])
                        elif line.startswith("data: "):
                            found.append(json.loads(line[6:]))
                if found and found[-1]["stream"] == "deployment:finished":
                    break
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
    return found, ids, reconnects


async def test_result_and_event_stream_follow_a_run_through_a_failover(
    own_cluster: ValkeyCluster, prefix: str, tmp_path: Path, report_figures: Callable[[str], None]
) -> None:
    sandbox = Sandbox(slow_seconds=6)  # the health probe the run waits on outlasts the failover
    await sandbox.start()
    config = tmp_path / "printery.toml"
    config.write_text(CONFIG)
    service = spawn(["--redis-url", own_cluster.url, "--stream-prefix", prefix, "--config", str(config)],
                    cwd=tmp_path)
    redis = connect(own_cluster.url)
    try:
        assert service.http_base is not None
        service.wait_until(lambda: service.get("/readyz").status_code == 200, what="ready")
        partitions = await read_partitions(redis, prefix)
        assert partitions == 9
        async with Client(own_cluster.url, stream_prefix=prefix) as client:
            run_id = await client.submit({
                "deployment_id": "dep-follow-1", "service": "billing-api", "version": "1.0.0",
                "environment": "development", "requested_by": "alice",
                "health_url": sandbox.url("/svc/slow"), "notify": ["log"]})
            deadline = time.monotonic() + 90
            result = asyncio.create_task(client.result(run_id, timeout=90))
            stream = asyncio.create_task(_events(service.http_base, run_id, deadline))
            keys = StreamKeys(prefix, partitions).of(run_id)
            while await redis.xlen(keys.stream("deployment:validated")) < 1:  # mid-run
                assert time.monotonic() < deadline, "not validated"
                await asyncio.sleep(0.05)
            victim = await asyncio.to_thread(own_cluster.master_of, keys.stream("deployment:started"))
            killed = time.monotonic()
            await asyncio.to_thread(own_cluster.kill_master, victim)
            assert not result.done(), "the run ended before the failover was over"
            await asyncio.to_thread(own_cluster.rejoin, victim)
            outcome = await asyncio.wait_for(result, 90)
            ended = time.monotonic() - killed
            assert outcome.status == "succeeded", outcome
            found, ids, reconnects = await asyncio.wait_for(stream, 90)
        assert found and found[-1]["stream"] == "deployment:finished", found
        assert len(set(ids)) == len(ids) == len(found), "no event twice"
        assert [e["stream"] for e in found][:2] == ["deployment:started", "deployment:validated"]
        assert reconnects <= 3, reconnects
        report_figures(f"outcome {ended:.1f}s after the kill (the run's probe takes 6 s), "
                       f"{len(found)} events, {reconnects} reconnects of the event stream")
        assert service.proc.poll() is None
    finally:
        service.stop()
        await redis.aclose()
        await sandbox.stop()
