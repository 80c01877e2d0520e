"""Validation loops (docs/reference.md, Validation loops): a worker's output is checked,
and while it does not pass the worker runs again, shown every earlier attempt and why it
failed; bounded by ``max_attempts``, then a fallback, then a human, then an exhausted
outcome.

A loop is one step that consumes its own entries, written to one stream of its own
(``<name>:loop``, so that their ids order them exactly; each entry's ``type`` says what
it is):

- its input (``consumes``) runs attempt 1 and writes an ``<name>:attempt`` entry;
- an ``<name>:attempt`` entry is validated and writes an ``<name>:verdict`` entry, with
  ``produces`` when it passed, a review or the exhausted outcome when it was the last;
- a verdict that did not pass with attempts left runs the next attempt (or the fallback).

An attempt whose ``work`` (or fallback) raises is retried as a delivery like any handler
call; on the entry's last delivery (``message.last_delivery``) the failure becomes the
attempt's outcome instead: a failed attempt with the reason ``work_failed`` (its message
the error), judged like one that did not pass, so a model that is down reaches the
fallback, the review and the exhausted outcome rather than the dead-letter stream
(reference: failures). A ``Reject`` from ``work`` still dead-letters at once: it is deliberate.
A :class:`~printery.QuotaExhausted` is a failed attempt at once (reason
``quota_exhausted``, no redelivery) and the loop goes to its fallback without the
attempts left (they would meet the same quota), or, without one, to the review or the
exhausted outcome; a turn that would wait past a ``Limit``'s ``max_wait`` runs the
fallback in place of ``work``.

Each handler call is an ordinary entry, committed atomically with what it writes (its
own ``duration_ms`` and ``cost``), so a crash repeats at most a call that did not commit
and never an attempt: what an attempt sees comes from the entry it handles (every
verdict carries the attempts so far), not from process memory. Each attempt and verdict
has an idempotency key of its own (``<type>:<run>:<n>``), so one run's attempts are
never taken for duplicates of each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from printery.base import _json
from printery.base.errors import (
    PROVIDER_DOWN,
    QUOTA_EXHAUSTED,
    PipelineError,
    ProviderDown,
    Reject,
    StepTimeout,
    describe,
)
from printery.base.reason import Reason
from printery.pipeline.escalation import review_output
from printery.pipeline.step import (
    LoopShape,
    Step,
    check_concurrency,
    check_renamed_from,
    check_timeout,
    checked_reasons,
    refuses_unknown_options,
    validation_reasons,
)
from printery.rules.budgets import Budget, Estimate, check_estimate
from printery.rules.limits import Limit
from printery.runtime.failures import (
    CRASH,
    DOWN,
    QUOTA,
    REJECTED,
    STOP,
    TIMEOUT_KIND,
    kind_of,
)
from printery.runtime.handler import HandlerResult, Message, Output
from printery.runtime.partials import current, retract
from printery.runtime.partials import verdict as publish_verdict
from printery.wire.fields import STREAMED, item_fields, item_key
from printery.wire.keys import REVIEW

__all__ = ["Check", "Loop", "Work"]

log = structlog.get_logger("printery.loop")

#: A loop's worker (or fallback): the attempt's output data, or an awaitable of it.
Work = Callable[[Message], Any]
#: A loop's validator: the reasons the attempt did not pass (empty: passed), as
#: :class:`Reason` values or ``{code, field, message}`` mappings, or an awaitable of them.
Check = Callable[[Message], Any]

#: What a verdict leads to (its ``next`` field).
PASSED, RETRY, FALLBACK, REVIEWED, EXHAUSTED = "passed", "retry", "fallback", "review", "exhausted"
#: The reason code of an attempt whose ``work`` (or fallback) raised on its last delivery.
WORK_FAILED = "work_failed"
#: Seconds one ``work`` or fallback call may take when the loop names no ``timeout``
#: (the default step timeout, docs/reference.md).
DEFAULT_TIMEOUT = 300.0
#: How much later than the loop's own deadline the runtime cancels the call (its step
#: timeout): the loop sees its deadline first, as a failed attempt; the runtime's cancel
#: is the backstop of a call that ignores its cancellation.
TIMEOUT_GRACE = 1.0


@refuses_unknown_options("loop")
class Loop:
    """A validation loop over ``work``, checked by ``validate``; ``pipeline.add`` it.

    ``consumes`` is the loop's input type, ``produces`` the type written with an output
    that passed (both required, except in a Loop given as a :class:`~printery.Map`'s
    ``each``, which the Map wires to its item and result types), ``exhausted`` (default
    ``<name>:exhausted``) the outcome of a run whose attempts all failed: ``{"status":
    "exhausted", "attempts": [...]}``, or the rejection of its review when
    ``review_kind`` is set (an approval writes ``produces`` with the reviewer's data,
    default the last output). ``input_model`` checks the loop's input
    (a bad one is dead-lettered with ``invalid_input``); ``cost_units`` declares what the
    worker and validator may report. ``limits``, ``budget`` and ``timeout`` (seconds, default
    300) apply to every attempt and to the fallback, as they do to a step's handler (a
    ``work`` call past ``timeout`` is a failed attempt). ``estimate`` (``{"tokens": 2000}``
    or a function of the message, which then has the loop's input as its data) is what one
    ``work`` or fallback call is expected to spend, reserved against the run's budget
    before each (reference: budgets); judging an attempt reserves nothing.
    ``renamed_from``: the loop's old name, whose group on ``consumes`` it takes over
    (reference: where a group starts; its own stream ``<name>:loop`` is named after it).
    """

    def __init__(
        self,
        name: str,
        *,
        consumes: str | None = None,
        produces: str | None = None,
        work: Work,
        validate: Check,
        max_attempts: int,
        fallback: Work | None = None,
        review_kind: str | None = None,
        exhausted: str | None = None,
        concurrency: int = 1,
        cost_units: Iterable[str] = (),
        input_model: type[BaseModel] | None = None,
        limits: Iterable[Limit] = (),
        budget: Budget | None = None,
        timeout: float | None = None,
        estimate: Estimate | None = None,
        renamed_from: str | None = None,
    ) -> None:
        what = f"loop {name!r}"
        check_estimate(what, estimate, tuple(cost_units))
        check_renamed_from(what, name, renamed_from)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise PipelineError(f"{what}: max_attempts={max_attempts!r} is not a number of "
                                "attempts; write an integer >= 1 (e.g. max_attempts=3)")
        check_concurrency(what, concurrency)
        check_timeout(what, timeout)
        if budget is not None and not isinstance(budget, Budget):
            raise PipelineError(f"{what}: budget={budget!r} is not a Budget")
        for label, handler in (("work", work), ("validate", validate), ("fallback", fallback)):
            if handler is not None and not callable(handler):
                raise PipelineError(f"{what}: {label}={handler!r} is not callable; write a "
                                    "function of one Message")
        self.name = name
        #: Its types: "" where none was given (a Loop as a Map's ``each``, which the Map
        #: wires to its item and result types).
        self.shape = LoopShape(
            max_attempts=max_attempts, stream_type=f"{name}:loop", attempt_type=f"{name}:attempt",
            verdict_type=f"{name}:verdict", produces=produces or "",
            exhausted=exhausted or f"{name}:exhausted", fallback=fallback is not None,
            review_kind=review_kind or None,
        )
        self.consumes = consumes or ""
        _check_types(what, self.consumes, self.shape, given=(consumes, produces))
        self.work, self.validate, self.fallback = work, validate, fallback
        self.concurrency = concurrency
        self.cost_units = tuple(cost_units)
        self.input_model = input_model
        self.limits = tuple(limits)  # checked by the Step
        self.budget = budget
        self.estimate = estimate
        self.renamed_from = renamed_from
        self.timeout = float(timeout) if timeout is not None else None
        #: Seconds one ``work`` or fallback call may take before it is a failed attempt.
        self.call_timeout = self.timeout if self.timeout is not None else DEFAULT_TIMEOUT

    @property
    def wired(self) -> bool:
        """Whether the loop knows what it reads and writes (a Loop left without
        ``consumes`` and ``produces`` is wired by the Map it is the ``each`` of)."""
        return bool(self.consumes and self.shape.produces)

    def wired_to(self, consumes: str, produces: str) -> Loop:
        """This loop reading ``consumes`` and writing ``produces`` (what a
        :class:`~printery.Map` does with a Loop as its ``each``: its item and result types);
        a type the loop was given must be that one. A new declaration: this one is left
        as it is."""
        wrong = [f"{label}={want!r} (it has {have!r})" for label, want, have in (
            ("consumes", consumes, self.consumes), ("produces", produces, self.shape.produces))
            if have and have != want]
        if wrong:
            raise PipelineError(f"loop {self.name!r}: {' and '.join(wrong)} needed here")
        wired = copy.copy(self)
        wired.consumes = consumes
        wired.shape = dataclasses.replace(self.shape, produces=produces)
        _check_types(f"loop {self.name!r}", consumes, wired.shape, given=(consumes, produces))
        return wired

    def steps(self) -> tuple[Step]:
        """The loop's one step (what :meth:`Pipeline.add <printery.Pipeline.add>` adds
        when given the loop)."""
        return (self.step(),)

    def step(self) -> Step:
        """The loop as a pipeline step."""
        if not self.wired:
            raise PipelineError(
                f"loop {self.name!r}: consumes and produces are required (only a Loop given as "
                "a Map's each may leave them out: the Map gives its item and result types)")
        shape = self.shape
        produces = [*shape.internal, shape.produces, shape.exhausted]
        if shape.review_kind:
            produces.append(REVIEW)
        model = self.input_model
        return Step(
            name=self.name, consumes=(self.consumes, *shape.internal), produces=tuple(produces),
            handler=self.handle, concurrency=self.concurrency, cost_units=self.cost_units,
            input_check=(lambda data: _model_reasons(model, data)) if model is not None else None,
            loop=shape, limits=tuple(self._keyed_by_input(limit) for limit in self.limits),
            budget=self.budget,
            timeout=self.call_timeout + TIMEOUT_GRACE,
            falls_back=self._calls_work if self.fallback is not None else None,
            estimate=self._estimate if self.estimate is not None else None,
            renamed_from=self.renamed_from,
        )

    def _calls_work(self, message: Message) -> bool:
        """Whether ``message``'s turn calls ``work`` (or the fallback): the turns a
        ``max_wait`` may send to the fallback and an estimate is reserved for; judging an
        attempt waits and reserves nothing."""
        if message.type == self.consumes:
            return True
        data = message.data
        return (message.type == self.shape.verdict_type and isinstance(data, dict)
                and data.get("next") in (RETRY, FALLBACK))

    def _estimate(self, message: Message) -> Mapping[str, float] | None:
        """What ``message``'s turn reserves: the loop's estimate for a turn that calls
        ``work`` (a function of it sees the loop's input), else nothing."""
        estimate = self.estimate
        if estimate is None or not self._calls_work(message):
            return None
        if not callable(estimate):
            return estimate
        return estimate(self._given(message))

    def _given(self, message: Message) -> Message:
        """``message`` as the loop was given it, whichever of its entries it is: the
        loop's input as ``data`` (an attempt and a verdict carry it), typed as the input,
        with the attempt its turn is about and the feedback so far. What the loop's user
        functions of a message (a limit's key, ``estimate``) see, so that
        ``m.data["tenant"]`` means the same on every turn. An entry of another shape
        raises (the caller's entry fails: its key or estimate is invalid)."""
        if message.type == self.consumes:
            return message
        data = message.data
        if message.type == self.shape.attempt_type:
            return _seen(message, data["input"], self.consumes, data["attempt"],
                         data["feedback"])
        return _seen(message, data["input"], self.consumes, data["attempt"] + 1,
                     data["attempts"])

    def _keyed_by_input(self, limit: Limit) -> Limit:
        """``limit`` with its key function called on :meth:`_given` (a string key as it
        is); named as the user's function, so labels are unchanged."""
        if not isinstance(limit, Limit) or isinstance(limit.key, str):
            return limit  # (what is no Limit, the Step refuses)
        key = limit.key
        given = self._given

        @functools.wraps(key)
        def keyed(message: Message) -> str:
            return key(given(message))

        keyed.__name__ = getattr(key, "__name__", "key")  # a callable object has none
        return dataclasses.replace(limit, key=keyed)

    async def handle(self, message: Message) -> HandlerResult:
        """One turn of the loop, chosen by the type of the entry handled."""
        shape, data = self.shape, message.data
        if message.type == self.consumes:
            reasons = _model_reasons(self.input_model, data)
            if reasons:
                raise Reject("invalid_input", _json.dumps([r.as_dict() for r in reasons]))
            return await self._attempt(message, data, 1, [], fallback=bool(message.over_limit))
        if message.type == shape.attempt_type:
            return await self._judge(message, data)
        if message.type == shape.verdict_type:
            if data["next"] in (RETRY, FALLBACK):
                return await self._attempt(
                    message, data["input"], data["attempt"] + 1, data["attempts"],
                    fallback=data["next"] == FALLBACK or bool(message.over_limit))
            return None  # decided when it was written
        raise Reject("invalid_input", f"{message.type!r} is not an entry of loop {self.name!r}")

    async def _attempt(self, message: Message, given: Any, n: int,
                       feedback: Sequence[Mapping[str, Any]], *, fallback: bool) -> Output:
        run = self.fallback if fallback else self.work
        assert run is not None  # a FALLBACK verdict is only written when there is one
        seen = _seen(message, given, self.consumes, n, feedback)
        entry: dict[str, Any] = {"attempt": n, "fallback": fallback, "data": None,
                                 "input": given, "feedback": list(feedback)}
        label = "fallback" if fallback else "work"
        if message.over_limit:
            entry["over_limit"] = message.over_limit
        try:
            try:
                began = time.monotonic()
                try:
                    async with asyncio.timeout(self.call_timeout):
                        entry["data"] = await _output(run(seen), seen)
                except TimeoutError as exc:
                    raise self._past(label) from exc
                if time.monotonic() - began > self.call_timeout:  # a blocking call's
                    raise self._past(label)  # result, returned past its deadline: not used
            except BaseException as exc:
                kind = kind_of(exc)
                if kind == QUOTA:  # asking again will not help: judged now
                    entry["failed"] = _failure(message, exc, f"{label} raised {describe(exc)}",
                                               QUOTA_EXHAUSTED)
                elif kind == DOWN:  # a breaker open: to the fallback now, if any
                    assert isinstance(exc, ProviderDown)
                    entry["failed"] = self._down(message, exc, label, fallback=fallback)
                elif kind in (CRASH, REJECTED, STOP) or not message.last_delivery:
                    raise  # deliberate, a stop, or retried as a delivery like any failure
                else:
                    entry["failed"] = _failure(message, exc, str(exc) if kind == TIMEOUT_KIND
                                               else f"{label} raised {describe(exc)}")
        except BaseException as exc:
            if seen.streamed:  # this delivery's partials are retracted; the next streams anew
                await retract(seen, exc)
            raise
        if not seen.streamed:
            return _entry(self.shape, self.shape.attempt_type, message, n, entry)
        writer = current()  # its partials are on the server before the attempt commits
        if writer is not None:
            await writer.flush()
        return _entry(self.shape, self.shape.attempt_type, message, n, entry, {STREAMED: str(n)})

    def _past(self, label: str) -> StepTimeout:
        """The failure of a call of ``label`` past the loop's timeout."""
        return StepTimeout(f"{label} did not finish within its timeout of {self.call_timeout:g} s")

    def _down(self, message: Message, exc: ProviderDown, label: str, *,
              fallback: bool) -> dict[str, str]:
        """An attempt that met an open circuit breaker: failed at once (``provider_down``)
        when the loop has a fallback to run instead; else raised, retried after the
        breaker's reset like any failure, and on the last delivery a failed attempt."""
        to_fallback = not fallback and self.fallback is not None
        if not to_fallback and not message.last_delivery:
            raise exc
        return _failure(message, exc, f"{label} raised {describe(exc)}",
                        PROVIDER_DOWN if to_fallback else WORK_FAILED)

    async def _judge(self, message: Message, attempt: Mapping[str, Any]) -> list[Output]:
        shape, n, output = self.shape, attempt["attempt"], attempt["data"]
        fallback, feedback = bool(attempt.get("fallback")), attempt["feedback"]
        failed = attempt.get("failed")
        if failed:  # its work raised on its last delivery: failed, nothing to validate
            reasons = [dict(failed)]
        else:
            seen = _seen(message, output, shape.attempt_type, n, feedback)
            try:
                found = await _settled(self.validate(seen))
                reasons = [r.as_dict() for r in checked_reasons(
                    found, f"loop {self.name!r}: validate")]
            except BaseException as exc:  # a gate that fails closed retracts what was shown
                if message.fields.get(STREAMED):
                    await retract(dataclasses.replace(message, attempt=n), exc)
                raise
        if message.fields.get(STREAMED):  # followers learn what became of its partials
            await publish_verdict(dataclasses.replace(message, attempt=n), passed=not reasons,
                                  reasons=reasons)
        record: dict[str, Any] = {"attempt": n, "data": output, "reasons": reasons}
        if fallback:
            record["fallback"] = True
        attempts = [*feedback, record]
        quota = isinstance(failed, dict) and failed.get("code") in (QUOTA_EXHAUSTED,
                                                                    PROVIDER_DOWN)
        if not reasons:
            then = PASSED
        elif not fallback and n < shape.max_attempts and not quota:
            then = RETRY
        elif not fallback and shape.fallback:
            then = FALLBACK
        else:
            then = REVIEWED if shape.review_kind else EXHAUSTED
        outputs = [_entry(shape, shape.verdict_type, message, n, {
            "attempt": n, "fallback": fallback, "passed": not reasons, "reasons": reasons,
            "next": then, "input": attempt["input"], "attempts": attempts})]
        carried = item_fields(message.envelope.extra)
        if then == PASSED:
            outputs.append(_ended(shape.produces, output, message, carried))
        elif then == REVIEWED:
            assert shape.review_kind is not None
            last = _last_output(attempts)  # None when no attempt produced one
            outputs.append(review_output(
                _seen(message, last, shape.attempt_type, n, feedback), kind=shape.review_kind,
                reason=_summary(attempts), data=last, on_approve=shape.produces,
                on_reject=shape.exhausted))
        elif then == EXHAUSTED:
            outputs.append(_ended(shape.exhausted, {"status": "exhausted", "attempts": attempts},
                                  message, carried))
        return outputs


def _check_types(what: str, consumes: str, shape: LoopShape,
                 given: tuple[str | None, str | None]) -> None:
    """Refuse a loop whose types are not distinct, or a type given empty (a type not
    given, None, is the Map's to give)."""
    types = [t for t in (consumes, shape.produces) if t]
    types += [shape.exhausted, *shape.internal, shape.attempt_type, shape.verdict_type]
    if (len(set(types)) != len(types) or not all(types)
            or any(t is not None and not t for t in given)):
        raise PipelineError(f"{what}: consumes, produces and exhausted must be distinct "
                            f"event types other than {list(shape.internal)}; got "
                            f"{[given[0], given[1], shape.exhausted]}")


def _entry(shape: LoopShape, event_type: str, message: Message, n: int, data: Any,
           extra: Mapping[str, str] | None = None) -> Output:
    """An attempt or a verdict: in the loop's stream, typed, keyed by its number (the
    run's attempts are not duplicates of each other; a Map item's, keyed by its item
    too, carry the item's fields on)."""
    carried = item_fields(message.envelope.extra)
    key = item_key(event_type, message.correlation_id, carried)
    return Output(shape.stream_type, data, idempotency_key=f"{key}:{n}",
                  extra={"type": event_type, **carried, **(extra or {})})


def _ended(event_type: str, data: Any, message: Message, carried: dict[str, str]) -> Output:
    """What the loop ends with: for a Map item (the loop as its ``each``) keyed by the
    item and carrying its fields, so its collector can tell the items apart."""
    if not carried:
        return Output(event_type, data)
    return Output(event_type, data, idempotency_key=item_key(
        event_type, message.correlation_id, carried), extra=carried)


async def _output(value: Any, seen: Message) -> Any:
    """What a ``work`` call gave: its value, awaited; an async generator's text chunks
    are each shown as a partial, and joined are the output."""
    if not inspect.isasyncgen(value):
        return await _settled(value)
    chunks: list[str] = []
    async with contextlib.aclosing(value) as chunked:
        async for chunk in chunked:
            if not isinstance(chunk, str):
                raise TypeError(f"a streaming work yields text (str), not "
                                f"{type(chunk).__name__}")
            chunks.append(chunk)
            await seen.partial(chunk)
    return "".join(chunks)


def _seen(message: Message, data: Any, event_type: str, attempt: int,
          feedback: Sequence[Mapping[str, Any]]) -> Message:
    """The message a worker or validator sees: the same delivery (its cost is the
    entry's) with ``data`` in place of the loop's bookkeeping."""
    envelope = dataclasses.replace(message.envelope, data=data, type=event_type)
    return dataclasses.replace(message, envelope=envelope, attempt=attempt,
                               feedback=list(feedback))


async def _settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _failure(message: Message, exc: BaseException, said: str,
             code: str = WORK_FAILED) -> dict[str, str]:
    """The reason of a failed attempt (what its verdict and feedback show), logged with
    its traceback: the runtime does not see this failure. An exhausted quota is an
    expected answer of a provider, not a defect: it is logged without one."""
    if code in (QUOTA_EXHAUSTED, PROVIDER_DOWN):
        log.info("loop attempt out of quota or its provider down: to the fallback", worker=message.worker,
                 entry_id=message.entry_id, correlation_id=message.correlation_id,
                 error=said)
    else:
        log.warning("loop attempt failed", worker=message.worker, entry_id=message.entry_id,
                    correlation_id=message.correlation_id, deliveries=message.deliveries,
                    error=said, exc_info=exc)
    return {"code": code, "field": "", "message": said}


def _last_output(attempts: Sequence[Mapping[str, Any]]) -> Any:
    """The output of the last attempt that produced one (a failed attempt has none)."""
    for record in reversed(attempts):
        reasons = record["reasons"]
        if not (len(reasons) == 1 and reasons[0]["code"] in (WORK_FAILED, QUOTA_EXHAUSTED,
                                                             PROVIDER_DOWN)
                and record["data"] is None):
            return record["data"]
    return None


def _model_reasons(model: type[BaseModel] | None, data: Any) -> list[Reason]:
    if model is None:
        return []
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return validation_reasons(exc)
    return []


def _summary(attempts: Sequence[Mapping[str, Any]]) -> str:
    """The review's reason: how many attempts failed, and the last one's reasons."""
    last = attempts[-1]["reasons"]
    said = "; ".join(f"{r['code']}" + (f" ({r['field']})" if r["field"] else "") +
                     (f": {r['message']}" if r["message"] else "") for r in last)
    failed = f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    return f"{failed} did not pass validation; the last: {said}"
