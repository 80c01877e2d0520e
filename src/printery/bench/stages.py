"""printery's side of the bench: ``stages`` no-op steps built with the public API only
(:class:`~printery.Pipeline`, :class:`~printery.ConsumerSettings`,
:class:`~printery.WorkerManager`), so the bench measures what a user's pipeline gets."""

from __future__ import annotations

from collections.abc import Sequence

from printery import (
    Budget,
    ConsumerSettings,
    Handler,
    Limit,
    Message,
    Output,
    Pipeline,
    Step,
    WorkerManager,
)
from printery.bench.arrivals import ArrivalRecorder
from printery.bench.names import BenchLayout
from printery.observe.metrics import Metrics, MetricsObserver
from printery.store import Redis

#: The bench's budgets: never reached, so every event still arrives; what is measured
#: is their bookkeeping (the check before each handler, the charge in each commit).
BENCH_BUDGET_USD = 1e12


def _forward(target: str, *, cost: bool = False) -> Handler:
    async def handle(message: Message) -> Output:
        return Output(target, message.data)

    async def handle_reporting(message: Message) -> Output:
        message.report_cost("usd", 0.001)
        return Output(target, message.data)

    return handle_reporting if cost else handle


def _sink(recorder: ArrivalRecorder, *, cost: bool = False) -> Handler:
    """The last stage: note the arrival, write nothing (as the yardstick's fourth step)."""
    note = recorder.note

    async def handle(message: Message) -> None:
        note(message.data)

    async def handle_reporting(message: Message) -> None:
        message.report_cost("usd", 0.001)
        note(message.data)

    return handle_reporting if cost else handle


#: What ``--with-limit`` / ``--with-budget`` add to every stage; ``cost``: handlers that
#: report a cost (as a budget's do) and nothing more, the baseline of a budget's overhead.
FEATURES = ("limit", "budget", "cost")


def bench_limits(stage: int) -> list[Limit]:
    """A stage's limit under ``--with limit``: a concurrency slot and a start in the
    window for every handler call (both the admission and the release path), at numbers
    a bench never reaches, so what is measured is the machinery and not the waiting."""
    return [Limit(f"bench-stage-{stage}", concurrency=1_000_000,
                  requests_per_minute=1_000_000_000)]


def bench_pipeline(
    layout: BenchLayout, recorder: ArrivalRecorder, features: Sequence[str] = ()
) -> Pipeline:
    """A chain ``s0 -> stage0 -> s1 -> ... -> s<stages-1> -> sink`` of handlers that pass
    data on, the last noting arrivals with ``recorder``, each stage with the ``features``
    asked for (:data:`FEATURES`): ``cost`` makes each handler report a cost, ``budget``
    that and a budget on the run and on every stage."""
    budget = "budget" in features
    cost = budget or "cost" in features
    pipeline = Pipeline("bench", ingress=[layout.event_type(0)],
                        cost_units=["usd"] if cost else [],
                        budget=Budget(usd=BENCH_BUDGET_USD) if budget else None)
    for stage in range(layout.stages):
        sink = layout.is_sink(stage)
        target = layout.event_type(stage + 1)
        pipeline.add(
            Step(
                name=layout.group(stage), consumes=(layout.event_type(stage),),
                produces=() if sink else (target,),
                handler=_sink(recorder, cost=cost) if sink else _forward(target, cost=cost),
                limits=bench_limits(stage) if "limit" in features else (),
                cost_units=("usd",) if cost else (),
                budget=Budget(usd=BENCH_BUDGET_USD) if budget else None,
            )
        )
    return pipeline


def bench_settings(prefetch: int | None) -> ConsumerSettings:
    """The library's defaults (what ``printery-workers`` runs with), or those with
    ``prefetch`` changed: the bench measures what a user gets unless told otherwise."""
    return ConsumerSettings() if prefetch is None else ConsumerSettings(prefetch=prefetch)


def bench_manager(
    client: Redis, layout: BenchLayout, settings: ConsumerSettings,
    recorder: ArrivalRecorder, features: Sequence[str] = (),
) -> WorkerManager:
    """The stage workers, registered with their dependencies, not yet started. They
    observe into Prometheus instruments as ``printery-workers``' do (a histogram per
    handled entry, one per limit wait): the bench measures what the service runs."""
    manager = WorkerManager(drain_timeout=10.0)
    observer = MetricsObserver(Metrics(process_metrics=False))
    for worker, deps in bench_pipeline(layout, recorder, features).build_workers(
        client=client, keys=layout.keys, settings=settings, observer=observer
    ):
        manager.register(worker, deps)
    return manager
