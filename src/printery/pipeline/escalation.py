"""Bounded escalation for a step: retry with backoff, then a fallback handler, then the
review stream (a human decides), then a terminal status. Nothing loops for ever."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from printery.pipeline.review_kinds import Escalation, mark_escalation
from printery.rules.limits import mark_fallback
from printery.runtime.failures import CRASH, DOWN, QUOTA, REJECTED, STOP, kind_of
from printery.runtime.handler import Handler, HandlerResult, Message, Output, outputs_of
from printery.runtime.partials import retract
from printery.wire.fields import review_fields
from printery.wire.keys import REVIEW

log = structlog.get_logger("printery.escalation")


def review_output(
    message: Message, *, kind: str, reason: str, data: object = None,
    on_approve: str = "", on_reject: str = "",
) -> Output:
    """A ``review`` entry for ``message``: its data (or ``data``), what escalated and why,
    and the event types an approval (``on_approve``) and a rejection (``on_reject``)
    write (docs/reference.md, Review inbox); the step writing it must declare both in
    ``produces``."""
    return Output(
        REVIEW,
        message.data if data is None else data,
        correlation_id=message.correlation_id,
        idempotency_key=f"{REVIEW}:{kind}:{message.worker}:{message.correlation_id}",
        extra=review_fields(kind=kind, step=message.worker, reason=reason,
                            source_stream=message.stream, source_id=message.entry_id,
                            resume_type=on_approve, reject_type=on_reject),
    )


def escalate(
    handler: Handler,
    *,
    attempts: int,
    fallback: Handler | None = None,
    review_kind: str | None = None,
    on_approve: str = "",
    on_reject: str = "",
    terminal: Callable[[Message, BaseException], HandlerResult] | None = None,
) -> Handler:
    """Wrap ``handler`` so that its failures escalate instead of dead-lettering.

    Deliveries before ``attempts`` re-raise (the runtime redelivers after a backoff). At
    the last attempt the ``fallback`` runs (``Reject`` and ``WorkerCrashed`` are
    deliberate: they are raised through, from the handler or the fallback); if there is
    none or it fails too, a review entry of ``review_kind`` is written (when given)
    together with the ``terminal`` outputs, and the entry is acknowledged: the
    escalation is recorded, not retried. A reviewer's approval writes ``on_approve`` (the
    run resumes there), a rejection ``on_reject``; the pipeline refuses, at build time, a
    step that escalates without declaring ``review`` and both types in its ``produces``.

    A provider that says its quota is gone (:class:`~printery.QuotaExhausted`) sends the
    entry to the ``fallback`` at once, whatever its delivery; so does a ``Limit`` whose
    ``max_wait`` runs out (the handler is not called then). Without a fallback,
    ``QuotaExhausted`` escalates at once to the review and ``terminal`` (when given),
    else it dead-letters the entry with reason code ``quota_exhausted``. A model whose
    circuit breaker is open (:class:`~printery.ProviderDown`) sends the entry to the
    ``fallback`` at once too; without one it is retried (after the breaker's reset) like
    any failure.
    """
    if (on_approve or on_reject) and not review_kind:
        raise ValueError("escalate: on_approve/on_reject need a review_kind")

    async def handle(message: Message) -> HandlerResult:
        if message.over_limit and fallback is not None:  # a limit's max_wait ran out
            done, failure = await _fall_back(fallback, message, attempts)
        else:
            done, failure = await _call(handler, message, attempts, fallback is not None)
            if failure is not None and fallback is not None:
                await _retracted(message, failure)
                done, failure = await _fall_back(fallback, message, attempts)
        if failure is None:
            return done
        await _retracted(message, failure)
        outputs: list[Output] = []
        if review_kind:
            outputs.append(review_output(message, kind=review_kind, reason=str(failure),
                                         on_approve=on_approve, on_reject=on_reject))
        if terminal is not None:
            outputs += outputs_of(terminal(message, failure))
        if not outputs:
            raise failure
        return outputs

    if review_kind:
        mark_escalation(handle, Escalation(review_kind, on_approve, on_reject))
    if fallback is not None:
        mark_fallback(handle, _always)
    return handle


async def _call(
    handler: Handler, message: Message, attempts: int, falls_back: bool = False,
) -> tuple[HandlerResult, BaseException | None]:
    """The handler's result, or the failure that escalates: its last delivery's, or a
    :class:`QuotaExhausted` at once (asking again will not help), as is a
    :class:`ProviderDown` when there is a fallback (``falls_back``) to run instead.
    Earlier failures are raised (the runtime redelivers), as are ``Reject`` and
    ``WorkerCrashed`` (deliberate: dead-lettered at once / the worker crashes)."""
    try:
        return await handler(message), None
    except BaseException as exc:
        kind = kind_of(exc)
        if kind == QUOTA:
            return None, exc
        if kind in (CRASH, REJECTED, STOP):
            raise
        if message.deliveries >= attempts or (kind == DOWN and falls_back):
            return None, exc
        raise


async def _retracted(message: Message, failure: BaseException) -> None:
    """What the failed call showed is not the output (reference: streaming through the
    gate): retracted, and what runs next (the fallback) streams anew."""
    if message.streamed:
        await retract(message, failure)
        message.streamed = False


async def _fall_back(
    fallback: Handler, message: Message, attempts: int
) -> tuple[HandlerResult, BaseException | None]:
    """The fallback's result, or why it failed (then the escalation goes on)."""
    try:
        return await fallback(message), None
    except BaseException as exc:
        kind = kind_of(exc)
        if kind in (CRASH, REJECTED, STOP):
            raise
        if kind != QUOTA and message.over_limit and message.deliveries < attempts:
            raise  # retried as a delivery, which waits for the limit again
        failure = exc  # the fallback's provider's quota too: escalated
    log.warning("fallback failed", worker=message.worker, error=str(failure))
    return None, failure


def _always(message: Message) -> bool:
    """An escalated step's fallback serves any of its entries."""
    return True
