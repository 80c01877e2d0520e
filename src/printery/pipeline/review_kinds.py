"""What a decision on a review does, per kind (docs/reference.md, Review inbox).

By default an approval writes the review's ``resume_type`` with the reviewer's edited
data (else the escalated data), so the run goes on from there, and a rejection writes
its ``reject_type`` with ``{"status": "rejected", "reasons": [rejected_by_reviewer]}``.
An application whose kinds mean more (a deployment approval that sets ``approved_by``, a
failed delivery retried once) registers hooks with :meth:`Pipeline.review_kind
<printery.Pipeline.review_kind>`; the framework still writes what they return, the
decision record and the deletion of the review in one transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from printery.base._util import marked
from printery.runtime.handler import Output
from printery.wire.keys import StreamKeys

__all__ = [
    "APPROVED",
    "REJECTED",
    "REJECTED_BY_REVIEWER",
    "Escalation",
    "ReviewCase",
    "ReviewHook",
    "ReviewKind",
    "ReviewOutcome",
    "approve_by_resuming",
    "escalation_of",
    "mark_escalation",
    "reject_by_refusing",
]

APPROVED = "approved"
REJECTED = "rejected"
#: The reason code of every rejection a reviewer (or a review's timeout) makes.
REJECTED_BY_REVIEWER = "rejected_by_reviewer"


@dataclass(frozen=True, slots=True)
class ReviewCase:
    """One decision being made on one open review, as a hook sees it.

    ``data`` is the escalated data; ``edited`` the data an approver gave instead (None
    when none was given); ``fields`` the review entry as stored; ``keys`` the key
    layout of the pipeline's server.
    """

    review_id: str
    kind: str
    decision: str
    by: str
    note: str
    correlation_field: str
    correlation_id: str
    data: Any
    edited: Any
    resume_type: str
    reject_type: str
    fields: Mapping[str, str] = field(default_factory=dict)
    keys: StreamKeys | None = None


@dataclass(frozen=True, slots=True)
class ReviewOutcome:
    """What a decision writes (``outputs``, committed with the decision record) and what
    it reports: ``detail`` (one line for the operator) and more keys of the result.
    ``commands`` are more writes for the decision's transaction (a budget raised)."""

    outputs: Sequence[Output] = ()
    detail: str = ""
    result: Mapping[str, Any] = field(default_factory=dict)
    commands: Sequence[tuple[Any, ...]] = ()


#: A kind's approve or reject hook. It may raise :class:`~printery.base.errors.ReviewRefused`
#: (this reviewer may not decide) or :class:`~printery.base.errors.ReviewActionFailed` (its
#: action failed; the review stays open).
ReviewHook = Callable[[ReviewCase], Awaitable[ReviewOutcome]]


async def approve_by_resuming(case: ReviewCase) -> ReviewOutcome:
    """The default approval: one ``resume_type`` entry for the same run, whose data is
    the edited data, else the escalated data; nothing when the review names no type."""
    if not case.resume_type:
        return ReviewOutcome()
    data = case.data if case.edited is None else case.edited
    return ReviewOutcome([Output(
        case.resume_type, data, correlation_id=case.correlation_id,
        idempotency_key=f"{case.resume_type}:{case.correlation_id}:{case.review_id}",
    )])


async def reject_by_refusing(case: ReviewCase) -> ReviewOutcome:
    """The default rejection: one ``reject_type`` entry saying ``rejected``, with the
    reviewer's note as the reason and the escalated data as ``request``."""
    if not case.reject_type:
        return ReviewOutcome()
    reasons = [{"code": REJECTED_BY_REVIEWER, "field": "", "message": case.note}]
    data = {case.correlation_field: case.correlation_id, "status": "rejected",
            "reasons": reasons, "request": case.data}
    return ReviewOutcome([Output(
        case.reject_type, data, correlation_id=case.correlation_id,
        idempotency_key=f"{case.reject_type}:{case.correlation_id}:{case.review_id}",
    )])


@dataclass(frozen=True, slots=True)
class ReviewKind:
    """The behaviour of one review kind: hooks for approve and reject (None: the
    defaults above) and whether an approval may carry edited data."""

    name: str
    approve: ReviewHook | None = None
    reject: ReviewHook | None = None
    accepts_data: bool = True

    def hook(self, decision: str) -> ReviewHook:
        if decision == APPROVED:
            return self.approve or approve_by_resuming
        return self.reject or reject_by_refusing


@dataclass(frozen=True, slots=True)
class Escalation:
    """What an :func:`~printery.escalate` handler writes to review: the kind and the types
    its decisions write, which the escalating step must declare in ``produces``."""

    kind: str
    on_approve: str = ""
    on_reject: str = ""

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for t in (self.on_approve, self.on_reject) if t)


_ESCALATION_ATTR = "__printery_escalation__"


def mark_escalation(handler: Any, escalation: Escalation) -> None:
    """Record on ``handler`` what it escalates to, for the pipeline's build-time check."""
    setattr(handler, _ESCALATION_ATTR, escalation)


def escalation_of(handler: object) -> Escalation | None:
    found = marked(handler, _ESCALATION_ATTR)
    return found if isinstance(found, Escalation) else None
