"""``printery trace``, ``replay`` and ``cost``: one run's history, re-running it, and
what it spent.

``trace`` scans every stream of the pipeline plus ``dlq``, ``review`` and
``review:decided`` (:func:`printery.runs.history.run_entries`): O(total stream length), fine
for operator use on retained history, not for a hot path.
"""

from __future__ import annotations

from typing import Any

import click

from printery.base._util import amount, amounts, stream_id_ms
from printery.base.errors import InvalidReplayId
from printery.cli.ops_common import (
    Failure,
    OpsContext,
    fail,
    get_ctx,
    json_option,
    print_json,
    table,
)
from printery.runs.cost import budget_report, cost_summary, parse_duration
from printery.runs.reader import RunReader
from printery.runs.replay import ReplayError
from printery.runs.replay import replay as replay_run
from printery.store import Redis
from printery.wire.fields import (
    DECISION,
    ITEM,
    ITEM_FAILED,
    ITEMS,
    KIND,
    REASON,
    REASON_CODE,
    WORKER,
)
from printery.wire.keys import DLQ, REVIEW


@click.command()
@click.argument("deployment_id")
@json_option
def trace(deployment_id: str, as_json: bool) -> None:
    """Every entry of one deployment across all streams, in time order, with durations.

    Entries an external producer wrote with only ``data`` belong to the run whose id
    their ``data`` carries (docs/reference.md, Streams and entries)."""
    ops = get_ctx()
    field = ops.pipeline.correlation_field
    entries = ops.run(lambda client: run_entries(client, ops, deployment_id))
    if not entries:
        fail(f"no entries of {field} {deployment_id!r}")
    first = stream_id_ms(entries[0]["id"])
    previous = first
    for entry in entries:
        ms = stream_id_ms(entry["id"])
        entry["at_ms"] = ms - first
        entry["since_previous_ms"] = ms - previous
        previous = ms
    if as_json:
        print_json(entries)
        return
    rows = [(e["id"], f"+{e['at_ms']}ms", f"+{e['since_previous_ms']}ms", e["stream"],
             _producer(e), e.get("duration_ms", ""), _short(e.get("cost")),
             e.get("replay_of", ""), _outcome(e)) for e in entries]
    click.echo(table(rows, ["id", "at", "step gap", "stream", "producer", "duration_ms",
                            "cost", "replay_of", "detail"]))


def _short(value: object) -> str:
    if isinstance(value, dict):
        return amounts(value)
    return "" if value is None else str(value)


def _producer(entry: dict[str, Any]) -> str:
    """Who wrote the entry: for a dead letter, the worker that dead-lettered it (its
    ``producer`` is the failed entry's, copied with the rest of it)."""
    if entry["stream"] == DLQ:
        return str(entry.get(WORKER) or "")
    return str(entry.get("producer", ""))


def _outcome(entry: dict[str, Any]) -> str:
    """A few words about an entry: what it is when its stream does not say (a loop's
    attempt or verdict, and what the verdict leads to), status, reason, decision, error."""
    data = entry.get("data")
    parts = []
    dead = entry["stream"] == DLQ
    if dead:  # said as what it is, not as a stream named by who wrote the failed entry
        by = f" by {entry[WORKER]}" if entry.get(WORKER) else ""
        parts.append(f"dead-lettered{by}: {entry.get(REASON_CODE) or 'no reason code'}")
    kind = entry.get("type")
    if kind and kind != entry["stream"] and entry["stream"] != DLQ:
        parts.append(str(kind))
        if isinstance(data, dict) and "next" in data:
            parts.append(f"#{data.get('attempt')} {data['next']}")
    if entry.get(ITEM) is not None and entry.get(ITEMS):  # a Map item's (reference: fan-out)
        parts.append(f"item {entry[ITEM]}/{entry[ITEMS]}")
    if isinstance(data, dict) and "status" in data:
        parts.append(str(data["status"]))
    for name in (ITEM_FAILED, KIND, DECISION, REASON_CODE, REASON, "channel"):
        if entry.get(name) and not (dead and name == REASON_CODE):
            parts.append(f"{name}={entry[name]}")
    if isinstance(data, dict) and data.get("channel") and entry["stream"] != REVIEW:
        parts.append(str(data["channel"]))
    return " ".join(parts)[:80]


@click.command()
@click.argument("deployment_id")
@click.option("--from", "from_step", default=None, metavar="STEP",
              help="the step to run again from (default: the ingress)")
@click.option("--as", "new_id", default=None, metavar="NEW_ID",
              help="the new deployment id (default: <id>-r<n>, first free n)")
@json_option
def replay(deployment_id: str, from_step: str | None, new_id: str | None, as_json: bool) -> None:
    """Run a deployment again from a step under a new id (replay_of = the original)."""
    ops = get_ctx()
    pipeline = ops.pipeline

    async def body(client: Redis) -> dict[str, Any]:
        try:
            result = await replay_run(client, ops.keys, pipeline, deployment_id, from_step,
                                      new_id, producer="printery-cli")
        except InvalidReplayId as exc:
            raise click.UsageError(str(exc)) from None
        except ReplayError as exc:
            raise Failure(str(exc)) from None
        return result.as_dict()

    result = ops.run(body)
    if as_json:
        print_json({pipeline.correlation_field: result["new_id"], **result})
    else:
        click.echo(result["new_id"])


@click.command()
@click.argument("deployment_id", required=False)
@click.option("--since", default=None, metavar="DURATION", help="only the last 10m, 2h, 1d ...")
@json_option
def cost(deployment_id: str | None, since: str | None, as_json: bool) -> None:
    """Handler time and reported cost, summed per step and unit."""
    try:
        since_seconds = parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    ops = get_ctx()

    async def body(client: Redis) -> dict[str, Any]:
        summary = await cost_summary(client, ops.keys, ops.pipeline, deployment_id,
                                     since_seconds)
        # No step's figures for that id: an unknown id is a failure, as for `trace`.
        if deployment_id is not None and not summary["steps"] and not await run_entries(
                client, ops, deployment_id):
            raise Failure(f"no entries of {ops.pipeline.correlation_field} {deployment_id!r}")
        if deployment_id is not None:
            budget, source = await budget_report(client, ops.keys, ops.pipeline, deployment_id)
            if budget is not None:
                summary["budget"], summary["budget_limits"] = budget, source
        return summary

    summary = ops.run(body)
    if as_json:
        print_json(summary)
        return
    units = sorted({u for s in summary["steps"].values() for u in s["cost"]})
    rows = [(name, s["calls"], s["duration_ms"], *(amount(s["cost"].get(u, 0)) for u in units))
            for name, s in [*summary["steps"].items(), ("total", summary["total"])]]
    click.echo(table(rows, ["step", "calls", "duration_ms", *units]))
    if summary.get("budget"):
        click.echo("")
        click.echo(table([(b["step"] or "(run)", b["unit"], amount(b["spent"]),
                           amount(b["reserved"]), amount(b["limit"]), amount(b["soft"]), b["status"])
                          for b in summary["budget"]],
                         ["budget", "unit", "spent", "reserved", "limit", "warn_at", "status"]))
        if summary.get("budget_limits") == "app":
            click.echo("(limits from this command's import of the app: no worker has recorded "
                       "the limits it enforces)")


async def run_entries(client: Redis, ops: OpsContext, run_id: str) -> list[dict[str, Any]]:
    """Every entry of the run so far, as ``trace`` shows them (:class:`RunReader`)."""
    found, _ = await RunReader(client, ops.keys, ops.pipeline).history(run_id)
    return found
