"""``printery_queue_lag_seconds`` of a real ``printery-workers``: a consumer that took an
entry and stalled shows as the entry's age in seconds on ``/metrics``, and as 0 once the
entry is acknowledged; the reviews and dead letters waiting are counted too."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from printery.transport.streams import ensure_group
from support.service import ServiceHandle, spawn, started_entry


def gauge(handle: ServiceHandle, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(handle.get("/metrics").text):
        if family.name == name:
            for sample in family.samples:
                if sample.labels == labels:
                    return float(sample.value)
    return None


def lag_of(handle: ServiceHandle, stream: str, group: str) -> float | None:
    return gauge(handle, "printery_queue_lag_seconds", stream=stream, group=group)


async def test_a_stalled_consumer_shows_as_lag_in_seconds(
    server: ServerProcess, client: aioredis.Redis, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    stream = f"{prefix}:deployment:started"
    await ensure_group(client, stream, "validator")
    seconds, micros = await client.time()
    entry_id = await client.xadd(stream, started_entry("dep-stalled"),  # type: ignore[arg-type]
                                 id=f"{int(seconds) * 1000 + int(micros) // 1000 - 30_000}-0")
    # A consumer of another process takes the entry and never acknowledges it.
    # One review and two dead letters wait as well.
    await client.xadd(f"{prefix}:review", {"data": "{}", "kind": "approval"})
    for _ in range(2):
        await client.xadd(f"{prefix}:dlq", {"data": "{}", "reason_code": "invalid_json"})
    await client.xreadgroup("validator", "stalled-consumer", {stream: ">"}, count=1)
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--worker", "validator"],
                   cwd=tmp_path)
    try:
        lag = handle.wait_until(
            lambda: (value := lag_of(handle, "deployment:started", "validator")) is not None
            and value >= 30.0 and value, timeout=20, what="the stalled entry's lag")
        assert lag < 60.0
        assert gauge(handle, "printery_reviews_open") == 1.0
        assert gauge(handle, "printery_dlq_entries") == 2.0
        await client.xack(stream, "validator", entry_id)
        handle.wait_until(lambda: lag_of(handle, "deployment:started", "validator") == 0.0,
                          timeout=20, what="no lag once acknowledged")
        assert handle.stop() == 0
    finally:
        handle.kill()
