"""``printery emit``: publish a ``deployment:started`` and optionally wait for its outcome.

``--wait`` follows the request (:mod:`printery.follow`) from where ``deployment:finished``,
``dlq`` and ``review`` were *before* publishing, so nothing written in between is
missed: the outcome (exit 0 when ``succeeded``, else 1), the request dead-lettered
(exit 1 at once) or waiting for approval (said on stderr with the review id; the wait
goes on, a reviewer may approve).
"""

from __future__ import annotations

import sys
import time
from typing import Any, NoReturn

import click
import redis.asyncio as aioredis

from printery import _json
from printery._util import new_id
from printery.cli.ops_common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_TIMEOUT,
    PRODUCER,
    fail,
    get_ctx,
    json_option,
    print_json,
    table,
)
from printery.cli.term import printable
from printery.deploy.events import FINISHED, REVIEW_APPROVAL
from printery.fields import ERROR, KIND, REASON_CODE
from printery.follow import Ending, Published, follow, positions
from printery.history import decode_fields

#: ``status`` of ``emit --wait --json`` when the request itself went to ``dlq``.
DEAD_LETTERED = "dead_lettered"

_CONSTRAINT_START = tuple("<>=!~0123456789")

EXAMPLE: dict[str, Any] = {
    "service": "billing-api",
    "version": "1.4.2",
    "environment": "staging",
    "requested_by": "alice",
    "notify": ["log"],
}


def parse_dependency(text: str) -> dict[str, str]:
    """``SERVICE=URL[@CONSTRAINT]``; the last ``@`` splits only when what follows looks
    like a version constraint (no ``/`` or ``:``), so ``user@host`` URLs still parse."""
    service, sep, rest = text.partition("=")
    if not sep or not service or not rest:
        raise click.BadParameter(f"{text!r}: expected SERVICE=URL[@CONSTRAINT]",
                                 param_hint="--dependency")
    url, at, constraint = rest.rpartition("@")
    dep = {"service": service, "health_url": rest}
    if at and url and constraint.startswith(_CONSTRAINT_START) and not set(constraint) & set("/:"):
        dep = {"service": service, "health_url": url, "version": constraint}
    return dep


def build_request(
    file: click.File | None, data: str | None, example: bool, flags: dict[str, Any]
) -> dict[str, Any]:
    """The request from exactly one source (``--file``/``--data``/``--example``) and/or the
    field flags, which override fields of the source. Nothing given: usage error (exit 2)."""
    sources = [s for s in (file is not None, data is not None, example) if s]
    if len(sources) > 1:
        raise click.UsageError("give only one of --file, --data, --example")
    given = {k: v for k, v in flags.items() if v not in (None, ())}
    if not sources and not given:
        raise click.UsageError(
            "no request given: use --file F, --data JSON, --example or the field flags"
        )
    request: Any = {}
    raw: str | None = None
    if file is not None:
        raw = file.read()  # type: ignore[attr-defined]
    elif data is not None:
        raw = data
    elif example:
        request = dict(EXAMPLE)
    if raw is not None:
        try:
            request = _json.loads(raw)
        except (_json.JSONDecodeError, ValueError) as exc:
            raise click.UsageError(f"the request is not valid JSON: {exc}") from None
    if given and not isinstance(request, dict):
        raise click.UsageError("field flags need a JSON object request")
    if isinstance(request, dict):
        request.update(given)
    if not isinstance(request, dict):
        raise click.UsageError("the request must be a JSON object")
    return request


@click.command()
@click.option("--file", "file", type=click.File("r"), default=None,
              help="request JSON file, - = stdin")
@click.option("--data", default=None, metavar="JSON", help="request as a JSON string")
@click.option("--example", is_flag=True, help="publish a sample request")
@click.option("--deployment-id", default=None)
@click.option("--service", default=None)
@click.option("--version", default=None)
@click.option("--environment", default=None)
@click.option("--requested-by", default=None)
@click.option("--approved-by", default=None)
@click.option("--health-url", default=None)
@click.option("--dependency", "dependencies", multiple=True, metavar="SERVICE=URL[@CONSTRAINT]")
@click.option("--notify", multiple=True, metavar="CHANNEL")
@click.option("--wait", is_flag=True, help="block until the deployment finishes")
@click.option("--timeout", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="seconds --wait waits (exit 3 after)")
@json_option
def emit(
    file: click.File | None, data: str | None, example: bool, deployment_id: str | None,
    service: str | None, version: str | None, environment: str | None,
    requested_by: str | None, approved_by: str | None, health_url: str | None,
    dependencies: tuple[str, ...], notify: tuple[str, ...], wait: bool, timeout: float,
    as_json: bool,
) -> None:
    """Publish a deployment request (deployment:started) and print its deployment_id."""
    flags: dict[str, Any] = {
        "deployment_id": deployment_id, "service": service, "version": version,
        "environment": environment, "requested_by": requested_by, "approved_by": approved_by,
        "health_url": health_url,
        "dependencies": [parse_dependency(d) for d in dependencies] or None,
        "notify": list(notify) or None,
    }
    request = build_request(file, data, example, flags)
    ops = get_ctx()
    pipeline = ops.pipeline
    cid = request.get(pipeline.correlation_field)
    given_id = isinstance(cid, str) and bool(cid)
    if not isinstance(cid, str) or not cid:
        cid = new_id(pipeline.id_prefix)
        request[pipeline.correlation_field] = cid

    ingress = ops.keys.stream(pipeline.ingress[0])
    finished = ops.keys.stream(FINISHED)
    reviews: list[str] = []

    def on_review(review_id: str, fields: dict[str, str]) -> None:
        reviews.append(review_id)
        _clear_progress()
        what = "approval" if fields.get(KIND) == REVIEW_APPROVAL else f"review ({fields.get(KIND)})"
        click.echo(f"{cid} waits for {printable(what)}: review {review_id}; decide with "
                   f"`printery review approve {review_id} --by NAME` (or reject)", err=True)

    async def body(client: aioredis.Redis) -> tuple[str, Ending | None]:
        codec = pipeline.codec()
        # A generated id is new: only outcomes after now can be its own. A given id may
        # have finished before (a repeated start is not run again): read from the start.
        start = await positions(client, [ops.keys.dlq, ops.keys.review,
                                         *([] if given_id else [finished])])
        envelope = codec.new(pipeline.ingress[0], request, correlation_id=cid, producer=PRODUCER)
        entry_id = _text(await client.xadd(ingress, codec.encode(envelope)))  # type: ignore[arg-type]
        if not wait:
            return entry_id, None
        if not as_json:
            click.echo(cid)
        began = time.monotonic()
        try:
            return entry_id, await follow(
                client, ops.keys, Published(ingress, entry_id, cid),
                correlation_field=pipeline.correlation_field, outcome_types=[FINISHED],
                start=start, timeout=timeout, on_review=on_review,
                on_tick=lambda: _progress(cid, time.monotonic() - began))
        finally:
            _clear_progress()

    entry_id, ending = ops.run(body)
    head = {"deployment_id": cid, "entry_id": entry_id}
    if not wait:
        if as_json:
            print_json(head)
        else:
            click.echo(cid)
        return
    if reviews:
        head["review_id"] = reviews[-1]
    if ending is None:
        if as_json:
            print_json({**head, "status": "timeout"})
        waiting = f"; it waits on review {reviews[-1]}" if reviews else ""
        fail(f"timed out after {timeout:g}s waiting for {cid} to finish{waiting}", EXIT_TIMEOUT)
    entry = {"id": ending.id, **decode_fields(ending.fields)}
    if ending.kind == "dead_lettered":
        _dead_lettered(head, entry, as_json)
    raw_data = entry.get("data")
    data_out: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    status = str(data_out.get("status", "unknown"))
    if as_json:
        print_json({**head, "status": status, "finished": entry})
    else:
        reasons = data_out.get("reasons") or []
        click.echo(f"{cid}: {printable(status)}")
        if reasons:
            click.echo(table([(r.get("code"), r.get("field"), r.get("message")) for r in reasons],
                             ["code", "field", "message"]))
    sys.exit(EXIT_OK if status == "succeeded" else EXIT_FAIL)


def _dead_lettered(head: dict[str, Any], entry: dict[str, Any], as_json: bool) -> NoReturn:
    """The request itself went to ``dlq``: no outcome will ever come, exit 1 now."""
    if as_json:
        print_json({**head, "status": DEAD_LETTERED, "dlq": entry})
    else:
        click.echo(f"{head['deployment_id']}: {DEAD_LETTERED} "
                   f"({printable(str(entry.get(REASON_CODE, '')))}): "
                   f"{printable(str(entry.get(ERROR, '')))}; dlq entry {entry['id']}")
    sys.exit(EXIT_FAIL)


def _progress(cid: str, elapsed: float) -> None:
    """Elapsed seconds on stderr, only when it is a terminal (scripts and logs stay clean)."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\rwaiting for {cid} ... {elapsed:4.0f}s")
        sys.stderr.flush()


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
