"""``printery status``, ``streams`` and ``pipeline show``: what runs and what waits."""

from __future__ import annotations

from typing import Any

import click

from printery.cli.ops_common import get_ctx, json_option, print_json, table
from printery.observe.redact import redact_text
from printery.pipeline.render import to_mermaid, to_text
from printery.service.registry import list_processes
from printery.store.overview import StreamFigures, read_overview
from printery.wire.keys import DLQ, REVIEW, REVIEW_DECIDED


@click.command()
@json_option
def status(as_json: bool) -> None:
    """Every running printery-workers process (any host) with its workers.

    Read from the process registry's heartbeat keys: a process that died disappears when
    its key expires.
    """
    ops = get_ctx()
    processes = ops.run(lambda client: list_processes(client, ops.keys))
    if as_json:
        print_json(processes)
        return
    if not processes:
        click.echo("no running printery-workers processes")
        return
    rows: list[tuple[object, ...]] = []
    for proc in processes:
        raw_info, raw_workers = proc.get("process"), proc.get("workers")
        info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else proc
        workers: dict[str, Any] = raw_workers if isinstance(raw_workers, dict) else {}
        where = f"{info.get('host', '?')}:{info.get('pid', '?')}"
        if not workers:
            rows.append((proc.get("process_id"), where, info.get("started_at"), "-", "-", "", ""))
        for name, w in workers.items():
            fields: dict[str, Any] = w if isinstance(w, dict) else {"state": w}
            rows.append((proc.get("process_id"), where, info.get("started_at"), name,
                         fields.get("state"), fields.get("processed"), fields.get("restarts")))
    click.echo(table(rows, ["process", "host:pid", "started_at", "worker", "state",
                            "processed", "restarts"]))


@click.command()
@json_option
def streams(as_json: bool) -> None:
    """Each stream of the pipeline plus dlq and review: its length, and per consumer group
    its consumers, pending (delivered, not acknowledged), undelivered (not given to any
    consumer yet) and lag_s (seconds the oldest entry it owes has waited); with several
    partitions, each partition's stream."""
    ops = get_ctx()
    event_types = [*ops.pipeline.event_types(), DLQ, REVIEW, REVIEW_DECIDED]
    # ops.keys: the recorded layout, read once connected.
    overview = ops.run(lambda client: read_overview(client, ops.keys, event_types))
    rows = [_stream_row(figures) for figures in overview.streams]
    if as_json:
        print_json(rows)
        return
    lines = []
    for r in rows:
        name = r["type"] if "partition" not in r else f"{r['type']}@p{r['partition']}"
        if not r["groups"]:
            lines.append((name, r["length"], "-", "", "", "", ""))
        for g in r["groups"]:
            lines.append((name, r["length"], g["name"], g["consumers"], g["pending"],
                          "?" if g["undelivered"] is None else g["undelivered"],
                          f"{g['lag_s']:.1f}"))
    click.echo(table(lines, ["stream", "length", "group", "consumers", "pending", "undelivered",
                             "lag_s"]))


def _stream_row(figures: StreamFigures) -> dict[str, Any]:
    """One stream (of one partition) as ``streams`` shows it; ``partition`` only when
    there are several."""
    row: dict[str, Any] = {"stream": figures.stream, "type": figures.event_type}
    if figures.partition is not None:
        row["partition"] = figures.partition
    return {**row, "length": figures.length,
            "groups": [{"name": g.name, "consumers": g.consumers, "pending": g.pending,
                        "undelivered": g.undelivered, "lag_s": round(g.lag_s, 3),
                        "last_delivered_id": g.last_delivered_id} for g in figures.groups]}


@click.group("pipeline")
def pipeline_group() -> None:
    """The pipeline's DAG."""


@pipeline_group.command("show")
@click.option("--mermaid", is_flag=True, help="a Mermaid flowchart instead of text")
@json_option
def pipeline_show(mermaid: bool, as_json: bool) -> None:
    """Show the pipeline loaded from --app/PRINTERY_APP (needs no server)."""
    ops = get_ctx()
    pipeline = ops.pipeline
    # What a service started with the same settings would run: the config file counts.
    effective = {name: ops.settings.concurrency(name, step.concurrency)
                 for name, step in pipeline.steps.items()}
    if as_json:
        doc = pipeline.describe(effective)
        if mermaid:
            doc["mermaid"] = to_mermaid(pipeline)
        print_json(doc)
    else:
        click.echo(redact_text(to_mermaid(pipeline) if mermaid else to_text(pipeline, effective)))
