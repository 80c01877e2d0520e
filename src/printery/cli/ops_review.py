"""``printery review``: human decisions on escalations (docs/reference.md, Escalation
kinds; Review inbox).

A thin layer over :mod:`printery.inbox.reviews`, where a decision is made once and written in
one transaction; here its errors become exit statuses: unknown or already decided, a
reviewer who may not decide, an action that failed -> 1; edited data that is not JSON or
that the kind or the resumed step refuses -> 2.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TextIO, TypeVar

import click

from printery.base import _json
from printery.base.errors import ReviewError, ReviewInvalid
from printery.cli.ops_common import (
    EXIT_USAGE,
    PRODUCER,
    Failure,
    get_ctx,
    json_option,
    print_json,
    show_entry,
    table,
)
from printery.inbox.reviews import REVIEW_PAGE, approve, get_review, list_reviews, reject
from printery.observe.redact import redact_text
from printery.store import Redis
from printery.wire.fields import KIND, REASON, STEP

T = TypeVar("T")


@click.group()
def review() -> None:
    """Escalations waiting for a human: list, show, approve, reject."""


def _run(body: Callable[[Redis], Awaitable[T]]) -> T:
    """Run ``body``; a review error exits 1, or 2 for input the decision refuses."""
    ops = get_ctx()

    async def guarded(client: Redis) -> T:
        try:
            return await body(client)
        except ReviewInvalid as exc:
            reasons = "; ".join(f"{r.get('field') or '-'}: {r.get('message')}"
                                for r in exc.reasons)
            raise Failure(f"{exc}" + (f" ({reasons})" if reasons else ""), EXIT_USAGE) from None
        except ReviewError as exc:
            raise Failure(str(exc)) from None

    return ops.run(guarded)


@review.command("list")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=REVIEW_PAGE, show_default=True,
              help="most reviews to show")
@click.option("--after", default="", metavar="ID", help="show those after this review")
@json_option
def review_list(limit: int, after: str, as_json: bool) -> None:
    """Open reviews, oldest first, a page at a time (a full page says where the next
    starts)."""
    ops = get_ctx()
    pipeline = ops.pipeline
    rows = _run(lambda client: list_reviews(client, ops.keys, pipeline, limit=limit,
                                            after=after))
    if as_json:
        print_json(rows)
    else:
        columns = ["id", KIND, STEP, pipeline.correlation_field, REASON]
        click.echo(table([[r[c] for c in columns] for r in rows], columns))
    if len(rows) == limit:
        click.echo(f"more: printery review list --after {rows[-1]['id']}", err=True)


@review.command("show")
@click.argument("review_id", metavar="ID")
@json_option
def review_show(review_id: str, as_json: bool) -> None:
    """One open review: what escalated, why, what a decision writes, and its data."""
    ops = get_ctx()
    view = _run(lambda client: get_review(client, ops.keys, ops.pipeline, review_id))
    if as_json:
        print_json(view)
        return
    click.echo(show_entry(view))


def _decision_options(func: Any) -> Any:
    func = click.option("--by", required=True, metavar="NAME", help="who decides")(func)
    func = click.option("--note", default="", metavar="TEXT", help="why")(func)
    return json_option(click.argument("review_id", metavar="ID")(func))


@review.command("approve")
@_decision_options
@click.option("--data", "data_text", default=None, metavar="JSON",
              help="the edited data the run resumes with (default: the escalated data)")
@click.option("--file", "data_file", type=click.File("r"), default=None,
              help="the edited data from a file, - = stdin")
def review_approve(review_id: str, by: str, note: str, as_json: bool, data_text: str | None,
                   data_file: TextIO | None) -> None:
    """Approve: the run resumes with the review's resume type (and --data if given); a
    deployment approval continues it, a failed delivery is retried once."""
    data = _edited_data(data_text, data_file)
    ops = get_ctx()
    result = _run(lambda client: approve(client, ops.keys, ops.pipeline, review_id, by=by,
                                         note=note, data=data, producer=PRODUCER))
    _report(review_id, result, as_json)


@review.command("reject")
@_decision_options
def review_reject(review_id: str, by: str, note: str, as_json: bool) -> None:
    """Reject: the review's reject type is written with status rejected; a deployment
    approval becomes deployment:rejected; anything else is closed."""
    ops = get_ctx()
    result = _run(lambda client: reject(client, ops.keys, ops.pipeline, review_id, by=by,
                                        note=note, producer=PRODUCER))
    _report(review_id, result, as_json)


def _edited_data(text: str | None, file: TextIO | None) -> Any:
    """The JSON of ``--data`` or ``--file`` (None when neither); anything else exits 2."""
    if text is not None and file is not None:
        raise click.UsageError("give only one of --data, --file")
    raw = file.read() if file is not None else text
    if raw is None:
        return None
    try:
        data = _json.loads(raw)
    except (_json.JSONDecodeError, ValueError) as exc:
        raise click.UsageError(f"the edited data is not valid JSON: {exc}") from None
    if data is None:
        raise click.UsageError("the edited data is null; leave --data out to keep the data")
    return data


def _report(review_id: str, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    wrote = ", ".join(result["outputs"]) or "nothing"
    detail = f"; {result['detail']}" if result.get("detail") else ""
    click.echo(redact_text(f"review {review_id}: {result['decision']} by {result['by']} "
                           f"({result['kind']}); wrote {wrote}{detail}"))
