"""``printery backfill STEP``: hand a step the older entries it was never given
(:mod:`printery.runs.backfill`; docs/reference.md, Commands)."""

from __future__ import annotations

import time

import click

from printery.cli.ops_common import get_ctx, json_option, print_json
from printery.runs.backfill import BackfillResult
from printery.runs.backfill import backfill as backfill_step
from printery.runs.cost import parse_duration
from printery.store import Redis


@click.command()
@click.argument("step")
@click.option("--since", default=None, metavar="DURATION",
              help="only entries of the last 10m, 2h, 1d ... (default: all retained)")
@json_option
def backfill(step: str, since: str | None, as_json: bool) -> None:
    """Hand STEP the retained entries of its streams it was never given (a step added,
    or renamed without renamed_from, after the pipeline first ran); prints the count."""
    try:
        since_ms = (int((time.time() - parse_duration(since)) * 1000)
                    if since is not None else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    ops = get_ctx()
    if step not in ops.pipeline.steps:
        raise click.BadParameter(f"unknown step {step!r}; steps: "
                                 f"{', '.join(ops.pipeline.steps)}", param_hint="STEP")

    async def body(client: Redis) -> BackfillResult:
        return await backfill_step(client, ops.keys, ops.pipeline, step, since_ms)

    result = ops.run(body)
    if as_json:
        print_json(result.as_dict())
    else:
        click.echo(f"{result.count} entries handed to {step}")
