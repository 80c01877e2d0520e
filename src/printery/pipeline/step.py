"""One step of a pipeline: a handler with its input and output contracts, its
concurrency, budget, limits and, for a validation loop, the loop's shape.

A step's input and output are pydantic models checked at every boundary: bad input is
dead-lettered with the validation errors as reasons (``reason_code`` ``invalid_input``);
a bad output is a handler bug and fails loudly (counted, retried, then dead-lettered).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from printery import _json
from printery.budgets import Budget, Estimate, check_estimate
from printery.errors import OutputContractError, PipelineError, Reject
from printery.fields import REJECT_TYPE, RESUME_TYPE
from printery.keys import REVIEW
from printery.limits import FallsBack, Limit, fallback_of, mark_fallback
from printery.reason import Reason
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Handler, HandlerResult, Message, outputs_of
from printery.runtime.partials import retract
from printery.runtime.step_context import Companion, StepContext


def validation_reasons(error: ValidationError) -> list[Reason]:
    """Pydantic errors as machine-actionable reasons (``field`` is a dotted/indexed path)."""
    reasons = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        code = {"missing": "missing_field", "extra_forbidden": "unknown_field"}.get(
            item["type"], "invalid_field")
        reasons.append(Reason(code=code, field=path, message=item["msg"]))
    return reasons


#: The ``reason_code`` of an entry whose validator answered something that is not a list
#: of reasons (reference: failures: a gate fails closed).
VALIDATOR_ERROR = "validator_error"
_MAPPING_KEYS = frozenset({"code", "field", "message"})


def checked_reasons(found: Any, what: str) -> list[Reason]:
    """A validator's answer as reasons, failing closed (reference: failures): a list (or any
    sequence but a string) of :class:`Reason`, each with a non-empty string ``code``,
    or of ``{"code", "field", "message"}`` mappings whose values are strings (``code``
    non-empty; ``field`` and ``message`` may be left out). Anything else, ``None``
    included (a forgotten ``return``), raises :class:`~printery.errors.Reject` with
    ``validator_error``: never a pass, never a guess (``1`` is not taken for ``"1"``).
    ``what`` names the validator in the error."""
    if not isinstance(found, Sequence) or isinstance(found, (str, bytes, bytearray)):
        raise _refused(what, found, "it must return a list of Reason (empty: passed)")
    reasons = []
    for item in found:
        if isinstance(item, Reason):
            if not isinstance(item.code, str) or not item.code.strip():
                raise _refused(what, found, f"{item!r} has no code")
            if not isinstance(item.field, str) or not isinstance(item.message, str):
                raise _refused(what, found, f"{item!r}: field and message must be strings")
            reasons.append(item)
        elif isinstance(item, Mapping):
            code = item.get("code")
            if not isinstance(code, str) or not code.strip():
                raise _refused(what, found, f"{item!r} has no code (a non-empty string)")
            unknown = set(item) - _MAPPING_KEYS
            wrong = [k for k in ("field", "message") if not isinstance(item.get(k, ""), str)]
            if unknown or wrong:
                raise _refused(what, found, f"{item!r}: a reason is a code, a field and a "
                                            "message, each a string")
            reasons.append(Reason(code, item.get("field", ""), item.get("message", "")))
        else:
            raise _refused(what, found, f"{item!r} is not a Reason")
    return reasons


def _refused(what: str, found: Any, why: str) -> Reject:
    return Reject(VALIDATOR_ERROR, f"{what} returned {reprlib.repr(found)}: {why}")


def check_concurrency(what: str, concurrency: object) -> None:
    """Refuse a consumer count below 1 when the pipeline is defined: a worker with no
    consumer would start, report healthy and never read an entry."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise PipelineError(
            f"{what}: concurrency={concurrency!r} is not a number of consumers; write an "
            "integer >= 1 (e.g. concurrency=1), or leave it out for the default of 1"
        )


def check_timeout(what: str, timeout: object) -> None:
    """Refuse a step timeout that is not a positive number of seconds (None: the default)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise PipelineError(
            f"{what}: timeout={timeout!r} is not a number of seconds; write a number > 0 "
            "(e.g. timeout=60), or leave it out for the default of 300"
        )


#: The options a step takes beyond its named parameters: the fields of
#: :class:`ConsumerSettings` it may set for itself (``concurrency`` and ``timeout`` are
#: parameters of their own).
STEP_OPTIONS = frozenset(f.name for f in fields(ConsumerSettings)) - {"concurrency", "timeout"}


def check_settings(what: str, settings: Mapping[str, Any]) -> None:
    """Refuse an option no step knows (``concurency=3`` would otherwise run with the
    default, silently): a mistake is caught at definition, with the names it could be."""
    unknown = sorted(set(settings) - STEP_OPTIONS)
    if unknown:
        raise PipelineError(
            f"{what}: unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; the options are concurrency, timeout and "
            f"{', '.join(sorted(STEP_OPTIONS))}")


def check_renamed_from(what: str, name: str, renamed_from: object) -> None:
    """Refuse a ``renamed_from`` that is not another name (None: not renamed)."""
    if renamed_from is None:
        return
    if not isinstance(renamed_from, str) or not renamed_from or renamed_from == name:
        raise PipelineError(
            f"{what}: renamed_from={renamed_from!r} is not the step's old name; write the "
            "name its consumer groups had (a non-empty string other than its name), or "
            "leave it out")


@dataclass(frozen=True, slots=True)
class LoopShape:
    """What makes a step a declared validation loop (:class:`~printery.Loop`): the stream
    it writes to itself (``stream_type``: its attempts and verdicts, typed
    ``attempt_type`` and ``verdict_type``; the only cycle a pipeline accepts), where it
    ends, and its bounds, for the graph check and its drawings."""

    max_attempts: int
    stream_type: str
    attempt_type: str
    verdict_type: str
    produces: str
    exhausted: str
    fallback: bool = False
    review_kind: str | None = None

    @property
    def internal(self) -> tuple[str, ...]:
        """The types only the loop itself writes and reads."""
        return (self.stream_type,)


class StepSource(Protocol):
    """Anything that builds its step (a :class:`~printery.Loop`, an
    :class:`~printery.Aggregator`): :meth:`Pipeline.add` takes it as it takes a step."""

    def step(self) -> Step: ...


@dataclass(slots=True)
class Step:
    """One node of a pipeline: a worker consuming ``consumes`` and producing ``produces``."""

    name: str
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    handler: Handler
    concurrency: int = 1
    depends_on: tuple[str, ...] = ()
    input_model: type[BaseModel] | None = None
    output_models: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    companions: Sequence[Companion] = ()
    #: Called with each worker's :class:`~printery.runtime.step_context.StepContext` as
    #: the worker is built, before it runs: for a handler that keeps state of its own in
    #: the server (an aggregator's joins).
    on_context: Callable[[StepContext], None] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    cost_units: tuple[str, ...] = ()
    #: Why ``data`` is not valid input of this step, for a check before anything is
    #: written (:meth:`~printery.Client.submit`); unset, ``input_model`` decides. Unlike
    #: ``input_model`` it does not guard the handler, which decides what invalid input
    #: becomes (the deployment validator turns it into ``deployment:rejected``).
    input_check: Callable[[Any], Sequence[Reason]] | None = None
    #: The step's own share of one run's spending (docs/reference.md, Budgets).
    budget: Budget | None = None
    #: Flow control (docs/reference.md, Flow control): every handler call waits for all of
    #: them.
    limits: Sequence[Limit] = ()
    #: Set on the step of a declared validation loop (built by :class:`~printery.Loop`).
    loop: LoopShape | None = None
    #: Seconds a handler call may run before it is cancelled and the attempt fails with
    #: ``reason_code`` ``timeout`` (reference: failures); None: ``[workers.<step>] timeout``,
    #: else the default (300 s).
    timeout: float | None = None
    #: Whether the step has a fallback to run for a message in place of its handler when
    #: a limit's ``max_wait`` runs out (None: found on ``handler``, as ``escalate`` marks
    #: it; else none).
    falls_back: FallsBack | None = None
    #: What one handler call is expected to spend (``{"tokens": 2000}`` or a function of
    #: the message), reserved against the run's budget before it runs (reference:
    #: budgets); None: nothing reserved.
    estimate: Estimate | None = None
    #: The step's name before a rename (docs/reference.md, Where a group starts): at start
    #: its consumer groups take the old name's place (position and pending entries)
    #: instead of starting at the end of their streams.
    renamed_from: str | None = None

    def input_reasons(self, data: Any) -> list[Reason]:
        """Why ``data`` is not valid input of this step (empty: it is)."""
        if self.input_check is not None:
            try:  # fails closed (reference: failures): an answer that is no list of reasons refuses
                return checked_reasons(self.input_check(data), f"step {self.name!r}: input_check")
            except Reject as exc:
                return [Reason(exc.reason_code, "", str(exc))]
        if self.input_model is not None:
            try:
                self.input_model.model_validate(data)
            except ValidationError as exc:
                return validation_reasons(exc)
        return []

    def __post_init__(self) -> None:
        check_settings(f"step {self.name!r}", self.settings)
        check_concurrency(f"step {self.name!r}", self.concurrency)
        check_timeout(f"step {self.name!r}", self.timeout)
        self.limits = tuple(self.limits)
        if self.falls_back is None:
            self.falls_back = fallback_of(self.handler)
        check_estimate(f"step {self.name!r}", self.estimate, self.cost_units)
        check_renamed_from(f"step {self.name!r}", self.name, self.renamed_from)
        for limit in self.limits:
            if not isinstance(limit, Limit):
                raise PipelineError(f"step {self.name!r}: limits holds {limit!r}, not a Limit")

    def guarded_handler(self) -> Handler:
        """The handler wrapped in its input and output contracts."""
        inner, input_model, output_models = self.handler, self.input_model, self.output_models
        produces, estimate = set(self.produces), self.estimate

        async def handle(message: Message) -> HandlerResult:
            if estimate is not None:  # charged by a model call that reports no usage
                message.estimate = estimate
            if input_model is not None:
                try:
                    input_model.model_validate(message.data)
                except ValidationError as exc:
                    reasons = [r.as_dict() for r in validation_reasons(exc)]
                    raise Reject("invalid_input", _json.dumps(reasons)) from None
            try:
                outputs = outputs_of(await inner(message))
                for out in outputs:
                    if out.type not in produces:
                        raise OutputContractError(
                            f"{self.name} emitted undeclared type {out.type!r}")
                    if out.type == REVIEW:
                        _check_review_types(self.name, out.extra, produces)
                    model = output_models.get(out.type)
                    if model is not None:
                        try:
                            model.model_validate(out.data)
                        except ValidationError as exc:
                            raise OutputContractError(
                                f"{self.name} output {out.type}: {exc}") from exc
                for unit in message.costs:
                    if unit not in self.cost_units:
                        raise OutputContractError(
                            f"{self.name} reported undeclared cost unit {unit!r}")
            except BaseException as exc:
                if message.streamed:  # what it showed is retracted; the next call streams anew
                    await retract(message, exc)
                raise
            # Its verdict (passed) goes once its outputs are encoded, before the commit
            # (the entry pipeline): an output that cannot be written retracts it instead.
            return outputs

        mark_fallback(handle, self.falls_back)  # for the runtime's limit gate
        return handle


def _check_review_types(step: str, extra: Mapping[str, str], produces: set[str]) -> None:
    """A review's decisions write its resume/reject types on the step's behalf: the step
    must declare them, so the graph knows who produces what a decision writes."""
    for name in (RESUME_TYPE, REJECT_TYPE):
        event_type = extra.get(name)
        if event_type and event_type not in produces:
            raise OutputContractError(
                f"{step} escalated with {name} {event_type!r}, which it does not produce"
            )
