"""One step of a pipeline: a handler with its input and output contracts, its
concurrency, budget, limits and, for a validation loop, the loop's shape.

A step's input and output are pydantic models checked at every boundary: bad input is
dead-lettered with the validation errors as reasons (``reason_code`` ``invalid_input``);
a bad output is a handler bug and fails loudly (counted, retried, then dead-lettered).
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypedDict, TypeVar

from pydantic import BaseModel, ValidationError

from printery.base import _json
from printery.base.errors import OutputContractError, PipelineError, Reject
from printery.base.reason import Reason
from printery.policies.middleware import Middleware
from printery.rules.budgets import Budget, Estimate, check_estimate
from printery.rules.limits import FallsBack, Limit, fallback_of, mark_fallback
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Handler, HandlerResult, Message, outputs_of
from printery.runtime.partials import retract
from printery.runtime.step_context import Companion, StepContext
from printery.wire.fields import REJECT_TYPE, RESUME_TYPE
from printery.wire.keys import REVIEW

_Declared = TypeVar("_Declared", bound=type)


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
    included (a forgotten ``return``), raises :class:`~printery.base.errors.Reject` with
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


class StepOptions(TypedDict, total=False):
    """The options of :data:`STEP_OPTIONS`, typed: what ``**settings`` of
    :meth:`Pipeline.step <printery.Pipeline.step>` (and ``Step(settings=)``) may hold, so
    a type checker catches a misspelt one before the definition refuses it."""

    prefetch: int | None
    parallel: int | None
    block_ms: int
    max_deliveries: int
    visibility_timeout: float
    claim_interval: float | None
    retry_backoff_ms: float
    retry_backoff_cap_ms: float
    record_ttl: float
    handler_timeout: float | None
    stall_timeout: float
    in_flight: int | None


def check_settings(what: str, settings: Mapping[str, Any]) -> None:
    """Refuse an option no step knows (``concurency=3`` would otherwise run with the
    default, silently): a mistake is caught at definition, with the names it could be."""
    unknown = sorted(set(settings) - STEP_OPTIONS)
    if unknown:
        raise PipelineError(
            f"{what}: unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; the options are concurrency, timeout and "
            f"{', '.join(sorted(STEP_OPTIONS))}")


def refuses_unknown_options(kind: str) -> Callable[[_Declared], _Declared]:
    """A class decorator: the class's constructor refuses a keyword it does not take with
    :class:`~printery.PipelineError` naming it and the ones it takes (``Loop(...,
    concurency=3)`` would otherwise be a bare ``TypeError``, or, through ``**options``,
    run with the default). ``kind`` names the definition in the error (``loop 'draft'``).
    Checked once, as the definition is made; the signature is the constructor's own."""

    def decorate(cls: _Declared) -> _Declared:
        init = cls.__init__  # type: ignore[misc]  # the class's own, to be wrapped
        parameters = list(inspect.signature(init).parameters.values())[1:]  # self
        known = tuple(p.name for p in parameters
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

        @functools.wraps(init)
        def checked(self: object, *args: Any, **options: Any) -> None:
            unknown = [k for k in options if k not in known]
            if unknown:
                name = args[0] if args else options.get("name")
                raise PipelineError(_unknown_options(f"{kind} {name!r}", unknown, known))
            init(self, *args, **options)

        setattr(cls, "__init__", checked)  # noqa: B010 - mypy refuses cls.__init__ = ...
        return cls

    return decorate


def _unknown_options(what: str, unknown: Sequence[str], known: Sequence[str]) -> str:
    settings = [k for k in unknown if k in STEP_OPTIONS]
    hint = (f" ({', '.join(settings)}: consumer settings, given under [workers.<step>] of "
            "the config, or as settings= of a Step)" if settings else "")
    return (f"{what}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
            f"{hint}; the options are {', '.join(k for k in known if k != 'name')}")


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


@dataclass(frozen=True, slots=True)
class MapShape:
    """What a :class:`~printery.Map` is made of, for the graph's drawings and checks: its
    steps by role, its types and its bounds (set on its split step, as ``Step.loop`` is on
    a loop's)."""

    name: str
    consumes: str
    produces: str
    item_type: str
    result_type: str
    each: str
    collect: str
    max_items: int
    on_item_failure: str
    #: The exhausted type of a Loop as ``each`` (consumed by the collector, not an
    #: outcome of the run), else None.
    exhausted: str | None = None

    @property
    def steps(self) -> tuple[str, str, str]:
        return (self.name, self.each, self.collect)


class StepSource(Protocol):
    """What :meth:`Pipeline.add <printery.Pipeline.add>` takes: anything that gives its
    steps (a :class:`Step` gives itself; a :class:`~printery.Loop` and an
    :class:`~printery.Aggregator` one step, a :class:`~printery.Map` three, its split
    first). What a combinator is beyond its steps travels on them (``Step.loop``,
    ``Step.map``), and what it needs of the worker that runs it comes through
    ``Step.bind``, so a definition holds no worker's state."""

    def steps(self) -> Sequence[Step]: ...


@dataclass(frozen=True, slots=True)
class BoundStep:
    """A step as one worker runs it (what ``Step.bind`` returns, given the worker's
    :class:`~printery.runtime.step_context.StepContext`): its handler, which may use what
    it was built with (the server, the keys) without the definition holding it, and what
    runs beside its consumers there (closing what the handler opened, say)."""

    handler: Handler
    companions: Sequence[Companion] = ()


@refuses_unknown_options("step")
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
    #: Builds the step's handler for one worker from that worker's
    #: :class:`~printery.runtime.step_context.StepContext`, as the worker is built
    #: (:meth:`Pipeline.build_workers <printery.Pipeline.build_workers>`), in place of
    #: ``handler`` there: for a handler that keeps state of its own in the server (an
    #: aggregator's joins, a Map's counts), so one definition built into two workers
    #: shares nothing between them. None: ``handler`` runs as it is.
    bind: Callable[[StepContext], BoundStep] | None = None
    #: Set on the split step of a :class:`~printery.Map` (what the graph's drawings,
    #: checks and a replay know of it).
    map: MapShape | None = None
    #: The user's :class:`~printery.Middleware` of this step, outermost first, inside the
    #: pipeline's (docs/reference.md, Middleware).
    middleware: tuple[Middleware, ...] = ()

    def steps(self) -> tuple[Step]:
        """The step itself: a step is a :class:`StepSource` of one."""
        return (self,)

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
        self.middleware = middleware_of(self.middleware, f"step {self.name!r}")
        self.limits = tuple(self.limits)
        if self.falls_back is None:
            self.falls_back = fallback_of(self.handler)
        check_estimate(f"step {self.name!r}", self.estimate, self.cost_units)
        check_renamed_from(f"step {self.name!r}", self.name, self.renamed_from)
        for limit in self.limits:
            if not isinstance(limit, Limit):
                raise PipelineError(f"step {self.name!r}: limits holds {limit!r}, not a Limit")

    def guarded_handler(self, inner: Handler | None = None) -> Handler:
        """The handler (or ``inner``, the one ``bind`` built for a worker) wrapped in its
        input and output contracts."""
        inner = self.handler if inner is None else inner
        input_model, output_models = self.input_model, self.output_models
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


def middleware_of(given: Iterable[Any], what: str) -> tuple[Middleware, ...]:
    """``given`` as middleware, refused at definition unless each is a
    :class:`~printery.Middleware` instance (a class passed for an instance, a bare
    function)."""
    if isinstance(given, Middleware):
        given = (given,)
    found = tuple(given)
    for each in found:
        if not isinstance(each, Middleware):
            hint = " (pass an instance: Audit(), not Audit)" if isinstance(each, type) \
                and issubclass(each, Middleware) else ""
            raise PipelineError(f"{what}: middleware= takes printery.Middleware instances, "
                                f"not {each!r}{hint}")
    return found
