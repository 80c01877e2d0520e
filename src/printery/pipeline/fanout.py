"""Fan-out over run-time data (reference: fan-out): a :class:`Map` splits one entry into
items, handles each item as an entry of the run of its own, and writes one result when
every item has ended.

A Map is three steps, each an ordinary step of the pipeline:

- ``<name>`` (the split) consumes the Map's input and writes one ``<name>:item`` entry
  per item in its one commit (so a crash writes all of them or none), each carrying the
  item's index and the count beside ``data`` (``item``, ``items``) and the Map's name and
  failure policy (``map``, ``on_item_failure``); zero items writes the output at once;
- ``<name>:each`` (or the :class:`~printery.Loop` given as ``each``) consumes the items and
  writes one ``<name>:result`` per item, with its own deliveries, timeout, limits, budget,
  cost, trace lines and span, like any entry;
- ``<name>:collect`` consumes the results and counts them per run in a hash (one field
  per item index, set once: a redelivered result counts once); the result that completes
  the count writes the output, in item order, under a ``once`` guard, so however many
  consumers, redeliveries or kill -9s see the count complete it is written once.

A failed item (dead-lettered, or a Loop's exhausted outcome) reaches the collector
atomically with its failure: under ``skip`` the dead letter's own script writes the
item's ``<name>:result`` marked ``item_failed`` instead of ending the run
(:func:`~printery.runtime.writes.dead_letter_write`), a Loop's exhausted entry is
consumed by the collector; under ``fail`` the run ends ``failed``, its ``run:failed``
naming the item.
"""

from __future__ import annotations

import asyncio
import inspect
import reprlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, cast

from printery.base import _json
from printery.base.errors import PipelineError, Reject
from printery.pipeline.loop import Loop
from printery.pipeline.step import (
    BoundStep,
    MapShape,
    Step,
    check_concurrency,
    check_renamed_from,
    check_timeout,
    refuses_unknown_options,
)
from printery.rules.budgets import Budget, Estimate
from printery.rules.limits import Limit
from printery.runtime.handler import HandlerResult, Message, Output
from printery.runtime.step_context import StepContext
from printery.store.item_counts import ItemCounts
from printery.wire.fields import ITEM, ITEM_FAILED, ITEMS, MAP, ON_ITEM_FAILURE, item_fields, item_key
from printery.wire.keys import RUN_FAILED, StreamKeys, item_type, result_type

__all__ = ["Map", "MapShape"]

#: What ``split`` returns: the items, or an awaitable of them.
Split = Callable[[Message], Any]
#: A Map's handler ``each``: the item's output data, or an awaitable of it.
Each = Callable[[Message], Any]
#: What turns the outputs (in item order, None for a failed item) into the Map's output.
Merge = Callable[[list[Any]], Any]

OnItemFailure = Literal["fail", "skip"]
#: The reason codes of a split whose answer cannot be fanned out (dead-lettered at once:
#: the same message would split the same way again).
SPLIT_NOT_A_LIST, TOO_MANY_ITEMS, ITEM_NOT_SERIALIZABLE = (
    "split_not_a_list", "too_many_items", "item_not_serializable")
#: A Loop's exhausted item, as its ``run:failed`` says under ``fail``.
ITEM_EXHAUSTED = "item_exhausted"
#: Seconds a run's count of results is kept (the aggregator's join default).
COLLECT_TTL = 7 * 86400
_FAILED, _DONE = "f", "o"
#: Results a collector counts at once per process (one consumer): counted one at a time,
#: a round trip each, a Map would be bound by the server's latency; counted together
#: they share round trips (:class:`~printery.store.item_counts.ItemCounts`).
COLLECT_IN_FLIGHT = 128
#: Results the collector's consumer holds: its handlers wait on the count's round trip,
#: which would shrink an adaptive window to a few entries per read and commit.
COLLECT_PREFETCH = 256


@refuses_unknown_options("map")
class Map:
    """Fan-out over run-time data; ``pipeline.add`` it (reference: fan-out).

    ``split(message)`` returns the items (a list of JSON data); each becomes one
    ``<name>:item`` entry of the run, handled by ``each``: a function of the item's
    :class:`~printery.Message` returning the item's output data (written as
    ``<name>:result``), or a :class:`~printery.Loop`, which the Map wires to consume
    ``<name>:item`` and produce ``<name>:result`` (leave its ``consumes`` and
    ``produces`` out; given, they must be those). When every item has ended, ``produces`` is written once
    with ``{"items": [outputs in item order], "failed": [indexes]}``, or what ``merge``
    returns given the outputs (None in place of a failed item). ``on_item_failure``
    ``"fail"`` ends the run ``failed`` at the first item that fails; ``"skip"`` lists it
    in ``failed`` and goes on. More than ``max_items`` items fail the split
    (``too_many_items``). ``concurrency``, ``limits``, ``budget``, ``timeout``,
    ``estimate`` and ``cost_units`` are those of a handler ``each`` (a Loop brings its
    own); they hold across all items of all runs, as a step's do. ``renamed_from``: the
    Map's old name, whose split's group on ``consumes`` it takes over (reference: where a
    group starts; its items' and results' streams are named after it).
    """

    def __init__(
        self,
        name: str,
        *,
        consumes: str,
        produces: str,
        split: Split,
        each: Each | Loop,
        merge: Merge | None = None,
        max_items: int = 1000,
        on_item_failure: OnItemFailure = "fail",
        concurrency: int | None = None,
        limits: Iterable[Limit] = (),
        budget: Budget | None = None,
        timeout: float | None = None,
        estimate: Estimate | None = None,
        cost_units: Iterable[str] = (),
        renamed_from: str | None = None,
    ) -> None:
        what = f"map {name!r}"
        check_renamed_from(what, name, renamed_from)
        if not name or not isinstance(name, str):
            raise PipelineError(f"map name {name!r} is not a name; write a non-empty string")
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 0:
            raise PipelineError(f"{what}: max_items={max_items!r} is not a number of items; "
                                "write an integer >= 0 (default 1000)")
        if on_item_failure not in ("fail", "skip"):
            raise PipelineError(f"{what}: on_item_failure={on_item_failure!r}; write \"fail\" "
                                "(the run ends failed) or \"skip\" (the item is listed in "
                                "failed, the rest go on)")
        for label, function in (("split", split), ("merge", merge)):
            if function is not None and not callable(function):
                raise PipelineError(f"{what}: {label}={function!r} is not callable")
        types = [consumes, produces, item_type(name), result_type(name)]
        if len(set(types)) != len(types) or not consumes or not produces:
            raise PipelineError(f"{what}: consumes and produces must be distinct event types "
                                f"other than {types[2:]}; got {[consumes, produces]}")
        if isinstance(each, Loop):
            self._check_loop(name, each, concurrency=concurrency, limits=tuple(limits),
                             budget=budget, timeout=timeout, estimate=estimate,
                             cost_units=tuple(cost_units))
            each = each.wired_to(item_type(name), result_type(name))
        elif not callable(each):
            raise PipelineError(f"{what}: each={each!r} is neither a function of one Message "
                                "nor a Loop")
        else:
            check_concurrency(what, 1 if concurrency is None else concurrency)
            check_timeout(what, timeout)
            if budget is not None and not isinstance(budget, Budget):
                raise PipelineError(f"{what}: budget={budget!r} is not a Budget")
        self.name = name
        self.consumes, self.produces = consumes, produces
        self.split, self.each, self.merge = split, each, merge
        self.max_items = max_items
        self.on_item_failure: OnItemFailure = on_item_failure
        self.concurrency = 1 if concurrency is None else concurrency
        self.limits = tuple(limits)
        self.budget = budget
        self.timeout = timeout
        self.estimate = estimate
        self.cost_units = tuple(cost_units)
        self.renamed_from = renamed_from
        loop = each if isinstance(each, Loop) else None
        self.shape = MapShape(
            name=name, consumes=consumes, produces=produces, item_type=item_type(name),
            result_type=result_type(name), each=loop.name if loop else f"{name}:each",
            collect=f"{name}:collect", max_items=max_items, on_item_failure=on_item_failure,
            exhausted=loop.shape.exhausted if loop else None)

    @staticmethod
    def _check_loop(name: str, loop: Loop, **given: Any) -> None:
        """A Loop as ``each`` reads the items and writes the results, and brings its own
        bounds: the Map's would be silently ignored, so they are refused."""
        what = f"map {name!r}"
        wrong = []
        if loop.consumes not in ("", item_type(name)):  # "": not given, wired here
            wrong.append(f"consumes={item_type(name)!r} (it has {loop.consumes!r})")
        if loop.shape.produces not in ("", result_type(name)):
            wrong.append(f"produces={result_type(name)!r} (it has {loop.shape.produces!r})")
        if wrong:
            raise PipelineError(f"{what}: a Loop as each must have {' and '.join(wrong)}, or "
                                "leave them out (the Map gives them)")
        if loop.shape.review_kind:
            raise PipelineError(f"{what}: a Loop as each cannot escalate to a review "
                                f"(review_kind={loop.shape.review_kind!r}): a review's decision "
                                "does not carry the item; use fallback=, or on_item_failure")
        set_here = [k for k, v in given.items() if v not in (None, ())]
        if set_here:
            raise PipelineError(f"{what}: {', '.join(set_here)} apply to a handler each; a Loop "
                                f"as each brings its own (set them on Loop({loop.name!r}, ...))")

    # -- the steps ----------------------------------------------------------------------------

    def steps(self) -> list[Step]:
        """The split, the each and the collector, in that order (what
        :meth:`Pipeline.add <printery.Pipeline.add>` adds when given the Map)."""
        shape = self.shape
        split = Step(name=shape.name, consumes=(shape.consumes,),
                     produces=(shape.item_type, shape.produces), handler=self._split,
                     renamed_from=self.renamed_from, map=shape)
        if isinstance(self.each, Loop):
            (each,) = self.each.steps()
        else:
            each = Step(name=shape.each, consumes=(shape.item_type,),
                        produces=(shape.result_type,), handler=self._each,
                        concurrency=self.concurrency, limits=self.limits, budget=self.budget,
                        timeout=self.timeout, cost_units=self.cost_units,
                        estimate=self.estimate)
        consumes = (shape.result_type, *((shape.exhausted,) if shape.exhausted else ()))
        ends = shape.exhausted is not None and shape.on_item_failure == "fail"
        collect = Step(name=shape.collect, consumes=consumes,
                       produces=(shape.produces, *((RUN_FAILED,) if ends else ())),
                       handler=self._unbound, bind=self._collector,
                       settings={"prefetch": COLLECT_PREFETCH, "in_flight": COLLECT_IN_FLIGHT})
        return [split, each, collect]

    def _collector(self, context: StepContext) -> BoundStep:
        """The collector as one worker runs it: the runs' counts where its keys say, over
        a connection of its own, closed when the worker stops."""
        keys, counting = context.keys, self._collect
        counts = ItemCounts(context.store, self.shape.collect, ttl_s=COLLECT_TTL)

        def collect(message: Message) -> Awaitable[HandlerResult]:  # no coroutine of its own
            return counting(message, keys, counts)

        async def closing(context: StepContext) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await counts.close()

        return BoundStep(collect, (closing,))

    async def _unbound(self, message: Message) -> HandlerResult:
        """The collector's handler outside a worker (``Step.bind`` builds the one it runs)."""
        raise RuntimeError(f"map {self.name!r}: its collector runs in a worker built by "
                           "Pipeline.build_workers (it counts in the server)")

    def _items(self, found: Any) -> list[Any]:
        """The split's answer as items, or the rejection that says why it is not."""
        what = f"map {self.name!r}: split"
        if not isinstance(found, list):
            raise Reject(SPLIT_NOT_A_LIST, f"{what} returned {reprlib.repr(found)} "
                                           f"({type(found).__name__}); it must return a list "
                                           "of items (JSON data), [] for none")
        if len(found) > self.max_items:
            raise Reject(TOO_MANY_ITEMS, f"{what} returned {len(found)} items, more than "
                                         f"max_items={self.max_items}")
        for n, item in enumerate(found):
            try:
                _json.dumps(item)
            except TypeError as exc:
                raise Reject(ITEM_NOT_SERIALIZABLE, f"{what}: item {n} ({reprlib.repr(item)}) "
                                                    f"is not JSON: {exc}") from None
        return found

    async def _split(self, message: Message) -> HandlerResult:
        items = self._items(await _settled(self.split(message)))
        shape, cid = self.shape, message.correlation_id
        if not items:
            return self._written(cid, [], [])
        count = str(len(items))
        policy = shape.on_item_failure
        return [Output(shape.item_type, item, idempotency_key=f"{shape.item_type}:{cid}:{n}",
                       extra={MAP: shape.name, ITEM: str(n), ITEMS: count,
                              ON_ITEM_FAILURE: policy})
                for n, item in enumerate(items)]

    async def _each(self, message: Message) -> Output:
        each = cast(Each, self.each)
        carried = item_fields(message.envelope.extra)
        data = await _settled(each(message))
        return Output(self.shape.result_type, data,
                      idempotency_key=item_key(self.shape.result_type, message.correlation_id,
                                               carried), extra=carried)

    async def _collect(self, message: Message, every: StreamKeys,
                       counts: ItemCounts) -> HandlerResult:
        shape, cid = self.shape, message.correlation_id
        extra = message.envelope.extra
        try:
            index, count = int(extra[ITEM]), int(extra[ITEMS])
        except (KeyError, ValueError):
            raise Reject("invalid_input", f"{message.type!r} entry of map {self.name!r} names no "
                                          "item (fields item, items)") from None
        exhausted = message.type != shape.result_type
        if exhausted and shape.on_item_failure == "fail":
            return Output(RUN_FAILED, {
                "status": "failed", "step": shape.each, "reason_code": ITEM_EXHAUSTED,
                "error": f"item {index} of map {self.name!r} exhausted its attempts",
                "item": index}, idempotency_key=f"{RUN_FAILED}:{cid}:{shape.each}:{index}")
        keys = every.of(cid) if every.partitioned else every  # the run's partition
        failed = exhausted or ITEM_FAILED in extra
        value = _FAILED if failed else _DONE + _json.dumps(message.data)
        written, seen = await counts.count(keys, cid, once=keys.once(self._once(cid)),
                                           item=index, value=value)
        if written or seen < count:
            return None
        raw = await counts.arrived(keys, cid)
        outputs: list[Any] = [None] * count
        lost: list[int] = []
        for key, stored in raw.items():
            n = int(key)
            if stored == _FAILED:
                lost.append(n)
            elif 0 <= n < count:
                outputs[n] = _json.loads(stored[1:])
        return self._written(cid, outputs, sorted(lost))

    def _once(self, cid: str) -> str:
        return f"map:{self.name}:{cid}"

    def _written(self, cid: str, outputs: list[Any], failed: Sequence[int]) -> Output:
        """The Map's output for a run, once however often it is decided."""
        data = {"items": outputs, "failed": list(failed)} if self.merge is None else (
            self.merge(outputs))
        return Output(self.shape.produces, data, correlation_id=cid, once=self._once(cid))


async def _settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
