"""``printery bench`` (docs/reference.md, Bench): the option surface; the benchmark itself
lives in ``printery.bench`` and is imported only when the command runs (it is heavy, and
the tool must work in builds without it)."""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any

import click

from printery.base.errors import ConfigError
from printery.cli.ops_common import fail, print_json


@click.command()
@click.option("--events", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--stages", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--payload-bytes", type=click.IntRange(min=0), default=256, show_default=True)
@click.option("--redis-url", "bench_url", default=None, metavar="URL",
              help="server to measure on (default: the global --redis-url, else a private "
                   "embedded server without persistence)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="open-loop mode: offer this many events/s for --duration seconds and "
                   "report latency at that load (default: backlog mode, --events as fast "
                   "as possible)")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seconds to offer --rate for (only with --rate; default 20)")
@click.option("--prefetch", type=click.IntRange(min=1), default=None,
              help="printery's ConsumerSettings.prefetch (default: the library's default, "
                   "as printery-workers runs)")
@click.option("--ceiling", "ceiling", type=click.Choice(["same", "minimal", "both"]),
              default="both", show_default=True,
              help="same: a relay of printery's own envelopes; minimal: a relay of "
                   "one-field entries, as an outside harness's; both: each, one ratio each")
@click.option("--submit", "submit_mode", is_flag=True,
              help="measure getting work in instead: Client.submit (100 in flight) and "
                   "SyncClient.submit against pipelined raw XADD (--events, --payload-bytes)")
@click.option("--with-limit", "with_limit", is_flag=True,
              help="run printery again with a Limit on every stage and report what it costs")
@click.option("--with-budget", "with_budget", is_flag=True,
              help="run printery again with a Budget on the run and every stage (never "
                   "reached) and report what it costs (with --with-limit: both)")
@click.option("--console", "console_mode", is_flag=True,
              help="measure the web console instead: seed --runs runs, then time GET of "
                   "the overview, the runs list and a run's page (median, p95)")
@click.option("--runs", "console_runs", type=click.IntRange(min=1), default=10_000,
              show_default=True, help="runs seeded for --console")
@click.option("--partitions", "bench_partitions", type=click.IntRange(min=1), default=None,
              help="partitions of every stage's stream (docs/reference.md, Partitions; "
                   "default: the global --partitions, else 1)")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="run every side this many times, in rotating order, and report the "
                   "median of the rounds' ratios and overheads (a noisy machine needs 5)")
@click.option("--map", "map_items", type=click.IntRange(min=1), default=None, metavar="N",
              help="measure a Map instead: N items through a Map's each step against the "
                   "same N items as plain entries through two steps (--payload-bytes, "
                   "--rounds)")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@click.pass_context
def bench(
    ctx: click.Context, events: int, stages: int, processes: int, payload_bytes: int,
    bench_url: str | None, rate: float | None, duration: float | None, prefetch: int | None,
    ceiling: str, submit_mode: bool, with_limit: bool, with_budget: bool, console_mode: bool,
    console_runs: int, bench_partitions: int | None, rounds: int, map_items: int | None,
    as_json: bool,
) -> None:
    """Throughput benchmark: hand-written relay ceilings vs printery's pipeline (with the
    library's default settings unless --prefetch is given); with --submit, the client;
    with --console, the web console (--events: GETs per page, default 200)."""
    if rate is None and duration is not None:
        raise click.UsageError("--duration needs --rate: a backlog run is sized by --events")
    if rate is not None and _given(ctx, "events"):
        raise click.UsageError(
            "--events and --rate exclude each other: a rate run offers rate x duration events")
    try:
        from printery.bench import format_table, run_bench
    except ImportError as exc:
        fail(f"bench is not available in this build ({exc})")
    parent = ctx.parent.params if ctx.parent is not None else {}
    url = bench_url or parent.get("redis_url") or os.environ.get("REDIS_URL") or None
    if console_mode:
        from printery.bench.console import format_console, run_console_bench

        requests = events if _given(ctx, "events") else 200
        measured = asyncio.run(run_console_bench(runs=console_runs, requests=requests,
                                                 redis_url=url))
        print_json(measured) if as_json else click.echo(format_console(measured))
        return
    if map_items is not None:
        from printery.bench.map_cost import format_map, run_map_bench
        from printery.observe.logging import configure_logging

        configure_logging("warn")  # its workers run here: their lines to stderr, not stdout
        measured = asyncio.run(run_map_bench(items=map_items, payload_bytes=payload_bytes,
                                             redis_url=url, rounds=rounds))
        print_json(measured) if as_json else click.echo(format_map(measured))
        if not measured["verified"]:
            raise SystemExit(1)
        return
    if submit_mode:
        if rate is not None:
            raise click.UsageError("--submit measures a backlog of --events, not a --rate")
        from printery.bench.submit import format_submit, run_submit_bench

        measured = asyncio.run(run_submit_bench(events=events, payload_bytes=payload_bytes,
                                                redis_url=url))
        print_json(measured) if as_json else click.echo(format_submit(measured))
        return
    kwargs: dict[str, Any] = {"events": events, "stages": stages, "processes": processes,
                              "payload_bytes": payload_bytes, "redis_url": url,
                              "rate": rate, "duration": duration, "prefetch": prefetch,
                              "ceiling": ceiling, "rounds": rounds,
                              "partitions": bench_partitions or int(parent.get("partitions") or 1)}
    features = tuple(name for name, given in (("limit", with_limit), ("budget", with_budget))
                     if given)
    if features:
        kwargs["features"] = features
    try:
        outcome: Any = run_bench(**kwargs)
        result: dict[str, Any] = asyncio.run(outcome) if inspect.iscoroutine(outcome) else outcome
    except ConfigError as exc:  # what the options cannot express (rate x duration < 1)
        raise click.UsageError(str(exc)) from exc
    if as_json:
        print_json(result)
    else:
        click.echo(format_table(result))
    if not result.get("verified", True):
        raise SystemExit(1)


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the user set option ``name`` (rather than it taking its default)."""
    source = ctx.get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)
