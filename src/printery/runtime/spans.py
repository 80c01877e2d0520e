"""The entry pipeline's spans while tracing is on (docs/reference.md, Tracing): one span
per handled entry, named after its step, current while its handler runs, and ended once
the commit says what happened. :class:`~printery.runtime.consume.EntryPipeline` asks
:func:`bind_spans` once, as it is built: while tracing is off it gets its own methods back
and no entry does any work for tracing; while on, the same methods wrapped by an
:class:`EntrySpans`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

from printery.base.errors import WorkerCrashed, describe
from printery.observe.telemetry import StepTracer, step_tracer
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Message
from printery.transport.commit import DUPLICATE, FENCED
from printery.wire.fields import TRACEPARENT

__all__ = ["EntrySpans", "HandleEntry", "Spanned", "bind_spans"]


class Spanned(Protocol):
    """What an entry's decision tells its span (the pipeline's ``Decided``)."""

    span: Any
    message: Message | None
    outcome: str
    error: str


D = TypeVar("D", bound=Spanned)
#: Takes an entry through its handler to its decision (None: lost to another consumer).
HandleEntry = Callable[[Delivery, Message], Coroutine[Any, Any, D | None]]
#: The same, given the ``traceparent`` its outputs carry.
RunEntry = Callable[[Delivery, Message, str], Coroutine[Any, Any, D | None]]
#: Accounts for an entry once its commit's ``result`` is known, ``seconds`` after its batch began.
Account = Callable[[D, Any, float], None]


def bind_spans(
    step: str, run: RunEntry[D], account: Account[D]
) -> tuple[EntrySpans | None, HandleEntry[D], Account[D]]:
    """``(spans, handle, account)`` for ``step``'s pipeline: ``run`` and ``account``
    themselves while tracing is off (``run`` then called with two arguments, its
    ``traceparent`` left at its default), else wrapped so each entry is a span."""
    tracer = step_tracer(step)
    if tracer is None:
        return None, cast(HandleEntry[D], run), account
    spans = EntrySpans(tracer)
    return spans, functools.partial(spans.run, run), functools.partial(spans.account, account)


#: What a validation loop's verdict says comes next when the turn that handles it runs
#: another attempt (:mod:`printery.pipeline.loop`): the next one, or the fallback.
_NEXT_ATTEMPT = frozenset({"retry", "fallback"})


class EntrySpans:
    """Spans of one step's entries."""

    def __init__(self, tracer: StepTracer) -> None:
        self.tracer = tracer
        #: The types of the entries a validation loop of this step writes itself (a
        #: loop's are named after it: ``<loop>:attempt``, ``<loop>:verdict``).
        self._attempt_type = f"{tracer.step}:attempt"
        self._verdict_type = f"{tracer.step}:verdict"

    def attempt(self, message: Message) -> int:
        """The attempt a span of ``message``'s turn is: in a validation loop the loop's
        attempt it runs or judges, read from the entry it handles (the turn's span is
        made before the loop reads it): an attempt entry's ``attempt``, or for a verdict
        that asks for another attempt, the one after; elsewhere the entry's
        ``attempt``."""
        envelope = message.envelope
        kind = envelope.type
        if kind != self._attempt_type and kind != self._verdict_type:
            return envelope.attempt if message.attempt == 1 else message.attempt
        data = envelope.data
        n = data.get("attempt") if isinstance(data, dict) else None
        if not isinstance(n, int) or isinstance(n, bool):
            return envelope.attempt
        if kind == self._verdict_type and data.get("next") in _NEXT_ATTEMPT:
            return n + 1
        return n

    async def run(
        self, run: RunEntry[D], delivery: Delivery, message: Message) -> D | None:
        """``run`` the entry inside its span, parented to the span that wrote it, and
        give the outputs the span's ``traceparent``; the span ends in :meth:`end`, or
        here when the entry is lost or the worker stops or crashes meanwhile."""
        tracer, envelope = self.tracer, message.envelope
        span = tracer.start(envelope.extra.get(TRACEPARENT), envelope.correlation_id,
                            self.attempt(message), message.deliveries)
        try:
            with tracer.use(span):
                decided = await run(delivery, message, tracer.traceparent(span))
        except BaseException as exc:
            outcome = "crashed" if isinstance(exc, WorkerCrashed) else "stopped"
            tracer.end(span, outcome, message.costs, describe(exc))
            raise
        if decided is None:
            tracer.end(span, "lost", message.costs)
            return None
        decided.span = span
        if decided.message is None:  # a dead letter: its handler's costs still count
            decided.message = message
        return decided

    def account(self, account: Account[D], item: D, result: Any, seconds: float) -> None:
        """``account`` for ``item``, after ending its span (when it has one)."""
        if item.span is not None:
            self.end(item, result)
        account(item, result, seconds)

    def end(self, item: Spanned, result: Any) -> None:
        """End ``item``'s span with what its commit gave (``result``): its outcome, or
        ``fenced``, ``duplicate``, ``commit_failed``."""
        if isinstance(result, Exception):
            outcome, error = "commit_failed", describe(result)
        else:
            outcome, error = item.outcome, item.error
            if result == FENCED:
                outcome = "fenced"
            elif result == DUPLICATE and outcome == "ok":
                outcome = "duplicate"
        costs = item.message.costs if item.message is not None else {}
        self.tracer.end(item.span, outcome, costs, error)
