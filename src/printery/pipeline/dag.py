"""Explicit pipelines: steps (:mod:`printery.pipeline.step`) that consume and produce
event types, validated as a graph before anything runs, and turned into supervised
stream workers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields as dc_fields
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from printery.base.errors import PipelineError
from printery.base.reason import Reason
from printery.pipeline.budget_review import budget_review_kind
from printery.pipeline.review_kinds import ReviewHook, ReviewKind, escalation_of
from printery.pipeline.step import (
    LoopShape,
    MapShape,
    Step,
    StepOptions,
    StepSource,
    middleware_of,
)
from printery.policies.middleware import Middleware
from printery.rules.budgets import (
    BUDGET_EXCEEDED,
    BUDGET_REVIEW_KIND,
    BUDGET_WARNING,
    Budget,
    BudgetPlan,
    Estimate,
)
from printery.rules.limits import Limit
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.groups import place_pipeline_groups
from printery.runtime.handler import Handler
from printery.runtime.observe import Observer
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_index import RunIndex
from printery.runtime.stream_worker import StreamWorker
from printery.store import Redis
from printery.supervisor.levels import find_cycle
from printery.transport.groups import Reader
from printery.wire.envelope import MAX_RUN_ID, Codec
from printery.wire.envelope import run_id_problem as run_id_problem  # where the runs layer finds it
from printery.wire.keys import (
    DLQ,
    REVIEW,
    REVIEW_DECIDED,
    RUN_CANCELLED,
    RUN_FAILED,
    StreamKeys,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _statuses(success: Iterable[str]) -> tuple[str, ...]:
    """``Pipeline(success=...)`` checked: one or more status names (a bare string would
    be taken letter by letter, so it is refused too)."""
    if isinstance(success, str):
        raise PipelineError(f"success must be a tuple of statuses, not the string {success!r}: "
                            f"write success=({success!r},)")
    statuses = tuple(success)
    if not statuses:
        raise PipelineError("success must name at least one status")
    bad = [s for s in statuses if not isinstance(s, str) or run_id_problem(s) is not None]
    if bad:
        raise PipelineError(f"success: {bad!r} are not status names (strings of 1 to "
                            f"{MAX_RUN_ID} characters, no control character)")
    return statuses


#: What ``Pipeline(on_failure=)`` takes: a failed run's other branches stop, or go on.
ON_FAILURE = ("cancel", "continue")

#: Streams that record rather than carry a run forward: never a run's outcome.
_RECORDS = frozenset({DLQ, REVIEW, REVIEW_DECIDED})


class Pipeline:
    """A named DAG of steps over one stream prefix.

    ``ingress`` lists the event types that come from outside (producers); every other
    consumed type must be produced by a step. ``correlation_field`` is the wire name of
    the id that ties one run's events together; ``terminal`` lists types nobody consumes
    on purpose (records such as a review stream). ``cost_units`` declares the units
    handlers may report, so a typo cannot create unbounded metric labels. ``outcomes``
    are the event types whose first entry ends a run (docs/reference.md, The API: /v1); by
    default the types some step produces and no step consumes. ``budget`` limits what one
    run may spend (docs/reference.md, Budgets); ``budget:exceeded`` then ends a run too.
    ``success`` names the run statuses that count as success: ``printery watch`` and
    ``printery emit --wait`` exit 0 for them, 1 for any other.
    """

    def __init__(
        self,
        name: str,
        *,
        ingress: Iterable[str],
        correlation_field: str = "correlation_id",
        id_prefix: str = "cor",
        cost_units: Iterable[str] = (),
        extra_types: Iterable[str] = (),
        outcomes: Iterable[str] | None = None,
        budget: Budget | None = None,
        success: Iterable[str] = ("succeeded",),
        middleware: Iterable[Middleware] = (),
        on_failure: str = "cancel",
        run_timeout: float | None = None,
    ) -> None:
        self.name = name
        if on_failure not in ON_FAILURE:
            raise PipelineError(f"on_failure must be one of {', '.join(ON_FAILURE)}, not "
                                f"{on_failure!r}")
        if run_timeout is not None and not (isinstance(run_timeout, int | float)
                                            and not isinstance(run_timeout, bool)
                                            and 0 < run_timeout < float("inf")):
            raise PipelineError(f"run_timeout must be a positive number of seconds, not "
                                f"{run_timeout!r}")
        #: What a failed run's other branches do (reference: Cancelling a run):
        #: ``cancel`` stops them, ``continue`` lets them go on.
        self.on_failure = on_failure
        #: Seconds a run may run from its submit before it is cancelled (None: no limit).
        self.run_timeout = None if run_timeout is None else float(run_timeout)
        #: Around every step's calls, outside each step's own (docs/reference.md, Middleware).
        self.middleware = middleware_of(middleware, f"pipeline {name!r}")
        self.success = _statuses(success)
        self.ingress = tuple(ingress)
        self.correlation_field = correlation_field
        self.id_prefix = id_prefix
        self.cost_units = tuple(cost_units)
        self.extra_types = tuple(extra_types)
        self._outcomes = tuple(outcomes) if outcomes is not None else None
        self.steps: dict[str, Step] = {}
        self.review_kinds: dict[str, ReviewKind] = {}
        self.budget = budget
        self._check_budget(budget, "the pipeline")

    @property
    def maps(self) -> dict[str, MapShape]:
        """The Maps added (reference: fan-out), by name: each is three of ``steps``, its
        split (named after it) carrying its shape."""
        return {s.map.name: s.map for s in self.steps.values() if s.map is not None}

    @property
    def outcomes(self) -> tuple[str, ...]:
        """The event types whose first entry of a run ends it: as declared, else the
        types some step produces and none consumes (records such as ``review`` aside);
        and in either case every loop's exhausted type and, with budgets,
        ``budget:exceeded`` (docs/reference.md, The API: /v1)."""
        collected = {m.exhausted for m in self.maps.values()}  # a Map's Loop's: its item failed
        exhausted = [s.loop.exhausted for s in self.steps.values()
                     if s.loop is not None and s.loop.exhausted not in collected]
        ended = [*exhausted, *((BUDGET_EXCEEDED,) if self.has_budgets else ()), RUN_FAILED,
                 RUN_CANCELLED]
        if self._outcomes is not None:
            return tuple(dict.fromkeys([*self._outcomes, *ended]))
        consumed = {t for step in self.steps.values() for t in step.consumes}
        return tuple(dict.fromkeys([*(t for step in self.steps.values() for t in step.produces
                                      if t not in consumed and t not in _RECORDS), *ended]))

    @property
    def has_budgets(self) -> bool:
        """Whether the pipeline or any step has a budget (else nothing is counted)."""
        return self.budget is not None or any(s.budget for s in self.steps.values())

    def budget_plan(self, step: Step) -> BudgetPlan | None:
        """What ``step`` checks and charges, or None in a pipeline without budgets."""
        if not self.has_budgets:
            return None
        return BudgetPlan(step.name, step.cost_units, self.budget, step.budget, step.estimate)

    def _check_budget(self, budget: Budget | None, what: str) -> None:
        if budget is None:
            return
        unknown = [u for u in budget.limits if u not in self.cost_units]
        if unknown:
            raise PipelineError(f"{what}: budget on undeclared cost units {unknown}; "
                                f"declare them in Pipeline(cost_units=...)")
        if budget.on_exceeded == "review" and BUDGET_REVIEW_KIND not in self.review_kinds:
            self.review_kinds[BUDGET_REVIEW_KIND] = budget_review_kind()

    def ingress_step(self, event_type: str) -> Step | None:
        """The step that takes ``event_type`` from outside (the first one declared)."""
        return next((s for s in self.steps.values() if event_type in s.consumes), None)

    def input_reasons(self, event_type: str, data: Any) -> list[Reason]:
        """Why ``data`` is not valid as an ingress entry of ``event_type``: the ingress
        step's :meth:`Step.input_reasons`, or an ``unknown_event_type`` reason."""
        if event_type not in self.ingress:
            return [Reason(code="unknown_event_type", field="event_type",
                           message=f"{event_type!r} is not an ingress type of {self.name} "
                                   f"({', '.join(self.ingress)})")]
        step = self.ingress_step(event_type)
        return step.input_reasons(data) if step is not None else []

    def run_id_reasons(self, event_type: str, data: Any, run_id: str) -> list[Reason]:
        """Why ``run_id``, given apart from the ingress ``data`` of ``event_type`` (a
        submit's ``run_id``, a replay's new id), cannot be the run's id (field ``run_id``):
        it is not 1 to 256 characters without a control character, or the ingress step
        refuses it as the data's correlation field (so a pipeline whose input check gives
        its ids a form, the deployment pipeline's ``[A-Za-z0-9._:-]{1,128}``, holds every
        way of naming a run to it). A step that takes no such field in its data (its
        refusal is ``unknown_field``) leaves the id to the first rule."""
        problem = run_id_problem(run_id)
        if problem is not None:
            return [Reason("invalid_field", "run_id", problem)]
        step = self.ingress_step(event_type)
        if step is None or not isinstance(data, dict):
            return []
        field = self.correlation_field
        return [Reason(reason.code, "run_id", f"as data.{field}: {reason.message}")
                for reason in step.input_reasons({**data, field: run_id})
                if reason.field == field and reason.code != "unknown_field"]

    def add(self, step: StepSource) -> Step:
        """Add what :meth:`~printery.StepSource.steps` gives: a :class:`Step` itself, the
        step of a :class:`~printery.Loop` or an :class:`~printery.Aggregator`, the three
        of a :class:`~printery.Map` (its split, its each, its collector); the first one,
        which is returned. No step is added when one of their names is taken."""
        steps = getattr(step, "steps", None)
        given: list[object] = list(steps()) if callable(steps) else []
        if not given or not all(isinstance(s, Step) for s in given):
            raise PipelineError(f"pipeline {self.name!r}: add takes a Step, or what gives its "
                                f"steps (a Loop, a Map, an Aggregator), not {step!r}")
        return self._add_all(cast(list[Step], given))

    def _add_all(self, given: list[Step]) -> Step:
        names = [s.name for s in given]
        taken = [n for n in names if n in self.steps or names.count(n) > 1]
        if taken:
            raise PipelineError(f"step{'s' if len(taken) > 1 else ''} "
                                f"{', '.join(map(repr, dict.fromkeys(taken)))} declared twice")
        for one in given:
            self._add(one)
        return given[0]

    def _add(self, step: Step) -> None:
        self._check_rename(step)
        unknown = [u for u in step.cost_units if u not in self.cost_units]
        if unknown:
            raise PipelineError(f"step {step.name!r} uses undeclared cost units {unknown}")
        if {BUDGET_WARNING, BUDGET_EXCEEDED}.intersection(step.produces):
            raise PipelineError(f"step {step.name!r}: budget entries are written by printery")
        self._check_budget(step.budget, f"step {step.name!r}")
        self.steps[step.name] = step

    def _check_rename(self, step: Step) -> None:
        """A step may take over the groups of a name no other step has or takes over."""
        steps = [*self.steps.values(), step]
        for one in steps:
            other = next((s for s in steps if s is not one and one.renamed_from is not None
                          and one.renamed_from in (s.name, s.renamed_from)), None)
            if other is not None:
                taken = ("is a step of the pipeline" if one.renamed_from == other.name
                         else f"is the renamed_from of step {other.name!r} too")
                raise PipelineError(
                    f"step {one.name!r}: renamed_from={one.renamed_from!r} {taken}; a name's "
                    "consumer groups go to one step")

    def step(
        self,
        name: str,
        *,
        consumes: Iterable[str],
        produces: Iterable[str] = (),
        concurrency: int = 1,
        depends_on: Iterable[str] = (),
        input_model: type[BaseModel] | None = None,
        output_models: Mapping[str, type[BaseModel]] | None = None,
        cost_units: Iterable[str] = (),
        input_check: Callable[[Any], Sequence[Reason]] | None = None,
        budget: Budget | None = None,
        limits: Iterable[Limit] = (),
        timeout: float | None = None,
        estimate: Estimate | None = None,
        renamed_from: str | None = None,
        middleware: Iterable[Middleware] = (),
        **settings: Unpack[StepOptions],
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`add`. ``estimate``: what one handler call is expected
        to spend (``{"tokens": 2000}``, or a function of the message), reserved against
        the run's budget before it runs (reference: budgets). ``renamed_from``: the
        step's old name, whose consumer groups it takes over (reference: where a group
        starts). ``middleware``: the step's own :class:`~printery.Middleware`, inside the
        pipeline's (docs/reference.md, Middleware)."""

        def register(handler: Handler) -> Handler:
            self.add(
                Step(
                    name=name, consumes=tuple(consumes), produces=tuple(produces),
                    handler=handler, concurrency=concurrency, depends_on=tuple(depends_on),
                    input_model=input_model, output_models=dict(output_models or {}),
                    settings=settings, cost_units=tuple(cost_units), input_check=input_check,
                    budget=budget,
                    limits=tuple(limits),
                    timeout=timeout,
                    estimate=estimate,
                    renamed_from=renamed_from,
                    middleware=tuple(middleware),
                )
            )
            return handler

        return register

    def review_kind(
        self,
        kind: str,
        *,
        approve: ReviewHook | None = None,
        reject: ReviewHook | None = None,
        accepts_data: bool = True,
    ) -> ReviewKind:
        """Register what a decision on a review of ``kind`` does (docs/reference.md,
        Review inbox): hooks for approve and reject (None: write the review's
        ``resume_type`` / ``reject_type``) and whether an approval may carry edited data.
        Kinds never registered behave as the defaults."""
        if kind in self.review_kinds:
            raise PipelineError(f"review kind {kind!r} registered twice")
        found = self.review_kinds[kind] = ReviewKind(kind, approve, reject, accepts_data)
        return found

    def kind_of_review(self, kind: str) -> ReviewKind:
        """The behaviour of ``kind``: the registered one, else the defaults."""
        return self.review_kinds.get(kind) or ReviewKind(kind)

    # -- the graph ---------------------------------------------------------------------------

    def producers_of(self, event_type: str) -> list[str]:
        return [s.name for s in self.steps.values() if event_type in s.produces]

    def _writers_of(self, step: Step) -> tuple[str, ...]:
        """The steps that write what ``step`` consumes, the ingress aside (outside
        producers write there, so its entries are always looked up before handling)."""
        return tuple(dict.fromkeys(writer for event_type in step.consumes
                                   if event_type not in self.ingress
                                   for writer in self.producers_of(event_type)))

    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """Step -> the steps it depends on: declared ones plus the producers of its inputs.
        Steps that merely exchange events in a loop would be a cycle, which is refused;
        a step consuming what it produces itself depends on itself (refused too, unless
        it is a declared :class:`~printery.Loop`, whose own types are left out)."""
        deps: dict[str, tuple[str, ...]] = {}
        for step in self.steps.values():
            found = list(step.depends_on)
            internal = step.loop.internal if step.loop is not None else ()
            for event_type in step.consumes:
                if event_type not in internal:
                    found += self.producers_of(event_type)
            deps[step.name] = tuple(dict.fromkeys(found))
        return deps

    def validate(self) -> None:
        """Refuse a graph with a cycle, an input nothing produces, or a step unreachable
        from the ingress, before anything connects."""
        if not self.steps:
            raise PipelineError(f"pipeline {self.name!r} has no steps")
        for step in self.steps.values():
            for event_type in step.consumes:
                if (event_type not in self.ingress and event_type not in (RUN_FAILED, RUN_CANCELLED)
                        and not self.producers_of(event_type)):
                    raise PipelineError(
                        f"step {step.name!r} consumes {event_type!r}, which no step produces "
                        "and which is not declared as ingress"
                    )
            for dep in step.depends_on:
                if dep not in self.steps:
                    raise PipelineError(f"step {step.name!r} depends on unknown step {dep!r}")
            escalation = escalation_of(step.handler)
            if escalation is not None:
                missing = [t for t in (REVIEW, *escalation.types) if t not in step.produces]
                if missing:
                    raise PipelineError(
                        f"step {step.name!r} escalates to review {escalation.kind!r} but does "
                        f"not declare {missing} in produces"
                    )
        cycle = find_cycle(self.dependencies())
        if cycle:
            raise PipelineError(
                f"pipeline {self.name!r} has a cycle: {' -> '.join(cycle)}; a step may run "
                "again on its own results only inside a declared Loop(...) (bounded by "
                "max_attempts)"
            )
        # A run's run:failed and run:cancelled come from the runtime: any step may consume them.
        unreachable = sorted(set(self.steps) - steps_reached(
            self.steps.values(), [*self.ingress, RUN_FAILED, RUN_CANCELLED]))
        if unreachable:
            raise PipelineError(f"steps unreachable from the ingress: {unreachable}")

    def event_types(self) -> list[str]:
        seen: dict[str, None] = dict.fromkeys(self.ingress)
        for step in self.steps.values():
            seen.update(dict.fromkeys(step.consumes))
            seen.update(dict.fromkeys(step.produces))
        seen.update(dict.fromkeys(self.extra_types))
        if self.has_budgets:
            seen.update(dict.fromkeys((BUDGET_WARNING, BUDGET_EXCEEDED)))
        return list(seen)

    def groups(self) -> dict[str, list[str]]:
        """Event type -> consumer groups (step names) reading it."""
        groups: dict[str, list[str]] = {t: [] for t in self.event_types()}
        for step in self.steps.values():
            for event_type in step.consumes:
                groups[event_type].append(step.name)
        return groups

    def codec(self, payload_limit: int = 1_048_576) -> Codec:
        return Codec(self.correlation_field, self.id_prefix, payload_limit)

    def describe(self, concurrency: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The pipeline as JSON-able data. ``concurrency`` maps step names to the
        consumer counts in effect (``[workers.<name>] concurrency``); a step missing from
        it shows its own default."""
        effective = concurrency or {}
        return {
            "name": self.name,
            "ingress": list(self.ingress),
            "correlation_field": self.correlation_field,
            "outcomes": list(self.outcomes),
            "steps": [
                {
                    "name": s.name, "consumes": list(s.consumes), "produces": list(s.produces),
                    "concurrency": effective.get(s.name, s.concurrency),
                    "depends_on": list(self.dependencies()[s.name]),
                    **({"loop": _loop_doc(s.loop)} if s.loop is not None else {}),
                    **({"map": _map_doc(self.maps[s.name])} if s.name in self.maps else {}),
                }
                for s in self.steps.values()
            ],
        }

    # -- running -----------------------------------------------------------------------------

    def build_workers(
        self,
        *,
        client: Redis,
        keys: StreamKeys,
        settings: ConsumerSettings | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        observer: Observer | None = None,
        payloads: PayloadStore | None = None,
        only: Iterable[str] | None = None,
    ) -> list[tuple[StreamWorker, tuple[str, ...]]]:
        """One stream worker per step (or per selected step) with its dependencies, ready
        to :meth:`~printery.WorkerManager.register`. ``overrides`` maps step names to
        :class:`ConsumerSettings` fields (e.g. from a config file)."""
        self.validate()
        base = settings or ConsumerSettings()
        chosen = set(only) if only is not None else set(self.steps)
        deps = self.dependencies()
        codec = self.codec(payloads.limit if payloads else 1_048_576)
        index = RunIndex(keys, ingress=self.ingress, outcomes=self.outcomes)
        place = functools.partial(place_pipeline_groups, client, keys, readers_of(self))
        built = []
        for step in self.steps.values():
            if step.name not in chosen:
                continue
            fields = {"concurrency": step.concurrency,
                      **({} if step.timeout is None else {"timeout": step.timeout}),
                      **step.settings,
                      **(overrides or {}).get(step.name, {})}
            worker = StreamWorker(
                step.name, client=client, keys=keys, consumes=step.consumes,
                handler=step.guarded_handler(), codec=codec,
                settings=_settings_from(base, fields), observer=observer, payloads=payloads,
                companions=step.companions, budget=self.budget_plan(step), limits=step.limits,
                index=index, written_by=self._writers_of(step), place_groups=place,
                middleware=(*self.middleware, *step.middleware),
            )
            if step.bind is not None:  # its handler for this worker, given the worker's context
                bound = step.bind(worker.context)
                worker.handler = step.guarded_handler(bound.handler)
                worker.companions = [*worker.companions, *bound.companions]
            if step.on_context is not None:
                step.on_context(worker.context)
            built.append((worker, tuple(d for d in deps[step.name] if d in chosen)))
        return built


def readers_of(pipeline: Pipeline) -> list[Reader]:
    """Every consumer group of ``pipeline``: each step on each type it consumes, with the
    name it was renamed from (what a start places: :mod:`printery.runtime.groups`)."""
    return [Reader(event_type, step.name, step.renamed_from)
            for step in pipeline.steps.values() for event_type in step.consumes]


def steps_reached(steps: Iterable[Step], event_types: Iterable[str]) -> set[str]:
    """Names of the ``steps`` that run on entries of ``event_types``, directly or further
    down: those that consume one of them, then those that consume what a step reached
    produces. What the pipeline's checks (every step reachable from the ingress) and a
    replay (the steps downstream of one) both ask of the graph."""
    steps, available = list(steps), set(event_types)
    reached: set[str] = set()
    changed = True
    while changed:
        changed = False
        for step in steps:
            if step.name not in reached and available.intersection(step.consumes):
                reached.add(step.name)
                available.update(step.produces)
                changed = True
    return reached


def _settings_from(base: ConsumerSettings, fields: Mapping[str, Any]) -> ConsumerSettings:
    allowed = {f.name for f in dc_fields(ConsumerSettings)}
    return replace(base, **{k: v for k, v in fields.items() if k in allowed})


def _loop_doc(shape: LoopShape) -> dict[str, Any]:
    return {"max_attempts": shape.max_attempts, "stream": shape.stream_type,
            "attempt_type": shape.attempt_type, "verdict_type": shape.verdict_type,
            "produces": shape.produces,
            "exhausted": shape.exhausted, "fallback": shape.fallback,
            "review_kind": shape.review_kind}


def _map_doc(shape: MapShape) -> dict[str, Any]:
    return {"item_type": shape.item_type, "result_type": shape.result_type,
            "each": shape.each, "collect": shape.collect, "max_items": shape.max_items,
            "on_item_failure": shape.on_item_failure, "produces": shape.produces}
