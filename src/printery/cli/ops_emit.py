"""``printery emit``: submit a run (:class:`printery.runs.facade.Runs`, as the client does) and
optionally wait for its end.

``--wait`` follows the run from its first entry (:meth:`printery.runs.reader.RunReader.follow`):
the outcome (exit 0 when its status is one of ``Pipeline(success=...)``, default
``succeeded``; else 1), the request itself dead-lettered (exit 1
at once), or waiting for a review (said on stderr with the review id; the wait goes on,
a reviewer may approve).
"""

from __future__ import annotations

import sys
import time
from typing import Any, NoReturn

import click

from printery.base import _json
from printery.base._util import new_id
from printery.base.errors import InvalidInput, PayloadTooLarge
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
from printery.runs.facade import Runs
from printery.runs.reader import run_status
from printery.store import Redis
from printery.wire.fields import ERROR, KIND, REASON_CODE, SOURCE_ID, SOURCE_STREAM
from printery.wire.keys import DLQ, REVIEW

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
@click.option("--type", "event_type", default=None, metavar="EVENT",
              help="the ingress event type (default: the pipeline's only one)")
@click.option("--wait", is_flag=True, help="block until the run ends (its outcome entry)")
@click.option("--timeout", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="seconds --wait waits (exit 3 after)")
@json_option
def emit(
    file: click.File | None, data: str | None, example: bool, deployment_id: str | None,
    service: str | None, version: str | None, environment: str | None,
    requested_by: str | None, approved_by: str | None, health_url: str | None,
    dependencies: tuple[str, ...], notify: tuple[str, ...], event_type: str | None, wait: bool,
    timeout: float, as_json: bool,
) -> None:
    """Submit a run: a deployment request (deployment:started), or with --app and --type
    any pipeline's ingress entry; print its run id. The data is checked against the
    ingress step first (refused: the reasons, exit 1, nothing written)."""
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
    if not request.get(pipeline.correlation_field):
        # The run id travels in the data too, as a producer that writes only data does.
        request[pipeline.correlation_field] = new_id(pipeline.id_prefix)
    reviews: list[str] = []

    async def body(client: Redis) -> tuple[str, str, dict[str, Any] | None]:
        runs = Runs(client, ops.keys, pipeline, producer=PRODUCER,
                    replicated=ops.settings.transport.submit_wait,
                    payload_limit=ops.settings.transport.payload_limit_bytes)
        try:
            cid, entry_id = await runs.submit(request, event_type=event_type)
        except InvalidInput as exc:
            _rejected(str(request[pipeline.correlation_field]), pipeline.correlation_field,
                      exc, as_json)
        except PayloadTooLarge as exc:
            _too_large(str(request[pipeline.correlation_field]), pipeline.correlation_field,
                       exc, as_json)
        if not wait:
            return cid, entry_id, None
        if not as_json:
            click.echo(cid)
        ingress = ops.keys.of(cid).stream(event_type or pipeline.ingress[0])
        return cid, entry_id, await _follow(runs, cid, entry_id, ingress, timeout, reviews)

    cid, entry_id, ending = ops.run(body)
    head = {pipeline.correlation_field: cid, "entry_id": entry_id}
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
    if ending["stream"] == DLQ:
        _dead_lettered(head, cid, ending, as_json)
    _finished(head, cid, ending, as_json, pipeline.success)


def _finished(head: dict[str, Any], cid: str, ending: dict[str, Any], as_json: bool,
              success: tuple[str, ...]) -> NoReturn:
    """The run's outcome: exit 0 when its status is one of ``success`` (the pipeline's),
    else 1."""
    raw_data = ending.get("data")
    data_out: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    status = run_status(ending)
    if as_json:
        print_json({**head, "status": status, "finished": ending})
    else:
        reasons = data_out.get("reasons") or []
        click.echo(f"{cid}: {printable(status)}")
        if reasons:
            click.echo(table([(r.get("code"), r.get("field"), r.get("message")) for r in reasons],
                             ["code", "field", "message"]))
    sys.exit(EXIT_OK if status in success else EXIT_FAIL)


def _too_large(cid: str, field: str, exc: PayloadTooLarge, as_json: bool) -> NoReturn:
    """Over the payload limit: refused before anything was published, exit 1."""
    if as_json:
        print_json({field: cid, "status": "payload_too_large", "published": False,
                    "error": str(exc)})
        sys.exit(EXIT_FAIL)
    fail(f"{cid}: payload_too_large (not published): {exc}")


async def _follow(
    runs: Runs, cid: str, entry_id: str, ingress: str, timeout: float, reviews: list[str]
) -> dict[str, Any] | None:
    """The run's outcome entry, or the published entry's own dead letter; None at the
    timeout. A review escalated from it is said on stderr (and its id kept in
    ``reviews``), and the wait goes on."""
    began = time.monotonic()

    def ticking() -> bool:
        _progress(cid, time.monotonic() - began)
        return True

    try:
        async for entry in runs.reader.follow(cid, deadline=began + timeout, alive=ticking):
            mine = entry.get(SOURCE_ID) == entry_id and entry.get(SOURCE_STREAM) == ingress
            if entry["stream"] == DLQ and mine:
                return entry
            if entry["stream"] == REVIEW and mine and entry["id"] not in reviews:
                reviews.append(entry["id"])
                _clear_progress()
                click.echo(f"{cid} waits for {printable(_what(entry))}: review {entry['id']}; "
                           f"decide with `printery review approve {entry['id']} --by NAME` "
                           "(or reject)", err=True)
            if runs.reader.is_outcome(entry):
                return entry
    except TimeoutError:
        pass
    finally:
        _clear_progress()
    return None


def _what(review: dict[str, Any]) -> str:
    kind = str(review.get(KIND, ""))
    return "approval" if kind == "approval" else f"review ({kind})"


def _rejected(cid: str, field: str, exc: InvalidInput, as_json: bool) -> NoReturn:
    """The ingress step refused the data before anything was written: status
    ``rejected`` with its reasons (as the run would have ended), exit 1."""
    reasons = [reason.as_dict() for reason in exc.reasons]
    if as_json:
        print_json({field: cid, "status": "rejected", "published": False, "reasons": reasons})
    else:
        click.echo(f"{cid}: rejected (not published)")
        click.echo(table([(r["code"], r["field"], r["message"]) for r in reasons],
                         ["code", "field", "message"]))
    sys.exit(EXIT_FAIL)


def _dead_lettered(head: dict[str, Any], cid: str, entry: dict[str, Any], as_json: bool) -> NoReturn:
    """The request itself went to ``dlq``: no outcome will ever come, exit 1 now."""
    if as_json:
        print_json({**head, "status": DEAD_LETTERED, "dlq": entry})
    else:
        click.echo(f"{cid}: {DEAD_LETTERED} "
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
