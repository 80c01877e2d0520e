"""The deployment pipeline (docs/reference.md, Streams and entries; The deployment
pipeline; Escalation kinds), written only against the public printery API.

validator ──validated──> dependency-checker ──dependencies:checked──┐
    │           └──────> health-monitor ─────health:checked─────────┤
    ├──rejected────────────────────────────────────────────────────>├─ aggregator ──finished──> notifier
    └──review (approval)              deployment:validated (opens) ─┘
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from printery import (
    REVIEW,
    REVIEW_DECIDED,
    Aggregator,
    JoinState,
    Message,
    Output,
    Pipeline,
    Reason,
    review_output,
)
from printery.deploy.decisions import register_review_kinds
from printery.deploy.delivery import delivery_key, parse_channel, post_webhook, redact_channel
from printery.deploy.events import (
    AGGREGATOR,
    CHANNEL,
    DEPENDENCIES_CHECKED,
    DEPENDENCY_CHECKER,
    FINISHED,
    HEALTH_CHECKED,
    HEALTH_MONITOR,
    NOTIFICATION_SENT,
    NOTIFIER,
    REJECTED,
    REVIEW_APPROVAL,
    REVIEW_BRANCH_TIMEOUT,
    REVIEW_DELIVERY_FAILED,
    STARTED,
    VALIDATED,
    VALIDATOR,
)
from printery.deploy.merge import merge_outcome
from printery.deploy.probes import check_dependencies, watch_health
from printery.deploy.settings import CONFIG, DeploySettings, HasTables
from printery.deploy.validation import Validation, validate_request
from printery.ext import review_fields

log = structlog.get_logger("printery.deploy")

COST_UNITS = ("probes", "webhook_posts", "bytes_posted")
REJECTED_AS = "rejected"


class _Http:
    """One shared HTTP client per process, created on first use (no I/O at import)."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                follow_redirects=False, limits=httpx.Limits(max_connections=200)
            )
        return self._client


def _input_check(cfg: DeploySettings) -> Callable[[Any], list[Reason]]:
    """What a submitted request is refused for (``Client.submit``): the validator's
    reasons, so a client learns them before anything is written."""

    def check(data: Any) -> list[Reason]:
        return validate_request(data, approval_required=cfg.validator.approval_required,
                                default_notify=cfg.notifier.default_channels).reasons

    return check


def build_pipeline(settings: DeploySettings | None = None) -> Pipeline:
    """The deployment pipeline configured from its tables (defaults when None).

    Each step declares its concurrency (the defaults of docs/reference.md, Configuration);
    ``[workers.<name>] concurrency`` overrides it where the service builds the workers.
    """
    cfg = settings or DeploySettings()
    http = _Http()
    pipeline = Pipeline(
        "deployments",
        ingress=[STARTED],
        correlation_field="deployment_id",
        id_prefix="dep",
        outcomes=[FINISHED],
        cost_units=COST_UNITS,
        extra_types=[REVIEW_DECIDED],
    )
    register_review_kinds(pipeline, cfg.notifier,
                          approved=lambda request, cid, by: approved_request(request, cid, by, cfg))

    @pipeline.step(VALIDATOR, consumes=[STARTED], produces=[VALIDATED, REJECTED, REVIEW],
                   concurrency=1, input_check=_input_check(cfg))
    async def validator(message: Message) -> Output:
        cid = message.correlation_id
        data = message.data
        # The id the run goes by is the request's deployment_id, so it holds to its pattern
        # also when the entry names it and the request does not.
        result = check_request({**data, "deployment_id": cid} if isinstance(data, dict)
                               and "deployment_id" not in data else data, cfg)
        # One decision per deployment id: a later start of the same id is not run again.
        once = f"decided:{cid}"
        if result.reasons or result.request is None:
            reasons = [r.as_dict() for r in result.reasons]
            return Output(REJECTED, {"deployment_id": cid, "reasons": reasons,
                                     "request": message.data}, once=once)
        request = {**result.request, "deployment_id": cid}
        if result.needs_approval:
            # The reviewer sees the request exactly as submitted; the approval normalizes
            # it again (approved_request), as here.
            review = review_output(
                message, kind=REVIEW_APPROVAL,
                reason=f"{request['environment']} requires approval",
                on_approve=VALIDATED, on_reject=REJECTED,
            )
            return Output(review.type, review.data, idempotency_key=review.idempotency_key,
                          extra=review.extra, once=once)
        return Output(VALIDATED, request, once=once)

    @pipeline.step(DEPENDENCY_CHECKER, consumes=[VALIDATED], produces=[DEPENDENCIES_CHECKED],
                   concurrency=5, cost_units=["probes"])
    async def dependency_checker(message: Message) -> Output:
        deps = message.data.get("dependencies") or []
        result = await check_dependencies(
            http.get(), deps, timeout=cfg.dependency_checker.probe_timeout,
            retries=cfg.dependency_checker.retries, deployment_id=message.correlation_id,
        )
        message.report_cost("probes", len(deps))
        return Output(DEPENDENCIES_CHECKED, result)

    @pipeline.step(HEALTH_MONITOR, consumes=[VALIDATED], produces=[HEALTH_CHECKED],
                   concurrency=10, cost_units=["probes"],
                   handler_timeout=cfg.health_monitor.deadline + cfg.health_monitor.probe_timeout + 30)
    async def health_monitor(message: Message) -> Output:
        hm = cfg.health_monitor
        result = await watch_health(
            http.get(), message.data, interval=hm.interval, consecutive=hm.consecutive,
            deadline=hm.deadline, probe_timeout=hm.probe_timeout,
            on_probe=lambda: message.report_cost("probes", 1),
        )
        return Output(HEALTH_CHECKED, {**result, "deployment_id": message.correlation_id})

    def decide(state: JoinState) -> dict[str, Any] | None:
        rejected = state.arrived.get(REJECTED_AS)
        if rejected is None and not (state.complete or state.timed_out):
            return None
        steps = {k: v for k, v in state.arrived.items() if k != REJECTED_AS}
        return merge_outcome(state.correlation_id, steps, rejected=rejected,
                             missing=list(state.missing))

    def timeout_review(state: JoinState, merged: Any) -> list[Output]:
        return [Output(
            REVIEW, merged, correlation_id=state.correlation_id,
            idempotency_key=f"{REVIEW}:{REVIEW_BRANCH_TIMEOUT}:{state.correlation_id}",
            once=f"{REVIEW}:{REVIEW_BRANCH_TIMEOUT}:{state.correlation_id}",
            extra=review_fields(kind=REVIEW_BRANCH_TIMEOUT, step=AGGREGATOR,
                                reason="missing: " + ", ".join(state.missing)),
        )]

    aggregator = Aggregator(
        AGGREGATOR, opens=VALIDATED, opens_as=VALIDATOR,
        branches={DEPENDENCIES_CHECKED: DEPENDENCY_CHECKER, HEALTH_CHECKED: HEALTH_MONITOR},
        closes={REJECTED: REJECTED_AS}, emits=FINISHED, policy=decide,
        deadline=cfg.aggregator.branch_deadline, concurrency=1,
        on_timeout=timeout_review, extra_produces=[REVIEW],
    )
    pipeline.add(aggregator.step())

    @pipeline.step(NOTIFIER, consumes=[FINISHED], produces=[NOTIFICATION_SENT, REVIEW],
                   concurrency=5, cost_units=["webhook_posts", "bytes_posted"])
    async def notifier(message: Message) -> list[Output]:
        outputs: list[Output] = []
        for channel in channels_of(message.data, cfg.notifier.default_channels):
            outputs += await notify(message, channel)
        return outputs

    async def notify(message: Message, channel: str) -> list[Output]:
        cid, nc = message.correlation_id, cfg.notifier
        shown = redact_channel(channel)
        kind = parse_channel(channel)
        if kind.kind == "log":
            log.info("deployment finished", channel="log", deployment_id=cid,
                     status=message.data.get("status"), reasons=message.data.get("reasons"))
            return [sent(cid, shown, "delivered", 1, None)]
        secret = os.environ.get(nc.webhook_secret_env) or None
        result = await post_webhook(
            http.get(), kind.url or "", message.data, idempotency_key=delivery_key(cid, channel),
            secret=secret, retries=nc.retries, backoff_ms=nc.backoff_ms, timeout=nc.timeout,
            max_response_bytes=nc.max_response_bytes, allow_hosts=nc.allow_hosts,
        )
        message.report_cost("webhook_posts", result.attempts)
        if result.status == "delivered":
            return [sent(cid, shown, "delivered", result.attempts, None)]
        log.warning("webhook delivery failed; falling back to log", deployment_id=cid,
                    channel=shown, detail=result.detail, attempts=result.attempts)
        log.info("deployment finished", channel="log", fallback_for=shown, deployment_id=cid,
                 status=message.data.get("status"))
        review = review_output(message, kind=REVIEW_DELIVERY_FAILED,
                               reason=f"{shown}: {result.detail}")
        return [
            sent(cid, shown, "failed", result.attempts, None),
            sent(cid, "log", "delivered", 1, shown),
            Output(review.type, {**message.data, CHANNEL: channel},
                   idempotency_key=f"{REVIEW}:{REVIEW_DELIVERY_FAILED}:{cid}:{shown}",
                   extra=review.extra),
        ]

    return pipeline


def check_request(data: Any, cfg: DeploySettings) -> Validation:
    """The validator's verdict on a request under ``cfg`` (docs/reference.md, The
    deployment pipeline)."""
    return validate_request(data, approval_required=cfg.validator.approval_required,
                            default_notify=cfg.notifier.default_channels)


def approved_request(submitted: Any, cid: str, by: str, cfg: DeploySettings) -> dict[str, Any]:
    """The ``deployment:validated`` data of an approval by ``by``: the request as
    submitted (what the ``review`` entry holds), validated and normalized as the
    validator does, with ``approved_by`` = ``by``. Raises :class:`ValueError` naming the
    reasons when it does not pass (the requester approving, or a config changed since)."""
    data = {**submitted, "approved_by": by} if isinstance(submitted, dict) else submitted
    result = check_request(data, cfg)
    if result.request is None:
        raise ValueError("; ".join(f"{r.code} {r.field}: {r.message}" for r in result.reasons))
    return {**result.request, "deployment_id": cid}


def channels_of(finished: dict[str, Any], default: tuple[str, ...] | list[str]) -> list[str]:
    """The channels a finished deployment is announced on: the request's, else default."""
    step = (finished.get("steps") or {}).get(VALIDATOR) or {}
    request = step.get("request", step) if isinstance(step, dict) else {}
    notify = request.get("notify") if isinstance(request, dict) else None
    chosen = notify if isinstance(notify, list) and notify else list(default)
    valid = []
    for channel in dict.fromkeys(c for c in chosen if isinstance(c, str)):
        try:
            parse_channel(channel)
        except ValueError:
            log.warning("skipping invalid channel", channel=redact_channel(channel))
            continue
        valid.append(channel)
    return valid


def sent(cid: str, channel: str, status: str, attempts: int, fallback_for: str | None) -> Output:
    key = f"{NOTIFICATION_SENT}:{cid}:{channel}:{fallback_for or ''}"
    return Output(
        NOTIFICATION_SENT,
        {"deployment_id": cid, CHANNEL: channel, "status": status, "attempts": attempts,
         "fallback_for": fallback_for},
        idempotency_key=key, once=key,
    )


@CONFIG
def pipeline(settings: HasTables) -> Pipeline:
    """``--app printery.deploy.app:pipeline``: printery's loader reads :data:`CONFIG` from
    this factory, validates the tables it declares, then calls it with the settings."""
    return build_pipeline(DeploySettings.of(settings))
