"""``printery dlq``: inspect, replay and purge dead letters (docs/reference.md, Failures);
what each does is :mod:`printery.inbox.dead_letters`, shared with the HTTP API."""

from __future__ import annotations

from typing import Any

import click

from printery.cli.ops_common import (
    fail,
    get_ctx,
    json_option,
    print_json,
    show_entry,
    table,
)
from printery.inbox.dead_letters import (
    dead_letter,
    dead_letter_ids,
    dead_letters,
    purge,
    replay_dead_letter,
)
from printery.store import Redis
from printery.wire.fields import (
    DELIVERIES,
    ERROR,
    REASON_CODE,
    SOURCE_STREAM,
    WORKER,
)


@click.group()
def dlq() -> None:
    """Dead-lettered entries: list, show, replay, purge."""


@dlq.command("list")
@click.option("--count", type=click.IntRange(1, 1_000_000), default=1000, show_default=True)
@json_option
def dlq_list(count: int, as_json: bool) -> None:
    """List dead letters, oldest first: with --json every field of each (the original
    entry's, ``data`` included, and what dead-lettering added)."""
    ops = get_ctx()
    field = ops.pipeline.correlation_field

    rows = ops.run(lambda client: dead_letters(client, ops.keys, field, count=count))
    if as_json:
        print_json(rows)
        return
    columns = [WORKER, REASON_CODE, field, DELIVERIES, SOURCE_STREAM]
    click.echo(table(
        [(r["id"], *(r.get(c, "") for c in columns), str(r.get(ERROR, ""))[:60]) for r in rows],
        ["id", *columns, ERROR],
    ))


@dlq.command("show")
@click.argument("entry_id", metavar="ID")
@json_option
def dlq_show(entry_id: str, as_json: bool) -> None:
    """Every field of one dead letter: JSON with --json, else one per line with ``data``
    as indented JSON and the traceback as it was printed."""
    ops = get_ctx()
    shown = ops.run(lambda client: dead_letter(client, ops.keys, ops.pipeline.correlation_field,
                                               entry_id))
    if shown is None:
        fail(f"no dlq entry {entry_id}")
    if as_json:
        print_json(shown)
        return
    click.echo(show_entry(shown))


@dlq.command("replay")
@click.argument("entry_ids", metavar="ID...", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="replay every dead letter")
@json_option
def dlq_replay(entry_ids: tuple[str, ...], replay_all: bool, as_json: bool) -> None:
    """Re-add entries to their source streams (attempt+1, replayed_from) and remove them
    from the dlq, each in one transaction."""
    if bool(entry_ids) == replay_all:
        raise click.UsageError("give dlq entry IDs or --all (not both)")
    ops = get_ctx()

    async def body(client: Redis) -> list[dict[str, Any]]:
        ids = list(entry_ids) or await dead_letter_ids(client, ops.keys)
        field = ops.pipeline.correlation_field
        return [await replay_dead_letter(client, ops.keys, entry_id, field) for entry_id in ids]

    results = ops.run(body)
    _report(results, as_json, ["id", "replayed", "source_stream", "new_id", "error"])


@dlq.command("purge")
@click.argument("entry_ids", metavar="ID...", nargs=-1)
@click.option("--all", "purge_all", is_flag=True, help="delete every dead letter (needs --yes)")
@click.option("--yes", is_flag=True, help="confirm --all")
@json_option
def dlq_purge(entry_ids: tuple[str, ...], purge_all: bool, yes: bool, as_json: bool) -> None:
    """Delete dead letters for good."""
    if bool(entry_ids) == purge_all:
        raise click.UsageError("give dlq entry IDs or --all --yes (not both)")
    if purge_all and not yes:
        raise click.UsageError("--all deletes every dead letter: confirm with --yes")
    ops = get_ctx()

    async def body(client: Redis) -> list[dict[str, Any]]:
        ids = list(entry_ids)
        if purge_all:
            ids = await dead_letter_ids(client, ops.keys)
        return [await purge(client, ops.keys, entry_id) for entry_id in ids]

    results = ops.run(body)
    _report(results, as_json, ["id", "purged", "error"])


def _report(results: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    """Print per-entry results; exit 1 when any entry failed."""
    if as_json:
        print_json(results)
    else:
        click.echo(table([[r.get(c, "") for c in columns] for r in results], columns))
    if any(r.get("error") for r in results):
        raise SystemExit(1)
