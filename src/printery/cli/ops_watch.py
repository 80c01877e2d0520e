"""``printery watch RUN_ID``: a run's entries as they are written, until its outcome
(docs/reference.md, Commands; Runs). Exit 0 when the run's status is one the pipeline
declares a success (``Pipeline(success=...)``, default ``succeeded``), 1 for any other
status, 3 at ``--timeout``."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from printery.base import _json
from printery.cli.ops_common import EXIT_TIMEOUT, Failure, get_ctx, json_option
from printery.runs.reader import RunReader, run_status
from printery.store import Redis


@click.command()
@click.argument("run_id")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="S", help="give up after S seconds (exit 3) [default: wait]")
@json_option
def watch(run_id: str, timeout: float | None, as_json: bool) -> None:
    """Follow one run live (a deployment id, or any pipeline's correlation id)."""
    ops = get_ctx()
    field = ops.pipeline.correlation_field

    async def body(client: Redis) -> str:
        reader = RunReader(client, ops.keys, ops.pipeline)
        deadline = None if timeout is None else time.monotonic() + timeout
        first: int | None = None
        outcome: dict[str, Any] | None = None
        if not as_json:
            click.echo(f"{'id':<17} {'at':>9}  {'stream':<24} {'producer':<20} detail")
        try:
            async for entry in reader.follow(run_id, deadline=deadline):
                ms = int(entry["id"].split("-")[0])
                first = ms if first is None else first
                if as_json:
                    click.echo(_json.dumps(entry))
                else:
                    click.echo(f"{entry['id']:<17} {'+' + str(ms - first) + 'ms':>9}  "
                               f"{entry['stream']:<24} {entry.get('producer', '')!s:<20} "
                               f"{_detail(entry)}")
                sys.stdout.flush()
                if reader.is_outcome(entry):
                    outcome = entry
        except TimeoutError:
            raise Failure(f"run {field} {run_id!r} did not end within {timeout:g}s",
                          EXIT_TIMEOUT) from None
        return run_status(outcome)

    status = ops.run(body)
    if not as_json:
        click.echo(f"{field} {run_id}: {status}")
    if status not in ops.pipeline.success:
        sys.exit(1)


def _detail(entry: dict[str, Any]) -> str:
    data = entry.get("data")
    parts = []
    if isinstance(data, dict) and isinstance(data.get("status"), str):
        parts.append(data["status"])
    for name in ("kind", "reason_code", "decision"):
        if entry.get(name):
            parts.append(f"{name}={entry[name]}")
    if entry.get("duration_ms"):
        parts.append(f"{entry['duration_ms']}ms")
    return " ".join(parts)[:80]
