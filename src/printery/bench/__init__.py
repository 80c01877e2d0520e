"""``printery bench`` (docs/reference.md, Bench): printery's pipeline against hand-written
relays, in one run on one server, so their ratios hold however noisy the machine.

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

import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from printery.base.errors import ConfigError
from printery.bench.document import document
from printery.bench.plan import BLOCK_MS, CEILINGS, DEFAULT_DURATION, SIDES, Plan, validate
from printery.bench.report import format_table
from printery.bench.server import bench_server
from printery.bench.side import run_side
from printery.transport.connection import CLUSTER_SCHEMES, connect

__all__ = ["SIDES", "format_table", "run_bench"]


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
    """Run the ceiling(s), then printery, and return the bench document
    (docs/reference.md, Bench).

    With ``redis_url`` None a private server without persistence is started and stopped
    (so the disk is not measured), and each side's Redis commands per event are counted
    from ``INFO commandstats``; with a URL, only keys under a fresh prefix are used and
    deleted afterwards. ``rate`` switches to the open-loop mode, where ``events`` is
    ``rate * duration``. ``prefetch`` None runs printery with the library's default;
    ``ceiling`` is ``same``, ``minimal`` or ``both``; ``features`` (``limit``, ``budget``) adds the
    ``printery_with`` side; ``partitions`` (docs/reference.md, Partitions) splits every
    stage's stream, for printery and the ceilings alike; ``rounds`` runs every side that
    many times (see the module's docstring). On a cluster (``redis+cluster://``) the
    server CPU is every master's own count (``INFO cpu``), also per master. Raises
    :class:`ConfigError` for an impossible option.
    """
    validate(events, stages, processes, payload_bytes, rate, duration, prefetch, ceiling,
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
        plan = Plan(events, stages, processes, payload_bytes, rate, run_duration,
                    uuid.uuid4().hex[:10], Path(tmp), prefetch, tuple(features), partitions,
                    rounds)
        async with bench_server(redis_url) as server:
            client = connect(server.url, block_ms=BLOCK_MS)
            try:
                measured = []
                for turn in range(rounds):
                    order = sides[turn % len(sides):] + sides[: turn % len(sides)]
                    measured.append({side: await run_side(side, client, server.url, plan,
                                                          server.pid) for side in order})
            finally:
                await client.aclose()
    return document(plan, measured, embedded=redis_url is None, ceiling=ceiling)
