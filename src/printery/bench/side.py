"""One side of a bench run: its relay processes started, the events offered or loaded,
their arrivals awaited and read back, and the side's figures.

Every side, printery or a ceiling, runs through this one function, so that they are
measured the same way.
"""

from __future__ import annotations

import time
from typing import Any

from printery.bench.arrivals import read_arrivals, wait_arrivals
from printery.bench.cleanup import delete_prefix
from printery.bench.commands import CommandStats
from printery.bench.cpu import ClusterCpu, ServerCpu
from printery.bench.load import (
    EventFactory,
    load_backlog,
    offer,
    percentile,
    server_offset_ms,
)
from printery.bench.names import BenchLayout
from printery.bench.plan import BATCH, BLOCK_MS, STALL_TIMEOUT, Plan
from printery.bench.procs import RelayProcesses
from printery.store import Redis


def _features(side: str, features: tuple[str, ...]) -> tuple[str, ...]:
    """What the pipeline of ``side`` runs with: ``printery_without`` is the handlers of
    ``printery_with`` (reporting a cost when a budget is on) without its limit and budget."""
    if side == "printery_with":
        return features
    return ("cost",) if side == "printery_without" else ()


async def run_side(
    kind: str, client: Redis, url: str, plan: Plan, server_pid: int | None
) -> dict[str, Any]:
    layout = BenchLayout(f"bench:{plan.run_id}:{kind}", plan.stages, plan.partitions)
    ours = kind.startswith("printery")
    procs = RelayProcesses(
        "printery" if ours else kind, plan.processes, url=url, prefix=layout.prefix,
        stages=plan.stages, batch=BATCH, block_ms=BLOCK_MS, log_dir=plan.work_dir,
        prefetch=plan.prefetch if ours else None,
        features=_features(kind, plan.features),
        partitions=plan.partitions,
    )
    server_cpu = ServerCpu(server_pid)
    masters_cpu = ClusterCpu(client)
    commands = CommandStats(client, enabled=server_pid is not None)
    try:
        await procs.start()
        offset = await server_offset_ms(client)
        factory = EventFactory(layout, plan.payload_bytes, offset,
                               minimal=kind == "ceiling_minimal")
        if plan.rate is None:
            await load_backlog(client, factory, plan.events)
            await commands.start()
            server_cpu.start()
            await masters_cpu.start()
            start_ms = time.time() * 1000 + offset
            await procs.go(wait_running=False)
            not_before = start_ms
            offered = 0
        else:
            await procs.go(wait_running=True)
            await commands.start()
            server_cpu.start()
            await masters_cpu.start()
            start_ms = time.time() * 1000 + offset
            offered = await offer(client, factory, plan.rate, plan.duration)
            not_before = 0.0
        _, polls = await wait_arrivals(client, layout, plan.events,
                                       stall_timeout=STALL_TIMEOUT)
        procs.mark_done()
        server_seconds = server_cpu.seconds()
        by_master = await masters_cpu.seconds()
        # The driver's own commands in the window: its polls of the count and, in rate
        # mode, the XADD of every offered event (INFO is left out by name). The sinks'
        # notes stay in (an XADD and an INCRBY per batch, every 20 ms: a few per 1,000).
        calls = await commands.stop(driver={"get": polls, "xadd": offered})
        arrivals = await read_arrivals(client, layout, not_before_ms=not_before)
    finally:
        await procs.stop()
        await delete_prefix(client, layout.prefix)
    arrived = sum(arrivals.counts.values())
    elapsed = max(arrivals.last_ms - start_ms, 1.0) / 1000
    ordered = sorted(arrivals.latencies_ms)
    per_event = 1 / max(arrived, 1)
    side: dict[str, Any] = {
        "events_per_s": round(arrived / elapsed, 1),
        "p50_ms": round(percentile(ordered, 0.50), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2) if ordered else 0.0,
        "cpu_s_per_1000": round(procs.cpu_seconds * per_event * 1000, 4),
        "peak_rss_mb": round(procs.peak_rss_mb, 1),
        "idle_rss_mb": round(procs.idle_rss_mb, 1),
        "seconds": round(elapsed, 3),
        "arrived": arrived,
        "verified": arrivals.exactly_once(plan.events),
    }
    if ours:
        side["settings"] = procs.settings
    if by_master is not None:
        server_seconds = sum(by_master.values())
        side["server_cpu_s_per_1000_by_master"] = {
            name: round(seconds * per_event * 1000, 4) for name, seconds in by_master.items()}
    if server_seconds is not None:
        side["server_cpu_s_per_1000"] = round(server_seconds * per_event * 1000, 4)
    if calls is not None:
        side["commands_per_event"] = round(sum(c for c, _ in calls.values()) * per_event, 3)
        side["commands"] = {
            name: {"per_event": round(count * per_event, 3),
                   "usec_per_event": round(usec * per_event, 2)}
            for name, (count, usec) in sorted(calls.items(), key=lambda kv: -kv[1][0])
            if count > 0
        }
    return side
