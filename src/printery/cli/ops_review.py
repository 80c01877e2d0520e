"""``printery review``: human decisions on escalations (CONTRACT §5).

Each decision writes its output (if any), the ``review:decided`` record and deletes the
``review`` entry in one MULTI/EXEC under WATCH of the review stream: a review can be
decided once, and two operators deciding at once cannot both win.
"""

from __future__ import annotations

import os
from typing import Any

import click
import httpx
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from printery._util import now_rfc3339
from printery.cli.ops_common import (
    PRODUCER,
    WATCH_RETRIES,
    Failure,
    OpsContext,
    get_ctx,
    get_entry,
    json_option,
    print_json,
    table,
)
from printery.deploy.app import approved_request, delivery_key
from printery.deploy.delivery import parse_channel, post_webhook, redact_channel
from printery.deploy.events import (
    CHANNEL,
    REJECTED,
    REVIEW_APPROVAL,
    REVIEW_DELIVERY_FAILED,
    VALIDATED,
)
from printery.deploy.settings import DeploySettings, NotifierSettings
from printery.envelope import correlation_of
from printery.fields import (
    BY,
    DECIDED_AT,
    DECISION,
    KIND,
    NOTE,
    REASON,
    REVIEW_ID,
    SOURCE_ID,
    SOURCE_STREAM,
    STEP,
)
from printery.history import decode_fields
from printery.keys import REVIEW_DECIDED


@click.group()
def review() -> None:
    """Escalations waiting for a human: list, approve, reject."""


@review.command("list")
@json_option
def review_list(as_json: bool) -> None:
    """Open reviews, oldest first."""
    ops = get_ctx()
    field = ops.pipeline.correlation_field

    async def body(client: aioredis.Redis) -> list[dict[str, Any]]:
        entries = await client.xrange(ops.keys.review)
        return [{"id": entry_id, KIND: f.get(KIND, ""), STEP: f.get(STEP, ""),
                 field: correlation_of(f, field) or "", REASON: f.get(REASON, ""),
                 "produced_at": f.get("produced_at", ""),
                 SOURCE_STREAM: f.get(SOURCE_STREAM, ""), SOURCE_ID: f.get(SOURCE_ID, "")}
                for entry_id, f in entries]

    rows = ops.run(body)
    if as_json:
        print_json(rows)
        return
    columns = ["id", KIND, STEP, field, REASON]
    click.echo(table([[r[c] for c in columns] for r in rows], columns))


def _decision_options(func: Any) -> Any:
    func = click.option("--by", required=True, metavar="NAME", help="who decides")(func)
    func = click.option("--note", default="", metavar="TEXT", help="why")(func)
    return json_option(click.argument("review_id", metavar="ID")(func))


@review.command("approve")
@_decision_options
def review_approve(review_id: str, by: str, note: str, as_json: bool) -> None:
    """Approve: an approval continues the deployment, a failed delivery is retried once,
    a branch timeout is recorded."""
    _decide(review_id, "approved", by, note, as_json)


@review.command("reject")
@_decision_options
def review_reject(review_id: str, by: str, note: str, as_json: bool) -> None:
    """Reject: an approval becomes deployment:rejected; anything else is closed."""
    _decide(review_id, "rejected", by, note, as_json)


def _decide(review_id: str, decision: str, by: str, note: str, as_json: bool) -> None:
    ops = get_ctx()
    result = ops.run(lambda client: decide(ops, client, review_id, decision, by, note))
    if as_json:
        print_json(result)
    else:
        click.echo(f"review {review_id}: {result['decision']} by {by} ({result['kind']})"
                   + (f"; {result['detail']}" if result.get("detail") else ""))


async def decide(
    ops: OpsContext, client: aioredis.Redis, review_id: str, decision: str, by: str, note: str
) -> dict[str, Any]:
    """Apply one decision; raises :class:`Failure` (exit 1) for an unknown or already
    decided id, an approval by the requester, or a retried delivery that failed again."""
    keys, pipeline = ops.keys, ops.pipeline
    codec, field = pipeline.codec(), pipeline.correlation_field
    fields = await get_entry(client, keys.review, review_id)
    if fields is None:
        raise Failure(f"no open review {review_id} (unknown or already decided)")
    entry = decode_fields(fields)
    kind, cid = str(entry.get(KIND, "")), str(entry.get(field, ""))
    raw_data = entry.get("data")
    data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    result: dict[str, Any] = {REVIEW_ID: review_id, KIND: kind, field: cid,
                              DECISION: decision, BY: by, NOTE: note, "detail": ""}
    output: tuple[str, dict[str, str]] | None = None
    if kind == REVIEW_APPROVAL and decision == "approved":
        if by == data.get("requested_by"):
            raise Failure(f"{by} requested this deployment and cannot approve it")
        try:
            approved = approved_request(data, cid, by, DeploySettings.of(ops.settings))
        except ValueError as exc:
            raise Failure(f"review {review_id}: the request does not validate: {exc}") from None
        env = codec.new(VALIDATED, approved, correlation_id=cid,
                        producer=PRODUCER, idempotency_key=f"{VALIDATED}:{cid}")
        output = (keys.stream(VALIDATED), codec.encode(env))
    elif kind == REVIEW_APPROVAL:
        reasons = [{"code": "rejected_by_reviewer", "field": "", "message": note}]
        env = codec.new(REJECTED, {field: cid, "reasons": reasons, "request": data},
                        correlation_id=cid, producer=PRODUCER,
                        idempotency_key=f"{REJECTED}:{cid}")
        output = (keys.stream(REJECTED), codec.encode(env))
    elif kind == REVIEW_DELIVERY_FAILED and decision == "approved":
        result["detail"] = await _retry_delivery(ops, cid, data)
        result["delivered"] = result["detail"].startswith("delivered")
        if not result["delivered"]:
            raise Failure(f"review {review_id}: retry failed: {result['detail']}; "
                          "the review stays open")
    decided = codec.new(
        REVIEW_DECIDED, {k: v for k, v in result.items() if k != "detail"},
        correlation_id=cid, producer=PRODUCER,
        idempotency_key=f"{REVIEW_DECIDED}:{review_id}",
        extra={REVIEW_ID: review_id, DECISION: decision, BY: by, NOTE: note,
               DECIDED_AT: now_rfc3339()},
    )
    await _commit(client, keys.review, keys.review_decided, review_id,
                  codec.encode(decided), output)
    return result


async def _commit(
    client: aioredis.Redis, review_key: str, decided_key: str, review_id: str,
    decided: dict[str, str], output: tuple[str, dict[str, str]] | None,
) -> None:
    for _ in range(WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(review_key)
                if await get_entry(pipe, review_key, review_id) is None:
                    raise Failure(f"review {review_id} was decided meanwhile")
                pipe.multi()  # type: ignore[no-untyped-call]
                if output is not None:
                    pipe.xadd(output[0], output[1])  # type: ignore[arg-type]
                pipe.xadd(decided_key, decided)  # type: ignore[arg-type]
                pipe.xdel(review_key, review_id)
                await pipe.execute()
                return
            except WatchError:
                continue
    raise Failure(f"review {review_id}: too much concurrent change, try again")


async def _retry_delivery(ops: OpsContext, cid: str, data: dict[str, Any]) -> str:
    """POST the finished data once more to the failed channel, with the notifier's
    idempotency key, so a receiver that did get an earlier attempt dedupes it."""
    channel = data.get(CHANNEL)
    if not isinstance(channel, str):
        return "failed: the review entry names no channel"
    try:
        parsed = parse_channel(channel)
    except ValueError as exc:
        return f"failed: {exc}"
    if parsed.kind == "log":
        return "delivered (log)"
    payload = {k: v for k, v in data.items() if k != CHANNEL}
    nc = ops.settings.table("notifier", NotifierSettings)
    async with httpx.AsyncClient(follow_redirects=False) as http:
        outcome = await post_webhook(
            http, parsed.url or "", payload, idempotency_key=delivery_key(cid, channel),
            secret=os.environ.get(nc.webhook_secret_env) or None, retries=0,
            backoff_ms=nc.backoff_ms, timeout=nc.timeout,
            max_response_bytes=nc.max_response_bytes, allow_hosts=nc.allow_hosts,
        )
    return f"{outcome.status} to {redact_channel(channel)}: {outcome.detail}"
