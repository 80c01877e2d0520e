"""Event type names, worker names and payload models of the deployment pipeline.

docs/reference.md (Streams and entries, The deployment pipeline) fixes these names and
shapes for other systems; keeping them in one module means a worker never spells an event
type by hand, and the models document (and can check) the ``data`` each event carries. The
functions of this package return plain dicts, built through these models, because that is
what travels in an entry's ``data``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from printery import Reason

# Event types (the suffix of each stream key, docs/reference.md, Streams and entries).
STARTED = "deployment:started"
VALIDATED = "deployment:validated"
REJECTED = "deployment:rejected"
DEPENDENCIES_CHECKED = "dependencies:checked"
HEALTH_CHECKED = "health:checked"
FINISHED = "deployment:finished"
NOTIFICATION_SENT = "notification:sent"

EVENT_TYPES: tuple[str, ...] = (
    STARTED,
    VALIDATED,
    REJECTED,
    DEPENDENCIES_CHECKED,
    HEALTH_CHECKED,
    FINISHED,
    NOTIFICATION_SENT,
)

# Worker names: consumer groups, `/status` keys, metric labels, `dlq` entries' `worker`.
VALIDATOR = "validator"
DEPENDENCY_CHECKER = "dependency-checker"
HEALTH_MONITOR = "health-monitor"
AGGREGATOR = "aggregator"
NOTIFIER = "notifier"

WORKERS: tuple[str, ...] = (VALIDATOR, DEPENDENCY_CHECKER, HEALTH_MONITOR, AGGREGATOR, NOTIFIER)

# Review kinds (docs/reference.md, Escalation kinds): the `kind` of the `review` entries
# this pipeline writes.
REVIEW_APPROVAL = "approval"
REVIEW_DELIVERY_FAILED = "delivery_failed"
REVIEW_BRANCH_TIMEOUT = "branch_timeout"
#: The data field naming a channel: in `notification:sent` and a `delivery_failed` review.
CHANNEL = "channel"

DependencyStatus = Literal["healthy", "unhealthy", "unreachable", "version_mismatch"]
HealthStatus = Literal["healthy", "unhealthy", "skipped"]
FinishedStatus = Literal["succeeded", "rejected", "blocked", "unhealthy", "failed"]
DeliveryStatus = Literal["delivered", "failed"]


class _Payload(BaseModel):
    """Frozen and closed: an unexpected key in our own output is a bug, not an extension."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Dependency(_Payload):
    """One dependency of a request: probed at ``health_url``; ``version`` is a PEP 440
    specifier set its reported version must satisfy, or None for any version."""

    service: str
    health_url: str
    version: str | None = None


class DeploymentRequest(_Payload):
    """The normalized request: the ``data`` of ``deployment:validated``.

    Every key is present, so consumers never guess defaults: optional values are None,
    ``dependencies`` is a list and ``notify`` holds the channels actually to notify.
    ``deployment_id`` is None only until the validator fills it from the entry.
    """

    deployment_id: str | None = None
    service: str
    version: str
    environment: str
    requested_by: str
    approved_by: str | None = None
    health_url: str | None = None
    dependencies: list[Dependency] = Field(default_factory=list)
    notify: list[str] = Field(default_factory=list)


class Rejected(_Payload):
    """``deployment:rejected``: every reason at once, and the request exactly as received
    so an operator can see what the producer actually sent."""

    deployment_id: str | None
    reasons: list[Reason]
    request: Any = None


class DependencyResult(_Payload):
    """The outcome of probing one dependency; ``latency_ms`` is that of the last attempt."""

    service: str
    status: DependencyStatus
    detail: str
    latency_ms: float | None


class DependenciesChecked(_Payload):
    """``dependencies:checked``: ``ok`` when every dependency is healthy (or there are none)."""

    deployment_id: str | None
    status: Literal["ok", "blocked"]
    results: list[DependencyResult]


class HealthChecked(_Payload):
    """``health:checked``: the health watch of the deployed service."""

    deployment_id: str | None
    status: HealthStatus
    probes: int
    consecutive_successes: int
    last_status_code: int | None
    detail: str


class Finished(_Payload):
    """``deployment:finished``: exactly one per deployment; ``steps`` holds each step's
    output data that arrived, keyed by worker name."""

    deployment_id: str | None
    status: FinishedStatus
    reasons: list[Reason]
    steps: dict[str, Any]


class NotificationSent(_Payload):
    """``notification:sent``: one per deployment and channel. ``channel`` is redacted;
    ``fallback_for`` names the failed channel this delivery stands in for, if any."""

    deployment_id: str | None
    channel: str
    status: DeliveryStatus
    attempts: int
    fallback_for: str | None = None
