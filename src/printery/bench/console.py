"""``printery bench --console``: how fast the web console answers with a large history
(docs/reference.md, The web console: the overview under 200 ms with 10,000 runs in Redis).

Seeds ``runs`` runs of the deployment pipeline through :meth:`Client.submit` (the real
submit path, which indexes each run), ends nine in ten of them as the commit of their
outcome would (the run index's own writes), registers a process with its workers, then
serves the console on a loopback port of this process and times sequential GETs of the
overview, the runs list, a status filter and one run's page from a client thread (one
kept-alive connection; the server's loop keeps running meanwhile). Reports the median
and p95 per page, in milliseconds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import httpx

from printery.bench.server import bench_server
from printery.runs.apps import load_app
from printery.runs.client import Client
from printery.runs.facade import Runs
from printery.runtime.run_index import RunIndex, RunMark
from printery.service.console import service_console
from printery.service.http import HttpServer
from printery.service.registry import ProcessRegistry
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys

__all__ = ["format_console", "run_console_bench"]

IN_FLIGHT = 100
WORKERS = ("validator", "dependency-checker", "health-monitor", "aggregator", "notifier")


class _Provider:
    """The status the HTTP server asks for: the console does not use it."""

    async def status(self) -> dict[str, Any]:
        return {}

    async def readiness(self) -> tuple[bool, list[str]]:
        return True, []

    def metrics(self) -> bytes:
        return b""


def _request(n: int) -> dict[str, Any]:
    return {"service": f"svc-{n % 40}", "version": f"1.{n % 7}.{n % 13}",
            "environment": "development", "requested_by": "bench", "notify": ["log"]}


async def _seed(url: str, prefix: str, runs: int) -> list[str]:
    """Submit ``runs`` runs and end nine in ten of them; their ids."""
    ids: list[str] = []
    async with Client(url, stream_prefix=prefix) as client:
        for start in range(0, runs, IN_FLIGHT):
            batch = [client.submit(_request(n)) for n in range(start, min(runs, start + IN_FLIGHT))]
            ids += await asyncio.gather(*batch)
        pipeline = client.pipeline
    keys = StreamKeys(prefix)
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    redis = connect(url)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for n, run_id in enumerate(ids):
                if n % 10:
                    status = "failed" if n % 10 == 1 else "succeeded"
                    for command in index.writes([RunMark(run_id, False, status)]):
                        pipe.execute_command(*command)
            await pipe.execute()
        registry = ProcessRegistry(redis, keys, "bench-process")
        await registry.beat({"host": "bench", "pid": 1, "workers": {
            name: {"state": "running", "processed": runs, "errors": 0, "restarts": 0}
            for name in WORKERS}})
    finally:
        await redis.aclose()
    return ids


def _measure(base: str, paths: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    """Sequential GETs of each path; median and p95 milliseconds (after one warm-up)."""
    figures: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=base, timeout=30) as http:
        for name, path in paths.items():
            assert http.get(path).status_code == 200, path
            times = []
            for _ in range(requests):
                began = time.perf_counter()
                answer = http.get(path)
                times.append((time.perf_counter() - began) * 1000)
                assert answer.status_code == 200, (path, answer.status_code)
            times.sort()
            figures[name] = {"median_ms": round(statistics.median(times), 2),
                             "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
                             "bytes": len(answer.content)}
    return figures


async def run_console_bench(*, runs: int, requests: int, redis_url: str | None) -> dict[str, Any]:
    async with bench_server(redis_url) as server:
        url, prefix = server.url, f"bench:{uuid.uuid4().hex[:8]}:console"
        began = time.perf_counter()
        ids = await _seed(url, prefix, runs)
        seeded_s = time.perf_counter() - began
        settings, pipeline = load_app(None, {"stream_prefix": prefix, "http_addr":
                                             "127.0.0.1:0"}, {})
        redis = connect(url)
        reader = Runs(redis, StreamKeys(prefix), pipeline,
                      payload_limit=settings.transport.payload_limit_bytes)
        http = HttpServer(_Provider(), console=service_console(reader, settings, {}))
        port = await http.start("127.0.0.1", 0)
        paths = {"overview": "/", "runs": "/runs", "runs, status failed":
                 "/runs?status=failed", "one run": f"/runs/{ids[-1]}"}
        # The client in a thread: this loop keeps serving while it measures.
        figures = await asyncio.to_thread(_measure, f"http://127.0.0.1:{port}", paths,
                                          requests)
        await http.stop()
        await reader.close()
        await redis.aclose()
    return {"mode": "console", "runs": runs, "requests": requests,
            "seeded_s": round(seeded_s, 2), "pages": figures, "verified": True}


def format_console(result: dict[str, Any]) -> str:
    lines = [f"printery bench --console: {result['runs']:,} runs in Redis (seeded in "
             f"{result['seeded_s']:.1f} s), {result['requests']} sequential GETs per page", "",
             f"{'page':24} {'median ms':>10} {'p95 ms':>10} {'bytes':>9}"]
    lines += [f"{name:24} {f['median_ms']:>10.2f} {f['p95_ms']:>10.2f} {f['bytes']:>9,}"
              for name, f in result["pages"].items()]
    return "\n".join(lines)
