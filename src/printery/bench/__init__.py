"""``printery bench`` (CONTRACT §9): printery's pipeline against hand-written relays, in
one run on one server, so their ratios hold however noisy the machine.

printery runs with the library's :class:`~printery.ConsumerSettings` defaults (what
``printery-workers`` runs with) unless ``prefetch`` is given: a bench that tunes printery
and not the user's deployment measures something nobody runs.

Two ceilings, both the same hand-written relay over the same client (``XREADGROUP`` a
batch, one pipeline of ``XADD`` per entry and one ``XACK``), told apart by what they carry:

* ``same``: printery's own envelopes (10 fields, the payload in ``data``), the entries
  printery relays; ``ratio`` is printery against it: what printery's machinery costs
  over moving the same bytes.
* ``minimal``: entries of the one field ``data``, as an outside harness writes them and
  its hand-written relay forwards them; ``ratio_minimal`` is printery against it: the
  figure an outside comparison gets, envelope included.

The default runs both (``ceiling="both"``), one after the other on the same server before
printery, so every run reports both ratios in the same minutes: each answers a different
question, and a ratio taken across runs on a shared machine is noise (±15 %).

Two modes. *Backlog* (the default) loads ``events`` entries into stage 0 before any relay
reads, then times until all of them reach the final stream: throughput. *Rate* offers
``rate`` events/s for ``duration`` s to running relays: latency at a load the system can
carry (latency under a backlog only measures the queue). Either way both sides are
checked for exactly-once arrival, and ``verified`` is true only if every event arrived
exactly once on both.

With ``features`` (``--with-limit``: a :class:`~printery.Limit` on every stage;
``--with-budget``: a :class:`~printery.Budget` on the run and every stage), printery
runs again with them (side ``printery_with``), and ``with_overhead`` is the throughput
the features cost: ``1 - with / without``. Without is the same pipeline with the same
handlers: with a budget, whose handlers report a cost, a run of those handlers without
the budget and the limit (side ``printery_without``; the cost reporting is not what is
measured), else the ``printery`` side; ``with_overhead_plain`` is the cost against the
``printery`` side all the same.

With ``rounds`` above 1 every side runs that many times, the order rotated each round
(no side always first or last), and every ratio and overhead is the median of the
rounds' own (``per_round``: each round's), each taken between sides minutes apart at
most; a side's figures are those of its median round by throughput. On a shared machine
two sides a few seconds apart differ by ±10 % for nothing: one pair per run says little
of a 15 % difference, five pairs far more.

The CLI calls :func:`run_bench` and prints :func:`format_table` or the JSON document.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

from printery.bench.cpu import ClusterCpu, ServerCpu
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
from printery.bench.server import bench_server
from printery.errors import ConfigError
from printery.keys import MAX_PARTITIONS
from printery.transport.connection import CLUSTER_SCHEMES, connect

__all__ = ["SIDES", "format_table", "run_bench"]

#: The sides, in the order they run: the same-entry ceiling, the minimal one, printery,
#: printery's handlers reporting costs (only with a budget), and printery with the
#: features asked for (only when some are).
SIDES = ("ceiling", "ceiling_minimal", "printery", "printery_without", "printery_with")
#: ``ceiling`` option: which ceilings run (printery always does).
CEILINGS: dict[str, tuple[str, ...]] = {
    "same": ("ceiling",),
    "minimal": ("ceiling_minimal",),
    "both": ("ceiling", "ceiling_minimal"),
}

#: Entries per read of the ceilings (their XREADGROUP count). printery reads what its
#: own ``prefetch`` makes it read.
BATCH = 256
#: Blocking-read time of the ceilings and of the driver's client: short, so a stop is
#: quick; it costs nothing when busy. printery's is the library's default.
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
    prefetch: int | None
    features: tuple[str, ...] = ()
    partitions: int = 1
    rounds: int = 1


async def run_bench(
    *,
    events: int,
    stages: int,
    processes: int,
    payload_bytes: int,
    redis_url: str | None,
    rate: float | None,
    duration: float | None,
    prefetch: int | None = None,
    ceiling: str = "both",
    features: tuple[str, ...] = (),
    partitions: int = 1,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run the ceiling(s), then printery, and return the §9 document.

    With ``redis_url`` None a private server without persistence is started and stopped
    (so the disk is not measured), and each side's Redis commands per event are counted
    from ``INFO commandstats``; with a URL, only keys under a fresh prefix are used and
    deleted afterwards. ``rate`` switches to the open-loop mode, where ``events`` is
    ``rate * duration``. ``prefetch`` None runs printery with the library's default;
    ``ceiling`` is ``same``, ``minimal`` or ``both``; ``features`` (``limit``, ``budget``) adds the
    ``printery_with`` side; ``partitions`` (CONTRACT §15) splits every stage's stream,
    for printery and the ceilings alike; ``rounds`` runs every side that many times (see
    the module's docstring). On a cluster (``redis+cluster://``) the server
    CPU is every master's own count (``INFO cpu``), also per master.
    Raises :class:`ConfigError` for an impossible option.
    """
    _validate(events, stages, processes, payload_bytes, rate, duration, prefetch, ceiling,
              partitions, rounds)
    if redis_url and partitions < 2 and urlsplit(redis_url).scheme in CLUSTER_SCHEMES:
        raise ConfigError("partitions", partitions, "2 or more on a cluster (one partition's "
                          "keys carry no hash tag; see --partitions)")
    sides = (*CEILINGS[ceiling], "printery",
             *(("printery_without",) if "budget" in features else ()),
             *(("printery_with",) if features else ()))
    run_duration = duration if duration is not None else DEFAULT_DURATION
    if rate is not None:
        events = round(rate * run_duration)
    with tempfile.TemporaryDirectory(prefix="printery-bench-") as tmp:
        plan = _Plan(events, stages, processes, payload_bytes, rate, run_duration,
                     uuid.uuid4().hex[:10], Path(tmp), prefetch, tuple(features), partitions,
                     rounds)
        async with bench_server(redis_url) as server:
            client = connect(server.url, block_ms=BLOCK_MS)
            try:
                measured = []
                for turn in range(rounds):
                    order = sides[turn % len(sides):] + sides[: turn % len(sides)]
                    measured.append({side: await _run_side(side, client, server.url, plan,
                                                           server.pid) for side in order})
            finally:
                await client.aclose()
    return _document(plan, measured, embedded=redis_url is None, ceiling=ceiling)


def _validate(
    events: int, stages: int, processes: int, payload_bytes: int, rate: float | None,
    duration: float | None, prefetch: int | None, ceiling: str, partitions: int = 1,
    rounds: int = 1,
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
    if prefetch is not None and prefetch < 1:
        raise ConfigError("prefetch", prefetch, "at least 1")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError("partitions", partitions, f"1 to {MAX_PARTITIONS}")
    if ceiling not in CEILINGS:
        raise ConfigError("ceiling", ceiling, f"one of {', '.join(CEILINGS)}")
    if rounds < 1:
        raise ConfigError("rounds", rounds, "at least 1")


def _features(side: str, features: tuple[str, ...]) -> tuple[str, ...]:
    """What the pipeline of ``side`` runs with: ``printery_without`` is the handlers of
    ``printery_with`` (reporting a cost when a budget is on) without its limit and budget."""
    if side == "printery_with":
        return features
    return ("cost",) if side == "printery_without" else ()


async def _run_side(
    kind: str, client: aioredis.Redis, url: str, plan: _Plan, server_pid: int | None
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
    commands = _CommandStats(client, enabled=server_pid is not None)
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
        _, polls = await wait_arrivals(client, layout.finals, plan.events,
                                       stall_timeout=STALL_TIMEOUT)
        procs.mark_done()
        server_seconds = server_cpu.seconds()
        by_master = await masters_cpu.seconds()
        # The driver's own commands in the window: its XLEN polls and, in rate mode, the
        # XADD of every offered event (INFO is left out by name).
        calls = await commands.stop(driver={"xlen": polls, "xadd": offered})
        arrivals = await read_arrivals(client, layout.finals, not_before_ms=not_before)
    finally:
        await procs.stop()
        await _delete_prefix(client, layout.prefix)
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


class _CommandStats:
    """Calls per command on our own server over the measured window, from ``INFO
    commandstats`` (unknown for a remote server, which others may be using).

    Commands a script or a ``MULTI`` runs count as themselves, besides the ``EVAL``/
    ``EXEC`` that ran them: the server executes them either way. ``usec`` is the server's
    own time in each command (a script's includes that of the commands it runs).
    """

    def __init__(self, client: aioredis.Redis, *, enabled: bool) -> None:
        self.client = client
        self.enabled = enabled
        self._start: dict[str, tuple[int, float]] = {}

    async def _now(self) -> dict[str, tuple[int, float]]:
        info: Any = await self.client.info("commandstats")
        stats: dict[str, tuple[int, float]] = {}
        for key, value in info.items():
            name = str(key).removeprefix("cmdstat_")
            if isinstance(value, dict) and name != "info":
                stats[name] = (int(value.get("calls", 0)), float(value.get("usec", 0)))
        return stats

    async def start(self) -> None:
        if self.enabled:
            self._start = await self._now()

    async def stop(self, *, driver: dict[str, int]) -> dict[str, tuple[int, float]] | None:
        """Calls and server µs per command since :meth:`start`, less ``driver``'s calls."""
        if not self.enabled:
            return None
        end = await self._now()
        delta: dict[str, tuple[int, float]] = {}
        for name, (calls, usec) in end.items():
            calls0, usec0 = self._start.get(name, (0, 0.0))
            own = max(0, calls - calls0 - driver.get(name, 0))
            if own:
                delta[name] = (own, usec - usec0)
        return delta


async def _delete_prefix(client: aioredis.Redis, prefix: str) -> None:
    """Remove the run's streams and markers, so repeated runs do not fill the server."""
    with contextlib.suppress(redis.RedisError, OSError):
        batch: list[str] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await _unlink(client, batch)
                batch = []
        if batch:
            await _unlink(client, batch)


async def _unlink(client: aioredis.Redis, keys: list[str]) -> None:
    """One UNLINK per key in a pipeline: on a cluster the keys are in many slots."""
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.execute_command("UNLINK", key)  # (a cluster pipeline's unlink() is a coroutine)
        await pipe.execute()


def _ratio(ours: dict[str, Any] | None, ceiling: dict[str, Any] | None, key: str) -> float:
    if ours and ceiling and ceiling.get(key):
        return round(float(ours[key]) / float(ceiling[key]), 3)
    return 0.0


def _figures(results: dict[str, dict[str, Any]], *, rate: bool) -> dict[str, float]:
    """One round's ratios (of p99 too in the ``rate`` mode) and the features' overheads,
    when they ran."""
    same, minimal, ours, without, featured = (results.get(side) for side in SIDES)
    figures = {"ratio": _ratio(ours, same, "events_per_s"),
               "ratio_minimal": _ratio(ours, minimal, "events_per_s")}
    if rate:
        figures["p99_ratio"] = _ratio(ours, same, "p99_ms")
        figures["p99_ratio_minimal"] = _ratio(ours, minimal, "p99_ms")
    if featured is not None:
        figures["with_overhead"] = round(1 - _ratio(featured, without or ours, "events_per_s"), 3)
        if without is not None:
            figures["with_overhead_plain"] = round(1 - _ratio(featured, ours, "events_per_s"), 3)
    return figures


def _median_round(rounds: list[dict[str, dict[str, Any]]], side: str) -> dict[str, Any] | None:
    """``side``'s figures from its median round by throughput (the lower of the two
    middle ones for an even count)."""
    runs = sorted((r[side] for r in rounds if side in r), key=lambda v: v["events_per_s"])
    return runs[(len(runs) - 1) // 2] if runs else None


def _document(
    plan: _Plan, rounds: list[dict[str, dict[str, Any]]], *, embedded: bool, ceiling: str
) -> dict[str, Any]:
    same, minimal, ours, without, featured = (_median_round(rounds, side) for side in SIDES)
    per_round = [_figures(results, rate=plan.rate is not None) for results in rounds]
    figures = {key: round(statistics.median(f[key] for f in per_round), 3)
               for key in per_round[0]}
    settings = (ours or {}).get("settings", {})
    doc: dict[str, Any] = {
        "ceiling": same or {},
        "ceiling_minimal": minimal or {},
        "printery": ours or {},
        "ratio": figures["ratio"],
        "ratio_minimal": figures["ratio_minimal"],
        "events": plan.events,
        "stages": plan.stages,
        "verified": all(r["verified"] for results in rounds for r in results.values()),
        "mode": "backlog" if plan.rate is None else "rate",
        "processes": plan.processes,
        "partitions": plan.partitions,
        "payload_bytes": plan.payload_bytes,
        "server": "embedded" if embedded else "url",
        "client": f"redis-py {redis.__version__}",
        "ceilings": ceiling,
        "batch": BATCH,
        "prefetch": settings.get("prefetch", plan.prefetch),
        "prefetch_default": plan.prefetch is None,
        "rounds": plan.rounds,
    }
    if plan.rounds > 1:
        doc["per_round"] = [{"order": list(results), **f, "events_per_s": {
                                side: values["events_per_s"] for side, values in results.items()}}
                            for results, f in zip(rounds, per_round, strict=True)]
    if featured is not None:
        doc["printery_with"] = featured
        doc["with"] = list(plan.features)
        doc["with_overhead"] = figures["with_overhead"]
        if without is not None:
            doc["printery_without"] = without
            doc["with_overhead_plain"] = figures["with_overhead_plain"]
    if plan.rate is not None:
        doc["rate"] = plan.rate
        doc["duration"] = plan.duration
        doc["p99_ratio"] = figures["p99_ratio"]
        doc["p99_ratio_minimal"] = figures["p99_ratio_minimal"]
    return doc
