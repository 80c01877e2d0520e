"""``printery pending``: entries delivered and not acknowledged, and dead-lettering one by
hand (reference: failures). What is pending is read from the server (:mod:`printery.inbox.pending`),
so both work while no worker runs."""

from __future__ import annotations

from typing import Any

import click

from printery.cli.ops_common import (
    EXIT_USAGE,
    Failure,
    OpsContext,
    fail,
    get_ctx,
    json_option,
    print_json,
    table,
)
from printery.inbox.pending import (
    OPERATOR,
    PendingEntry,
    dead_letter_pending,
    find_pending,
    pending_entries,
)
from printery.store import Redis

worker_option = click.option(
    "--worker", "worker", metavar="W", default=None,
    help="only this worker's group (a worker name or an alias, as for printery-workers)")


def resolve_worker(ops: OpsContext, given: str | None) -> str | None:
    """The worker (consumer group) ``given`` names, aliases resolved; exit 2 naming the
    pipeline's workers when it names none."""
    if given is None:
        return None
    names = list(ops.pipeline.steps)
    name = given.strip().lower()
    if name not in names:
        name = ops.settings.app_config.worker_aliases.get(name, name)
    if name not in names:
        fail(f"invalid --worker: {given!r} (one of: {', '.join(names)})", EXIT_USAGE)
    return name


def _idle(ms: int) -> str:
    """An idle time for reading: ``850ms``, ``12.3s``, ``4m05s``, ``2h03m``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _where(entry: PendingEntry) -> str:
    keys = entry.keys
    return entry.event_type if not keys.partitioned else f"{entry.event_type}@p{keys.partition}"


@click.group(invoke_without_command=True)
@worker_option
@json_option
@click.pass_context
def pending(ctx: click.Context, worker: str | None, as_json: bool) -> None:
    """Entries delivered to a worker and not acknowledged (in flight, or held by a
    consumer that died and not claimed yet), oldest first: with --json a list of objects
    with id, stream, worker, consumer, deliveries, idle_ms, run_id.

    ``printery pending dlq ID`` dead-letters one of them."""
    if ctx.invoked_subcommand is not None:
        return
    ops = get_ctx()
    chosen = resolve_worker(ops, worker)
    pipeline = ops.pipeline

    async def body(client: Redis) -> list[PendingEntry]:
        return await pending_entries(client, ops.keys, pipeline.groups(),
                                     pipeline.correlation_field, worker=chosen)

    entries = ops.run(body)
    if as_json:
        print_json([entry.view() for entry in entries])
        return
    if not entries:
        click.echo("no pending entries" + (f" of {chosen}" if chosen else ""))
        return
    click.echo(table(
        [(e.ref, e.worker, _where(e), e.consumer, e.deliveries, _idle(e.idle_ms), e.run_id)
         for e in entries],
        ["id", "worker", "stream", "consumer", "deliveries", "idle", pipeline.correlation_field],
    ))


def _one(found: list[PendingEntry], ref: str, worker: str | None) -> PendingEntry:
    """The one pending entry ``ref`` names, else the reason why not as a failure."""
    if not found:
        of = f" in the group of {worker}" if worker else ""
        raise Failure(f"no pending entry {ref}{of} (see `printery pending`)")
    if len({e.worker for e in found}) > 1:
        groups = ", ".join(sorted({e.worker for e in found}))
        raise Failure(f"entry {ref} is pending in several groups ({groups}): "
                      "name one with --worker", EXIT_USAGE)
    if len(found) > 1:
        refs = ", ".join(e.ref for e in found)
        raise Failure(f"entry {ref} is pending in several partitions ({refs}): "
                      "name one as listed", EXIT_USAGE)
    return found[0]


@pending.command("dlq")
@click.argument("ref", metavar="ID")
@click.option("--reason", metavar="TEXT", default=None,
              help="why (the dlq entry's error; default: dead-lettered by an operator)")
@worker_option
@json_option
def pending_dlq(ref: str, reason: str | None, worker: str | None, as_json: bool) -> None:
    """Dead-letter one pending entry (ID as `printery pending` lists it): its dlq entry
    (reason_code operator), its run ended failed, and its acknowledgement, in one atomic
    step; works while no worker runs. An entry pending in several groups needs --worker."""
    ops = get_ctx()
    chosen = resolve_worker(ops, worker)
    pipeline = ops.pipeline

    async def body(client: Redis) -> dict[str, Any]:
        found = await find_pending(client, ops.keys, pipeline.groups(),
                                   pipeline.correlation_field, ref, worker=chosen)
        entry = _one(found, ref, chosen)
        dlq_id = await dead_letter_pending(
            client, entry, pipeline.codec(), reason=reason or "",
            ingress=pipeline.ingress, outcomes=pipeline.outcomes)
        if dlq_id is None:
            raise Failure(f"entry {entry.ref} of {entry.worker} is no longer pending "
                          "(acknowledged or dead-lettered meanwhile)")
        return {**entry.view(), "dlq_id": dlq_id, "reason_code": OPERATOR}

    done = ops.run(body)
    if as_json:
        print_json(done)
        return
    ended = f"; run {done['run_id']} ended failed" if done["run_id"] else ""
    click.echo(f"dead-lettered {done['id']} of {done['worker']} as dlq entry "
               f"{done['dlq_id']}{ended}")
