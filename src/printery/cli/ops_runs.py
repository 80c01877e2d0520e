"""``printery runs``: a page of runs, newest first, from the run index (docs/reference.md,
Commands), as ``GET /v1/runs`` lists them (:mod:`printery.runs.listing`). A bad
``--status``, ``--since`` or ``--limit`` is a usage error (exit 2)."""

from __future__ import annotations

import click

from printery.base.errors import InvalidInput, UnknownRun
from printery.cli.ops_common import get_ctx, json_option, print_json, table
from printery.runs.cancel import Cancelled, cancel_run
from printery.runs.listing import DEFAULT_LIMIT, MAX_LIMIT, RunSummary, list_runs, listing_of
from printery.runs.reader import RunReader
from printery.store import Redis


@click.command()
@click.option("--status", default=None, metavar="S", help="only the runs of status S")
@click.option("--since", default=None, metavar="DURATION",
              help="only the runs started (with --status: given it) in the last 10m, 2h, 1d ...")
@click.option("--limit", default=DEFAULT_LIMIT, metavar="N",
              type=click.IntRange(1, MAX_LIMIT), show_default=True, help="at most N runs")
@json_option
def runs(status: str | None, since: str | None, limit: int, as_json: bool) -> None:
    """Runs newest first: id, status, start, end and cost."""
    try:
        listing = listing_of(status, since, limit)
    except InvalidInput as exc:
        reason = exc.reasons[0]
        raise click.BadParameter(reason.message, param_hint=f"--{reason.field}") from None
    ops = get_ctx()

    async def body(client: Redis) -> list[RunSummary]:
        page, _ = await list_runs(RunReader(client, ops.keys, ops.pipeline), listing)
        return page

    page = ops.run(body)
    if as_json:
        print_json([run.as_dict() for run in page])
        return
    rows = []
    for run in page:
        shown = run.as_dict()
        cost = " ".join(f"{unit}={amount:g}" for unit, amount in sorted(run.cost.items()))
        rows.append((run.run_id, run.status, shown["started"], shown["ended"], cost))
    click.echo(table(rows, [ops.pipeline.correlation_field, "status", "started", "ended", "cost"]))


@click.command()
@click.argument("run_id")
@click.option("--reason", default="", metavar="TEXT", help="why (on the run:cancelled entry)")
@click.option("--by", default=None, metavar="NAME", help="who cancels")
@json_option
def cancel(run_id: str, reason: str, by: str | None, as_json: bool) -> None:
    """Cancel a run: exit 0 when this cancelled it, 1 when it had ended already (its
    status printed) or is unknown."""
    ops = get_ctx()

    async def body(client: Redis) -> Cancelled | None:
        try:
            return await cancel_run(client, ops.keys, ops.pipeline, run_id, reason=reason,
                                    by=by)
        except UnknownRun:
            return None

    done = ops.run(body)
    if done is None:
        if as_json:
            print_json({"run_id": run_id, "cancelled": False, "error": "unknown_run"})
        else:
            click.echo(f"{run_id}: unknown run", err=True)
        raise SystemExit(1)
    if as_json:
        print_json(done.as_dict())
    else:
        click.echo(f"{run_id}: cancelled" if done.cancelled
                   else f"{run_id}: had ended already ({done.status})")
    if not done.cancelled:
        raise SystemExit(1)
