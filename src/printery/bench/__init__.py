"""``printery bench`` (CONTRACT §9): printery's pipeline against a hand-written relay, in
one run on one server, so their ratio holds however noisy the machine.

Two modes. *Backlog* (the default) loads ``events`` entries into stage 0 before any relay
reads, then times until all of them reach the final stream: throughput. *Rate* offers
``rate`` events/s for ``duration`` s to running relays: latency at a load the system can
carry (latency under a backlog only measures the queue). Either way both sides are
checked for exactly-once arrival, and ``verified`` is true only if every event arrived
exactly once on both.

The CLI calls :func:`run_bench` and prints :func:`format_table` or the JSON document.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis
import redis.asyncio as aioredis

from printery.bench.layout import BenchLayout
from printery.bench.load import (
    EventFactory,
    load_backlog,
    offer,
    percentile,
    read_arrivals,
    server_offset_ms,
    wait_arrivals,
)
from printery.bench.procs import RelayProcesses
from printery.bench.report import format_table
from printery.errors import ConfigError
from printery.transport.connection import connect
from printery.transport.embedded import start_ephemeral

__all__ = ["SIDES", "format_table", "run_bench"]

#: The two sides, in the order they run.
SIDES = ("ceiling", "printery")

#: Entries per read: the ceiling's XREADGROUP count and printery's ``prefetch``.
BATCH = 256
#: Blocking-read time of both sides: short, so a stop is quick; it costs nothing when busy.
BLOCK_MS = 100
#: A side that delivers nothing new for this long has failed; the run goes on.
STALL_TIMEOUT = 30.0
#: Duration of the rate mode when none is given.
DEFAULT_DURATION = 20.0


@dataclass(frozen=True, slots=True)
class _Plan:
    events: int
    stages: int
    processes: int
    payload_bytes: int
    rate: float | None
    duration: float
    run_id: str
    work_dir: Path


async def run_bench(
    *,
    events: int,
    stages: int,
    processes: int,
    payload_bytes: int,
    redis_url: str | None,
    rate: float | None,
    duration: float | None,
    sides: tuple[str, ...] = SIDES,
) -> dict[str, Any]:
    """Run the ceiling, then printery, and return the §9 document.

    With ``redis_url`` None a private server without persistence is started and stopped
    (so the disk is not measured); with a URL, only keys under a fresh prefix are used and
    deleted afterwards. ``rate`` switches to the open-loop mode, where ``events`` is
    ``rate * duration``. Raises :class:`ConfigError` for an impossible option.
    """
    _validate(events, stages, processes, payload_bytes, rate, duration, sides)
    run_duration = duration if duration is not None else DEFAULT_DURATION
    if rate is not None:
        events = round(rate * run_duration)
    with tempfile.TemporaryDirectory(prefix="printery-bench-") as tmp:
        plan = _Plan(events, stages, processes, payload_bytes, rate, run_duration,
                     uuid.uuid4().hex[:10], Path(tmp))
        server = None
        if redis_url is None:
            server = await asyncio.to_thread(start_ephemeral, plan.work_dir / "server",
                                             appendonly=False)
        url = server.url if server else str(redis_url)
        client = connect(url, block_ms=BLOCK_MS)
        try:
            server_pid = server.pid if server else None
            results = {side: await _run_side(side, client, url, plan, server_pid) for side in sides}
        finally:
            await client.aclose()
            if server:
                await asyncio.to_thread(server.stop)
    return _document(plan, results, embedded=redis_url is None)


def _validate(
    events: int, stages: int, processes: int, payload_bytes: int, rate: float | None,
    duration: float | None, sides: tuple[str, ...],
) -> None:
    if rate is None and events < 1:
        raise ConfigError("events", events, "at least 1")
    if stages < 1:
        raise ConfigError("stages", stages, "at least 1")
    if processes < 1:
        raise ConfigError("processes", processes, "at least 1")
    if payload_bytes < 0:
        raise ConfigError("payload_bytes", payload_bytes, "0 or more")
    if rate is not None and rate <= 0:
        raise ConfigError("rate", rate, "events per second, more than 0")
    if duration is not None and duration <= 0:
        raise ConfigError("duration", duration, "seconds, more than 0")
    if rate is not None and round(rate * (duration or DEFAULT_DURATION)) < 1:
        raise ConfigError("rate", rate, "rate * duration must give at least one event")
    if not sides or any(s not in SIDES for s in sides):
        raise ConfigError("sides", sides, f"a non-empty selection of {SIDES}")


async def _run_side(
    kind: str, client: aioredis.Redis, url: str, plan: _Plan, server_pid: int | None
) -> dict[str, Any]:
    layout = BenchLayout(f"bench:{plan.run_id}:{kind}", plan.stages)
    procs = RelayProcesses(
        kind, plan.processes, url=url, prefix=layout.prefix, stages=plan.stages, batch=BATCH,
        block_ms=BLOCK_MS, log_dir=plan.work_dir,
    )
    server_cpu = _ServerCpu(server_pid)
    try:
        await procs.start()
        offset = await server_offset_ms(client)
        factory = EventFactory(layout, plan.payload_bytes, offset)
        if plan.rate is None:
            await load_backlog(client, factory, plan.events)
            server_cpu.start()
            start_ms = time.time() * 1000 + offset
            await procs.go(wait_running=False)
            not_before = start_ms
        else:
            await procs.go(wait_running=True)
            server_cpu.start()
            start_ms = time.time() * 1000 + offset
            await offer(client, factory, plan.rate, plan.duration)
            not_before = 0.0
        await wait_arrivals(client, layout.final, plan.events, stall_timeout=STALL_TIMEOUT)
        procs.mark_done()
        server_seconds = server_cpu.seconds()
        arrivals = await read_arrivals(client, layout.final, not_before_ms=not_before)
    finally:
        await procs.stop()
        await _delete_prefix(client, layout.prefix)
    arrived = sum(arrivals.counts.values())
    elapsed = max(arrivals.last_ms - start_ms, 1.0) / 1000
    ordered = sorted(arrivals.latencies_ms)
    side: dict[str, Any] = {
        "events_per_s": round(arrived / elapsed, 1),
        "p50_ms": round(percentile(ordered, 0.50), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2) if ordered else 0.0,
        "cpu_s_per_1000": round(procs.cpu_seconds / max(arrived, 1) * 1000, 4),
        "peak_rss_mb": round(procs.peak_rss_mb, 1),
        "idle_rss_mb": round(procs.idle_rss_mb, 1),
        "seconds": round(elapsed, 3),
        "arrived": arrived,
        "verified": arrivals.exactly_once(plan.events),
    }
    if server_seconds is not None:
        side["server_cpu_s_per_1000"] = round(server_seconds / max(arrived, 1) * 1000, 4)
    return side


class _ServerCpu:
    """CPU time of our own server over the measured window (unknown for a remote one)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._start = 0.0

    def _now(self) -> float | None:
        if self.pid is None:
            return None
        try:
            times: Any = psutil.Process(self.pid).cpu_times()
        except psutil.Error:
            return None
        return float(times.user) + float(times.system)

    def start(self) -> None:
        self._start = self._now() or 0.0

    def seconds(self) -> float | None:
        now = self._now()
        return None if now is None else now - self._start


async def _delete_prefix(client: aioredis.Redis, prefix: str) -> None:
    """Remove the run's streams and markers, so repeated runs do not fill the server."""
    with contextlib.suppress(redis.RedisError, OSError):
        batch: list[str] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await client.unlink(*batch)
                batch = []
        if batch:
            await client.unlink(*batch)


def _document(plan: _Plan, results: dict[str, dict[str, Any]], *, embedded: bool) -> dict[str, Any]:
    ceiling, ours = results.get("ceiling"), results.get("printery")
    ratio = 0.0
    if ceiling and ours and ceiling["events_per_s"]:
        ratio = round(ours["events_per_s"] / ceiling["events_per_s"], 3)
    doc: dict[str, Any] = {
        "ceiling": ceiling or {},
        "printery": ours or {},
        "ratio": ratio,
        "events": plan.events,
        "stages": plan.stages,
        "verified": bool(results) and all(r["verified"] for r in results.values()),
        "mode": "backlog" if plan.rate is None else "rate",
        "processes": plan.processes,
        "payload_bytes": plan.payload_bytes,
        "server": "embedded" if embedded else "url",
        "client": f"redis-py {redis.__version__}",
        "batch": BATCH,
    }
    if plan.rate is not None:
        doc["rate"] = plan.rate
        doc["duration"] = plan.duration
        if ceiling and ours and ceiling["p99_ms"]:
            doc["p99_ratio"] = round(ours["p99_ms"] / ceiling["p99_ms"], 3)
    return doc
