"""What a decision on each of the deployment pipeline's review kinds does
(docs/reference.md, Escalation kinds).

- ``approval``: approve writes ``deployment:validated`` with ``approved_by`` = the
  reviewer (the requester may not approve their own deployment); reject writes
  ``deployment:rejected`` with reason ``rejected_by_reviewer``. No edited data: what is
  approved is the request as submitted.
- ``delivery_failed``: approve POSTs the finished deployment once more to the failed
  channel (a failed retry leaves the review open); reject closes it.
- ``branch_timeout``: the deployment already finished as ``failed``; both decisions are
  only recorded.

The framework writes what these hooks return, the decision record and the deletion of
the review in one transaction; they only say what a decision means here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx

from printery import Output, Pipeline, ReviewActionFailed, ReviewCase, ReviewOutcome, ReviewRefused
from printery.deploy.delivery import delivery_key, parse_channel, post_webhook, redact_channel
from printery.deploy.events import (
    CHANNEL,
    REJECTED,
    REVIEW_APPROVAL,
    REVIEW_BRANCH_TIMEOUT,
    REVIEW_DELIVERY_FAILED,
    VALIDATED,
)
from printery.deploy.settings import NotifierSettings

#: ``(request under review, deployment id, approver) -> deployment:validated data``;
#: raises ValueError naming why the request cannot be approved.
ApprovedRequest = Callable[[Any, str, str], dict[str, Any]]


def register_review_kinds(
    pipeline: Pipeline, notifier: NotifierSettings, approved: ApprovedRequest
) -> None:
    """Give ``pipeline``'s review kinds the meaning docs/reference.md, Escalation kinds
    gives them; ``approved`` makes the validated request of an approval."""

    async def approve_deployment(case: ReviewCase) -> ReviewOutcome:
        request, cid = case.data, case.correlation_id
        if isinstance(request, dict) and case.by == request.get("requested_by"):
            raise ReviewRefused(f"{case.by} requested this deployment and cannot approve it")
        try:
            data = approved(request, cid, case.by)
        except ValueError as exc:
            raise ReviewRefused(
                f"review {case.review_id}: the request does not validate: {exc}") from None
        return ReviewOutcome([Output(VALIDATED, data, correlation_id=cid,
                                     idempotency_key=f"{VALIDATED}:{cid}")])

    pipeline.review_kind(REVIEW_APPROVAL, approve=approve_deployment,
                         reject=_reject_deployment, accepts_data=False)

    async def retry_delivery(case: ReviewCase) -> ReviewOutcome:
        detail = await _retry_delivery(notifier, case.correlation_id, _as_dict(case.data))
        if not detail.startswith("delivered"):
            raise ReviewActionFailed(
                f"review {case.review_id}: retry failed: {detail}; the review stays open")
        return ReviewOutcome(detail=detail, result={"delivered": True})

    pipeline.review_kind(REVIEW_DELIVERY_FAILED, approve=retry_delivery, reject=_record,
                         accepts_data=False)
    pipeline.review_kind(REVIEW_BRANCH_TIMEOUT, approve=_record, reject=_record,
                         accepts_data=False)


def _as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {}


async def _record(case: ReviewCase) -> ReviewOutcome:
    """The decision is recorded; nothing else happens."""
    return ReviewOutcome()


async def _reject_deployment(case: ReviewCase) -> ReviewOutcome:
    cid = case.correlation_id
    reasons = [{"code": "rejected_by_reviewer", "field": "", "message": case.note}]
    data = {case.correlation_field: cid, "reasons": reasons, "request": case.data}
    return ReviewOutcome([Output(REJECTED, data, correlation_id=cid,
                                 idempotency_key=f"{REJECTED}:{cid}")])


async def _retry_delivery(nc: NotifierSettings, cid: str, data: dict[str, Any]) -> str:
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
    async with httpx.AsyncClient(follow_redirects=False) as http:
        outcome = await post_webhook(
            http, parsed.url or "", payload, idempotency_key=delivery_key(cid, channel),
            secret=os.environ.get(nc.webhook_secret_env) or None, retries=0,
            backoff_ms=nc.backoff_ms, timeout=nc.timeout,
            max_response_bytes=nc.max_response_bytes, allow_hosts=nc.allow_hosts,
        )
    return f"{outcome.status} to {redact_channel(channel)}: {outcome.detail}"
