"""``printery dlq``: inspect, replay and purge dead letters (CONTRACT §4).

Replay moves an entry back atomically: WATCH the ``dlq`` stream, check the entry is still
there, then MULTI: XADD to its source stream + XDEL from ``dlq``, EXEC. Two operators
replaying the same entry at once cannot both succeed (the loser's EXEC aborts and its
retry finds the entry gone), and a crash between the two writes is impossible.
"""

from __future__ import annotations

from typing import Any

import click
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from printery.cli.ops_common import (
    WATCH_RETRIES,
    Failure,
    fail,
    get_ctx,
    get_entry,
    json_option,
    print_json,
    show_entry,
    table,
)
from printery.envelope import correlation_of
from printery.fields import (
    DELIVERIES,
    DLQ_FIELDS,
    ERROR,
    REASON_CODE,
    REPLAYED_FROM,
    SOURCE_STREAM,
    WORKER,
)
from printery.history import decode_fields


@click.group()
def dlq() -> None:
    """Dead-lettered entries: list, show, replay, purge."""


@dlq.command("list")
@click.option("--count", type=click.IntRange(min=1), default=1000, show_default=True)
@json_option
def dlq_list(count: int, as_json: bool) -> None:
    """List dead letters, oldest first: with --json every field of each (the original
    entry's, ``data`` included, and what dead-lettering added)."""
    ops = get_ctx()
    field = ops.pipeline.correlation_field

    async def body(client: aioredis.Redis) -> list[dict[str, Any]]:
        entries = await client.xrange(ops.keys.dlq, count=count)
        return [_row(entry_id, fields, field) for entry_id, fields in entries]

    rows = ops.run(body)
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
    fields = ops.run(lambda client: get_entry(client, ops.keys.dlq, entry_id))
    if fields is None:
        fail(f"no dlq entry {entry_id}")
    shown = _row(entry_id, fields, ops.pipeline.correlation_field)
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

    async def body(client: aioredis.Redis) -> list[dict[str, Any]]:
        ids = list(entry_ids) or [e for e, _ in await client.xrange(ops.keys.dlq)]
        return [await replay_entry(client, ops.keys.dlq, entry_id) for entry_id in ids]

    results = ops.run(body)
    _report(results, as_json, ["id", "replayed", "source_stream", "new_id", "error"])


async def replay_entry(client: aioredis.Redis, dlq_key: str, entry_id: str) -> dict[str, Any]:
    """Move one dlq entry back to its source stream; a result dict, never raises for a
    missing entry (``replayed`` false with an ``error``)."""
    for _ in range(WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(dlq_key)
                fields = await get_entry(pipe, dlq_key, entry_id)
                if fields is None:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return {"id": entry_id, "replayed": False, "error": "no such dlq entry"}
                source = fields.get(SOURCE_STREAM, "")
                if not source:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return {"id": entry_id, "replayed": False,
                            "error": "entry has no source_stream"}
                # Everything but what dead-lettering added is the original entry.
                original = {k: v for k, v in fields.items() if k not in DLQ_FIELDS}
                try:
                    attempt = int(original.get("attempt") or 1)
                except ValueError:
                    attempt = 1
                original["attempt"] = str(attempt + 1)
                original[REPLAYED_FROM] = entry_id
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.xadd(source, original)  # type: ignore[arg-type]
                pipe.xdel(dlq_key, entry_id)
                new_id, _deleted = await pipe.execute()
            except WatchError:
                continue
        return {"id": entry_id, "replayed": True, "source_stream": source, "new_id": new_id}
    raise Failure(f"dlq entry {entry_id}: too much concurrent change, try again")


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

    async def body(client: aioredis.Redis) -> list[dict[str, Any]]:
        ids = list(entry_ids)
        if purge_all:
            ids = [e for e, _ in await client.xrange(ops.keys.dlq)]
        results = []
        for entry_id in ids:
            try:
                deleted = await client.xdel(ops.keys.dlq, entry_id)
            except Exception:  # a malformed id is an unknown id
                deleted = 0
            results.append({"id": entry_id, "purged": bool(deleted),
                            "error": "" if deleted else "no such dlq entry"})
        return results

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


def _row(entry_id: str, fields: dict[str, str], correlation_field: str) -> dict[str, Any]:
    """A dead letter as the operator sees it: every field decoded, and the run's id under
    the pipeline's correlation field even when the producer put it only in ``data``."""
    row = {"id": entry_id, **decode_fields(fields)}
    row[correlation_field] = correlation_of(fields, correlation_field) or ""
    return row
