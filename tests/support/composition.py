"""The composition fuzz (issue 30): small pipelines drawn from every building block, run
against a real server with failures drawn for each run, and the invariants that must
hold whatever was drawn.

A drawn :class:`Example` is plain data (frozen dataclasses, readable ``repr``): the
pipeline's shape (:class:`Shape`: a chain of :class:`Stage` s — plain step, escalated
step, validator gate, validation loop, join of two branches, a Map over 0 to 3 items
with ``fail`` or ``skip`` — with limits (some with a
``max_wait`` that sends work to the fallback), a budget (whose steps may reserve an
``estimate=``) and partitions), the runs submitted (each with the failure of each stage, carried in the
run's data so that every handler knows what to do), garbage entries written to the
streams, reviews decided by a person or left to a deadline, and replays.
:func:`run_example` builds the pipeline with the public API, starts its workers (in this
process, or in processes of their own for the kill -9 variant:
``support/composition_proc.py``), submits, decides every review it finds, waits
(bounded) for every run to end and everything to settle, and checks (:func:`check`):

- every run ends: an entry of one of the pipeline's outcome types names it;
- no worker ends ``failed`` (nor restarted: the manager is standalone);
- nothing stays pending: every group of every stream has read everything and holds none;
- no event is written twice: no two entries of one stream and run share an idempotency
  key (per group for dead letters and ``run:failed``, per step for a budget's release),
  and no run has two entries of one of its chain's types;
- a dead letter after a run's outcome ends nothing (``run:failed`` after another outcome);
- spent equals the sum of committed costs: the run's budget hash against the costs on
  the entries written (each handler call counted once: every call reports an amount of
  its own);
- ``Limit(concurrency=N)``: no handler starts with N of its key running (in-process).

``PRINTERY_FUZZ_IGNORE=late,replay`` leaves out a check broken by a known bug, to explore
past it (the reproductions are in ``test_composition_fuzz.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import redis.asyncio as aioredis
from hypothesis import strategies as st

from printery import (
    RUN_FAILED,
    Aggregator,
    Budget,
    ConsumerSettings,
    JoinState,
    Limit,
    Loop,
    Map,
    Message,
    Middleware,
    OpenAICompatible,
    Output,
    Pipeline,
    QuotaExhausted,
    Reason,
    ReplayError,
    ReviewNotFound,
    ReviewRunEnded,
    WorkerManager,
    all_must_pass,
    any_pass,
    escalate,
    first_wins,
    replay,
)
from printery.inbox import reviews
from printery.pipeline.step import checked_reasons
from printery.runs.facade import Runs
from printery.runtime.payloads import PayloadStore
from printery.testing import unique_prefix, wait_for
from printery.transport.commit import decode_spent
from printery.transport.connection import connect
from printery.wire.envelope import correlation_of
from printery.wire.fields import REPLAY_FOR
from printery.wire.keys import WITHHELD, StreamKeys
from support.fuzz_model import CUTS, fuzz_model

# -- the drawn example ---------------------------------------------------------------------

#: Payload limits of the fuzzed workers: small, so that "huge" is cheap.
PAYLOAD_LIMIT = 16_384
INLINE_LIMIT = 4_096
#: Seconds a hung handler (or loop work) holds on before the step cancels it.
STEP_TIMEOUT = 0.2
#: Seconds a ``stall`` blocks the event loop: past the visibility timeout (``SETTINGS``).
STALL = 2.3
#: Seconds after its opening that a join is finished with what arrived.
JOIN_DEADLINE = 0.3
#: Invariants not checked (exploring past a known bug): PRINTERY_FUZZ_IGNORE=late,replay.
IGNORE = frozenset(os.environ.get("PRINTERY_FUZZ_IGNORE", "").split(","))
#: The bound on one example's runs ending and settling (each phase).
SETTLE_TIMEOUT = 20.0

#: Set in the kill -9 variant's worker processes: only there does ``crash`` kill.
CRASH_ENV = "FUZZ_CRASH_KILLS"
#: The exit status of a process a ``crash`` handler killed.
CRASH_EXIT = 7
#: The producer of the garbage entries.
GARBAGE = "fuzz-garbage"
KINDS = ("plain", "escalate", "validator", "loop", "join", "map", "model")
#: What a stage's handler does in a run (every kind understands every mode: a mode that
#: means nothing to a kind is a success there).
MODES = ("ok", "raise", "flaky", "hang", "exit", "decimal", "big", "huge", "reject",
         "reject_all", "validator_none", "policy_raise", "quota", "bad_key", "cut")
#: Seconds an entry waits for a ``Limit(max_wait=)`` before its step's fallback runs.
MAX_WAIT = 0.05


@dataclass(frozen=True)
class Stage:
    kind: str
    concurrency: int = 1
    #: None, or ``(key, concurrency, requests_per_minute)`` of one :class:`Limit`.
    limit: tuple[str, int | None, int | None] | None = None
    #: Whether that limit has a ``max_wait`` (:data:`MAX_WAIT`).
    max_wait: bool = False
    #: Whether that limit's key is a function of the message (it raises in mode
    #: ``bad_key``, and must see the stage's input: a loop's, a Map item's), not a string.
    key_fn: bool = False
    #: loop: attempts, a fallback, a review kind; escalate: "ok"/"raise"/None fallback,
    #: a review kind, a terminal output; join: the policy.
    attempts: int = 1
    fallback: str | None = None
    review: bool = False
    terminal: bool = False
    policy: str = "all"
    #: map: how many items the split writes (item 0 fails as the run says, the others
    #: never) and whether a failed item is skipped (else the run fails).
    items: int = 0
    skip: bool = False


@dataclass(frozen=True)
class Shape:
    stages: tuple[Stage, ...]
    #: None, or ``(usd limit, on_exceeded)``.
    budget: tuple[float, str] | None = None
    partitions: int = 1
    #: Whether the steps reserve ``estimate={"usd": 1}`` (each call spends about that).
    estimate: bool = False
    #: Whether the pipeline has a user's middleware (:class:`AuditCalls`) on every step.
    middleware: bool = False


@dataclass(frozen=True)
class Run:
    #: The mode of each stage, by position.
    modes: tuple[str, ...]
    #: How a person decides this run's reviews: "approve" or "reject".
    decision: str = "approve"


@dataclass(frozen=True)
class Garbage:
    #: Which consumed stream (an index into the pipeline's consumed types, modulo).
    stream: int
    #: "nodata", "nonjson" or "huge".
    kind: str
    #: Whose run it names: None (nobody), -1 (a run of its own), else a run's index.
    run: int | None


@dataclass(frozen=True)
class Example:
    shape: Shape
    runs: tuple[Run, ...]
    garbage: tuple[Garbage, ...] = ()
    #: "person" (each run's decision) or "deadline" (every review rejected at a deadline).
    reviews: str = "person"
    #: ``(run index, step index or None for the ingress)`` replayed once the runs ended.
    replays: tuple[tuple[int, int | None], ...] = ()
    #: How the pipeline is changed between two starts once everything settled (in this
    #: process only): None (not restarted), "same" (started again as it was), "add" (a
    #: new step on the ingress) or "rename" (the first plain step renamed, with
    #: ``renamed_from``); nothing retained may be handled again.
    change: str | None = None

    def describe(self) -> str:
        """The example in a few lines (printed and noted on failure)."""
        lines = [f"shape: budget={self.shape.budget} partitions={self.shape.partitions} "
                 f"estimate={self.shape.estimate} middleware={self.shape.middleware}"]
        lines += [f"  stage {i}: {s}" for i, s in enumerate(self.shape.stages)]
        lines += [f"run {i}: {r}" for i, r in enumerate(self.runs)]
        lines += [f"garbage: {g}" for g in self.garbage]
        lines.append(f"reviews: {self.reviews}; replays: {self.replays}; change: {self.change}")
        return "\n".join(lines)


# -- strategies ----------------------------------------------------------------------------

LIMITS = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["own", "shared"]), st.sampled_from([1, 2]), st.none()),
    st.tuples(st.sampled_from(["own", "shared"]), st.none(), st.just(6000)),
    st.tuples(st.sampled_from(["own", "shared"]), st.just(1), st.just(6000)),
)


@st.composite
def stages(draw: st.DrawFn) -> Stage:
    kind = draw(st.sampled_from(KINDS))
    limit = draw(LIMITS)
    base = {"kind": kind, "concurrency": draw(st.sampled_from([1, 2])), "limit": limit,
            "max_wait": limit is not None and draw(st.booleans()),
            "key_fn": limit is not None and draw(st.booleans())}
    if kind == "loop":
        return Stage(**base, attempts=draw(st.integers(1, 3)),
                     fallback=draw(st.sampled_from([None, "ok"])), review=draw(st.booleans()))
    if kind == "escalate":
        return Stage(**base, fallback=draw(st.sampled_from([None, "ok", "raise"])),
                     review=draw(st.booleans()), terminal=draw(st.booleans()))
    if kind == "join":
        return Stage(**base, policy=draw(st.sampled_from(["all", "any", "first"])))
    if kind == "map":
        return Stage(**base, items=draw(st.integers(0, 3)), skip=draw(st.booleans()))
    return Stage(**base)


SHAPES = st.builds(
    Shape,
    stages=st.lists(stages(), min_size=1, max_size=3).map(tuple),
    budget=st.one_of(st.none(), st.tuples(st.sampled_from([1.5, 2.5, 4.5]),
                                          st.sampled_from(["stop", "review"]))),
    partitions=st.sampled_from([1, 1, 1, 2]),
    estimate=st.booleans(),
    middleware=st.booleans(),
)
#: Mostly success, so that runs reach the later stages.
MODE = st.one_of(st.just("ok"), st.sampled_from(MODES))
#: ``crash``: the handler kills its process (``os._exit``) on every call, in the kill -9
#: variant only (its workers run in processes of their own, restarted when they die):
#: only its entry may be blamed for the deaths, never a neighbour in flight beside it.
CRASHING = st.one_of(st.just("ok"), st.sampled_from([*MODES, "crash", "crash"]))
#: ``stall``: the handler's first call blocks the event loop (synchronous code) past the
#: visibility timeout, then hangs. Seconds each: ``make chaos`` draws it, rarely.
STALLING = st.one_of(st.just("ok"), st.sampled_from([*MODES, *MODES, *MODES, "stall"]))


@st.composite
def examples(draw: st.DrawFn, *, max_runs: int = 3,
             modes: st.SearchStrategy[str] = MODE) -> Example:
    shape = draw(SHAPES)
    n = len(shape.stages)
    runs = draw(st.lists(
        st.builds(Run, modes=st.lists(modes, min_size=n, max_size=n).map(tuple),
                  decision=st.sampled_from(["approve", "reject"])),
        min_size=1, max_size=max_runs))
    garbage = draw(st.lists(st.builds(
        Garbage, stream=st.integers(0, 20), kind=st.sampled_from(["nodata", "nonjson", "huge"]),
        run=st.one_of(st.none(), st.just(-1), st.integers(0, len(runs) - 1))), max_size=2))
    steps = _step_count(shape)
    replays = draw(st.lists(st.tuples(st.integers(0, len(runs) - 1),
                                      st.one_of(st.none(), st.integers(0, steps - 1))),
                            max_size=1))
    return Example(shape, tuple(runs), tuple(garbage),
                   draw(st.sampled_from(["person", "person", "deadline"])), tuple(replays),
                   draw(st.sampled_from([None, None, "same", "add", "rename"])))


def _step_count(shape: Shape) -> int:
    return sum(3 if s.kind in ("join", "map") else 1 for s in shape.stages)


# -- building the pipeline -----------------------------------------------------------------

#: Each process counts from a start of its own (the kill -9 variant runs several).
_amounts = itertools.count(os.getpid() % 1000 * 1000)


def _charge(message: Message) -> None:
    """Report this call's cost: about 1 usd, an amount no other call reports (so each
    call's entries are told apart from another's by their ``cost``)."""
    message.report_cost("usd", 1 + next(_amounts) % 1_000_000 / 1e7)


#: What a step reserves before each handler call (None: nothing).
Estimate = dict[str, float] | None
#: A handler's ``(limit key, its concurrency)``, None when no Limit bounds its concurrency.
Slot = tuple[str, int] | None


@dataclass
class Probe:
    """What the handlers saw: the handlers of each limit key running at once (those a
    ``Limit(concurrency=)`` counts), and each start that found more than its bound."""

    running: Counter[str] = field(default_factory=Counter)
    most: Counter[str] = field(default_factory=Counter)
    over: list[str] = field(default_factory=list)

    def enter(self, slot: Slot, step: str) -> None:
        if slot is None:
            return
        key, bound = slot
        self.running[key] += 1
        self.most[key] = max(self.most[key], self.running[key])
        if self.running[key] > bound:
            self.over.append(f"{step} started with {self.running[key]} handlers of limit "
                             f"{key} running, its concurrency {bound}")

    def leave(self, slot: Slot) -> None:
        if slot is not None:
            self.running[slot[0]] -= 1


def mode_of(data: Any, stage: int) -> str:
    if stage >= 0 and isinstance(data, dict) and isinstance(data.get("modes"), list):
        modes = data["modes"]
        if stage < len(modes) and isinstance(modes[stage], str):
            return modes[stage]
    return "ok"


async def misbehave(mode: str, message: Message) -> None:
    """The failures that happen before a handler's answer (after it showed a partial:
    every handler streams, so every failure must retract what it showed)."""
    await message.partial(f"{mode} ")
    if mode == "stall":
        if message.deliveries == 1:
            time.sleep(STALL)  # noqa: ASYNC251 - synchronous code in a handler, on purpose
        mode = "hang"
    if mode == "raise":
        raise RuntimeError("fuzz: raise")
    if mode == "flaky" and message.deliveries == 1:
        raise RuntimeError("fuzz: flaky (first delivery)")
    if mode == "hang":
        await asyncio.Event().wait()
    if mode == "exit":
        sys.exit(3)
    if mode == "crash" and os.environ.get(CRASH_ENV) == "1":
        os._exit(CRASH_EXIT)  # a native crash, an OOM kill: no exception, no cleanup
    if mode == "quota":
        raise QuotaExhausted("fuzz: the provider's quota is gone", retry_after=259200)


def answer(mode: str, data: Any) -> Any:
    """The handler's output data in ``mode``: passed on as it came, or made bad/big."""
    if mode == "decimal":
        return {**data, "total": Decimal("12.50")} if isinstance(data, dict) else Decimal(1)
    if mode == "big" and isinstance(data, dict):
        return {**data, "pad": "b" * (INLINE_LIMIT + 100)}
    if mode == "huge":
        return {**data, "pad": "h" * (PAYLOAD_LIMIT + 100)} if isinstance(data, dict) else data
    return data


@dataclass
class Built:
    pipeline: Pipeline
    probe: Probe
    #: The chain's types in order: ``s0`` (ingress) ... ``s<n>`` (the end).
    chain: tuple[str, ...]
    joins: tuple[str, ...]


def build(shape: Shape, model_url: str = "", change: str | None = None) -> Built:
    """The pipeline of ``shape``: stage i consumes ``s<i>`` and produces ``s<i+1>``; a
    ``model`` stage streams from the provider at ``model_url``
    (:mod:`support.fuzz_model`). ``change`` "add": with a step ``audit`` on the ingress
    too; "rename": the first plain step renamed (``renamed_from`` its old name)."""
    units = ["usd", "tokens"]
    budget = Budget(usd=shape.budget[0], on_exceeded=shape.budget[1]) if shape.budget else None
    pipeline = Pipeline("fuzz", ingress=["s0"], cost_units=units, budget=budget,
                        middleware=[AuditCalls()] if shape.middleware else ())
    #: What every step of the shape that calls a handler reserves (with a budget).
    estimate: Estimate = {"usd": 1.0} if shape.estimate and budget is not None else None
    probe = Probe()
    joins: list[str] = []
    n = len(shape.stages)
    for i, stage in enumerate(shape.stages):
        limits, key = _limits(stage, i, probe)
        src, dst = f"s{i}", f"s{i + 1}"
        kinds = {"plain": _plain, "escalate": _escalated, "validator": _validator,
                 "loop": _loop, "join": _join, "map": _map}
        if stage.kind == "model":
            _model(pipeline, stage, i, src, dst, limits, key, probe, estimate, model_url)
        elif stage.kind == "plain" and change == "rename" and i == _first_plain(shape):
            _plain(pipeline, stage, i, src, dst, limits, key, probe, estimate, renamed=True)
        else:
            kinds[stage.kind](pipeline, stage, i, src, dst, limits, key, probe, estimate)
        if stage.kind == "join":
            joins.append(f"join{i}")
    if change == "add":
        @pipeline.step("audit", consumes=["s0"], produces=["audited"])
        async def audit(message: Message) -> Output:
            return Output("audited", {"seen": True})
    return Built(pipeline, probe, tuple(f"s{i}" for i in range(n + 1)), tuple(joins))


#: The type of the audit records :class:`AuditCalls` commits with every call's outputs.
AUDIT = "mw:audit"


class AuditCalls(Middleware):
    """Around every call, and one audit record in every call's commit (naming the step,
    the entry and what the call wrote): each is committed with its call's outputs or not
    at all, so an entry has at most one, and what it names was written."""

    async def call(self, message: Message, call_next: Any) -> Any:
        return await call_next(message)

    def commit(self, message: Message, outputs: list[Output]) -> list[Output]:
        return [Output(AUDIT, {"step": message.worker, "entry": message.entry_id,
                               "wrote": sorted({out.type for out in outputs})},
                       idempotency_key=f"{AUDIT}:{message.worker}:{message.stream}:"
                                       f"{message.entry_id}")]


def _first_plain(shape: Shape) -> int | None:
    return next((i for i, s in enumerate(shape.stages) if s.kind == "plain"), None)


def _limits(stage: Stage, i: int, probe: Probe) -> tuple[list[Limit], Slot]:
    if stage.limit is None:
        return [], None
    which, concurrency, rpm = stage.limit
    key = "shared" if which == "shared" else f"own{i}"
    slot = None if concurrency is None else (key, concurrency)
    return [Limit(_key_function(key, i, probe) if stage.key_fn else key, name=key,
                  concurrency=concurrency, requests_per_minute=rpm,
                  max_wait=MAX_WAIT if stage.max_wait else None)], slot


def _key_function(key: str, i: int, probe: Probe) -> Callable[[Message], str]:
    """A key function as a user writes one (``m.data["tenant"]``-like: it reads the run's
    data): it raises in mode ``bad_key`` (its entry alone is dead-lettered), and notes a
    call that was not given the stage's input (a loop's verdict wrapper, say)."""

    def key_of(message: Message) -> str:
        data = message.data
        if isinstance(data, dict) and {"attempt", "input"} <= data.keys():
            probe.over.append(f"the key function of stage {i} was given a loop's "
                              f"attempt ({sorted(data)}), not the loop's input")
        if mode_of(data, i) == "bad_key":
            raise KeyError("fuzz: the key function finds no tenant")
        return key

    return key_of


def _handler(i: int, dst: str, probe: Probe, key: Slot, step: str) -> Callable[..., Any]:
    async def handle(message: Message) -> Output:
        mode = mode_of(message.data, i)
        probe.enter(key, step)
        try:
            await misbehave(mode, message)
            _charge(message)
            return Output(dst, answer(mode, message.data))
        finally:
            probe.leave(key)
    return handle


def _plain(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
           key: Slot, probe: Probe, estimate: Estimate, renamed: bool = False) -> None:
    name = f"plain{i}renamed" if renamed else f"plain{i}"
    p.step(name, consumes=[src], produces=[dst], concurrency=stage.concurrency,
           cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate,
           renamed_from=f"plain{i}" if renamed else None)(
        _handler(i, dst, probe, key, name))


def _model(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
           key: Slot, probe: Probe, estimate: Estimate, url: str) -> None:
    """A streaming model call (the provider reports tokens): in mode ``cut`` the first
    answer of each entry ends half-way (closed, or a clean end too early, by the run's
    parity), which the step must take as broken (a retry, its draft retracted)."""
    llm = OpenAICompatible(url, "fuzz", api_key_env=None, timeout=5, max_attempts=1)

    @p.step(f"model{i}", consumes=[src], produces=[dst], concurrency=stage.concurrency,
            cost_units=["usd", "tokens"], limits=limits, timeout=STEP_TIMEOUT,
            estimate=estimate)
    async def model(message: Message) -> Output:
        mode = mode_of(message.data, i)
        run = message.data.get("run", 0) if isinstance(message.data, dict) else 0
        cut = CUTS[run % 2] if mode == "cut" and isinstance(run, int) else ""
        ask = {"key": f"{message.stream}/{message.entry_id}", "cut": cut}
        probe.enter(key, f"model{i}")
        try:
            done = await llm.complete(message, stream=True,
                                      messages=[{"role": "user", "content": json.dumps(ask)}])
            if done.text != "half whole":
                probe.over.append(f"model{i} took a cut answer as complete: {done.text!r}")
            await misbehave(mode, message)
            _charge(message)
            return Output(dst, answer(mode, message.data))
        finally:
            probe.leave(key)


def _escalated(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
               key: Slot, probe: Probe, estimate: Estimate) -> None:
    rejected, gave_up = f"{src}:rejected", f"{src}:gave_up"

    async def fallback(message: Message) -> Output:
        if stage.fallback == "raise":
            raise RuntimeError("fuzz: the fallback is down too")
        return Output(dst, {**message.data, "fallback": True} if isinstance(message.data, dict)
                      else message.data)

    produces = [dst]
    if stage.review:
        produces += ["review", rejected]
    if stage.terminal:
        produces.append(gave_up)
    handler = escalate(
        _handler(i, dst, probe, key, f"esc{i}"), attempts=2,
        fallback=fallback if stage.fallback else None,
        review_kind=f"gate{i}" if stage.review else None,
        on_approve=dst if stage.review else "", on_reject=rejected if stage.review else "",
        terminal=(lambda m, exc: Output(gave_up, {"status": "gave_up", "error": str(exc)}))
        if stage.terminal else None)
    p.step(f"esc{i}", consumes=[src], produces=produces, concurrency=stage.concurrency,
           cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate)(handler)


def _verdict(mode: str, data: Any) -> Any:
    """What a validator answers in ``mode`` for ``data``."""
    if mode == "validator_none":
        return None
    fallback = isinstance(data, dict) and data.get("fallback")
    if mode == "reject_all" or (mode == "reject" and not fallback):
        return [Reason("fuzz_rejected", "modes", f"rejected in mode {mode}")]
    return []


def _validator(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
               key: Slot, probe: Probe, estimate: Estimate) -> None:
    rejected = f"{src}:rejected"

    @p.step(f"gate{i}", consumes=[src], produces=[dst, rejected], concurrency=stage.concurrency,
            cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate)
    async def gate(message: Message) -> Output:
        mode = mode_of(message.data, i)
        probe.enter(key, f"gate{i}")
        try:
            await misbehave(mode, message)
            reasons = checked_reasons(_verdict(mode, message.data), f"gate{i}")
            _charge(message)
            if reasons:
                return Output(rejected, {"status": "rejected",
                                         "reasons": [r.as_dict() for r in reasons]})
            return Output(dst, answer(mode, message.data))
        finally:
            probe.leave(key)


def _loop(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
          key: Slot, probe: Probe, estimate: Estimate) -> None:
    async def work(message: Message) -> Any:
        mode = mode_of(message.data, i)
        probe.enter(key, f"loop{i}")
        try:
            if not (mode == "flaky" and message.attempt > 1):
                await misbehave(mode, message)
            _charge(message)
            return answer(mode, message.data)
        finally:
            probe.leave(key)

    async def fallback(message: Message) -> Any:
        _charge(message)
        return {**message.data, "fallback": True} if isinstance(message.data, dict) else message.data

    def validate(message: Message) -> Any:
        return _verdict(mode_of(message.data, i), message.data)

    p.add(Loop(f"loop{i}", consumes=src, produces=dst, work=work, validate=validate,
               max_attempts=stage.attempts, fallback=fallback if stage.fallback else None,
               review_kind=f"answer{i}" if stage.review else None, concurrency=stage.concurrency,
               cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate))


def _join(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
          key: Slot, probe: Probe, estimate: Estimate) -> None:
    """Two branches (``a`` fails as the run says, ``b`` never) joined by an aggregator."""
    p.step(f"branch{i}a", consumes=[src], produces=[f"{src}:a"], concurrency=stage.concurrency,
           cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate)(
        _handler(i, f"{src}:a", probe, key, f"branch{i}a"))
    p.step(f"branch{i}b", consumes=[src], produces=[f"{src}:b"], cost_units=["usd"],
           timeout=STEP_TIMEOUT)(_handler(-1, f"{src}:b", probe, None, f"branch{i}b"))
    base = {
        "all": all_must_pass(status_of=lambda branch, data: "ok", precedence=["ok"],
                             timeout_status="missing"),
        "any": any_pass(passed=lambda branch, data: branch != "opened"),
        "first": first_wins(),
    }[stage.policy]

    def policy(state: JoinState) -> Any:
        merged = base(state)
        if merged is None:
            return None
        data = next((d for d in state.arrived.values() if isinstance(d, dict)), {})
        if mode_of(data, i) == "policy_raise":
            raise RuntimeError("fuzz: the merge policy raised")
        return {**data, "merge": merged["status"]}

    p.add(Aggregator(f"join{i}", opens=src, opens_as="opened",
                     branches={f"{src}:a": "a", f"{src}:b": "b"}, emits=dst, policy=policy,
                     deadline=JOIN_DEADLINE, concurrency=stage.concurrency))


def _map(p: Pipeline, stage: Stage, i: int, src: str, dst: str, limits: list[Limit],
         key: Slot, probe: Probe, estimate: Estimate) -> None:
    """A Map over ``stage.items`` copies of the run's data: item 0 fails as the run says
    (raise, hang, exit, an output JSON cannot encode...), the others never; ``merge``
    carries the run's data on (its modes for the stages after)."""

    def split(message: Message) -> list[Any]:
        data = message.data
        return [{**data, "item": n} if isinstance(data, dict) else data
                for n in range(stage.items)]

    async def each(message: Message) -> Any:
        first = isinstance(message.data, dict) and message.data.get("item") == 0
        mode = mode_of(message.data, i) if first else "ok"
        probe.enter(key, f"map{i}:each")
        try:
            await misbehave(mode, message)
            _charge(message)
            return answer(mode, message.data)
        finally:
            probe.leave(key)

    def merge(outputs: list[Any]) -> Any:
        data = next((o for o in outputs if isinstance(o, dict)), {})
        return {**{k: v for k, v in data.items() if k not in ("item", "pad")},
                "items": len(outputs), "failed": sum(o is None for o in outputs)}

    p.add(Map(f"map{i}", consumes=src, produces=dst, split=split, each=each, merge=merge,
              on_item_failure="skip" if stage.skip else "fail", concurrency=stage.concurrency,
              cost_units=["usd"], limits=limits, timeout=STEP_TIMEOUT, estimate=estimate))


# -- running one example -------------------------------------------------------------------

SETTINGS = ConsumerSettings(block_ms=50, retry_backoff_ms=5, max_deliveries=2,
                            visibility_timeout=2.0, claim_interval=0.1)


@dataclass
class Context:
    redis: aioredis.Redis
    keys: StreamKeys
    built: Built
    #: The example's workers (:class:`InProcess` or a process set).
    workers: Any
    example: Example
    #: run id -> how a person decides its reviews.
    runs: dict[str, str] = field(default_factory=dict)
    #: run id -> the modes of its stages (what its handlers do).
    modes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: what happened, for the figures and the failure message.
    log: list[str] = field(default_factory=list)
    decided: Counter[str] = field(default_factory=Counter)

    @property
    def pipeline(self) -> Pipeline:
        return self.built.pipeline


@dataclass
class Figures:
    runs: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    reviews: int = 0
    replays: int = 0
    garbage: int = 0
    #: Worker processes killed (-9) while some run had not ended.
    kills: int = 0
    seconds: float = 0.0


class InProcess:
    """The example's workers in this process, under a standalone manager."""

    def __init__(self, url: str, keys: StreamKeys, built: Built) -> None:
        self.client = connect(url, block_ms=SETTINGS.block_ms)
        self.manager = WorkerManager(supervised=False, drain_timeout=2)
        self.probe = built.probe
        payloads = PayloadStore(self.client, keys, limit=PAYLOAD_LIMIT, inline_limit=INLINE_LIMIT)
        for worker, deps in built.pipeline.build_workers(client=self.client, keys=keys,
                                                         settings=SETTINGS, payloads=payloads):
            self.manager.register(worker, deps)

    async def start(self) -> None:
        await self.manager.start_all()

    async def kill_one(self) -> str:
        raise NotImplementedError("kill -9 needs the workers in processes of their own")

    def states(self) -> dict[str, Any]:
        return {name: (status["state"], status["restarts"])
                for name, status in self.manager.get_status().items()}

    def problems(self) -> list[str]:
        """No worker ended failed (a standalone manager fails one at its first crash);
        no start found more handlers of its limit running than its concurrency."""
        return [f"worker {name} is {status['state']} after {status['restarts']} restarts: "
                f"{status['last_error']}"
                for name, status in self.manager.get_status().items()
                if status["state"] == "failed" or status["restarts"]] + self.probe.over

    async def stop(self) -> list[str]:
        await self.manager.stop_all(2)
        await self.client.aclose()
        return []


async def run_example(url: str, example: Example, *, label: str = "comp",
                      workers: Callable[[StreamKeys, Built], Any] | None = None,
                      kill_at: int | None = None) -> Figures:
    """Run ``example`` against the server at ``url`` under a fresh prefix and check every
    invariant; raises AssertionError (with what was seen) when one is broken.

    ``workers`` makes the example's workers from its keys and pipeline (default: in
    this process, :class:`InProcess`); with ``kill_at``, one of them is killed (-9) once
    the example's streams hold that many entries."""
    async with fuzz_model() as model:
        os.environ["FUZZ_MODEL_URL"] = model.url  # the kill -9 variant's processes too
        return await _run_example(url, example, label, workers, kill_at, model.url)


async def _run_example(url: str, example: Example, label: str,
                       workers: Callable[[StreamKeys, Built], Any] | None,
                       kill_at: int | None, model_url: str) -> Figures:
    started = time.monotonic()
    keys = StreamKeys(unique_prefix(label), partitions=example.shape.partitions)
    built = build(example.shape, model_url)
    redis = aioredis.Redis.from_url(url, decode_responses=True)
    running = (workers or (lambda k, b: InProcess(url, k, b)))(keys, built)
    ctx = Context(redis, keys, built, running, example)
    figures = Figures()
    stopped = False
    try:
        await running.start()
        # What Client.submit does, over these keys (partitions included).
        submitter = Runs(redis, keys, built.pipeline, payload_limit=PAYLOAD_LIMIT)
        try:
            for n, run in enumerate(example.runs):
                run_id, _ = await submitter.submit({"run": n, "modes": list(run.modes)})
                ctx.runs[run_id] = run.decision
                ctx.modes[run_id] = run.modes
        finally:
            await submitter.close()
        ids = list(ctx.runs)
        for junk in example.garbage:
            await _write_garbage(ctx, junk, ids)
            figures.garbage += 1
        if kill_at is not None:
            figures.kills += await _kill_at(ctx, kill_at)
        await settle(ctx, "the runs")
        if example.replays:
            for n, step in example.replays:
                figures.replays += await _replay(ctx, ids[n], step)
            await settle(ctx, "the replays")
        await check(ctx, figures)
        stopped = True
        ended = await running.stop()
        if ended:
            raise AssertionError("the workers did not stop cleanly:\n  " + "\n  ".join(ended))
        if example.change is not None and workers is None:
            await _started_again(url, ctx, example, model_url)
    finally:
        if not stopped:
            await running.stop()
        await redis.aclose()
    figures.runs = len(ctx.runs)
    figures.reviews = sum(ctx.decided.values())
    figures.seconds = time.monotonic() - started
    return figures


async def _started_again(url: str, ctx: Context, example: Example, model_url: str) -> None:
    """Start the example's pipeline again, changed as ``example.change`` says, once
    everything settled: no retained entry is handled again (every stream keeps the
    entries it had; a new step's output stream stays empty), and what it settles to
    keeps every invariant."""
    before = {stream: await ctx.redis.xlen(stream) for stream in await streams(ctx)}
    changed = build(example.shape, model_url, example.change)
    again = InProcess(url, ctx.keys, changed)
    ctx.workers, ctx.built = again, changed
    try:
        await again.start()
        await settle(ctx, f"the start again ({example.change})")
        after = {stream: await ctx.redis.xlen(stream) for stream in await streams(ctx)}
        grown = {s: (before.get(s, 0), n) for s, n in after.items() if n != before.get(s, 0)}
        problems = [f"started again ({example.change}): {s} went from {a} to {b} entries"
                    for s, (a, b) in grown.items()] + again.problems()
        if problems:
            raise AssertionError("invariants broken:\n  " + "\n  ".join(problems) + "\n"
                                 + await diagnosis(ctx))
    finally:
        await again.stop()


async def _kill_at(ctx: Context, entries: int) -> int:
    """Kill one worker process once the streams hold ``entries`` entries (or at once
    when the runs are done before that: ``wait_for`` is bounded)."""

    async def written() -> bool:
        total = 0
        for stream in await streams(ctx):
            total += await ctx.redis.xlen(stream)
        return total >= entries

    with contextlib.suppress(TimeoutError):
        await wait_for(written, timeout=3, interval=0.005, message=f"{entries} entries")
    mid_run = bool(set(ctx.runs) - set(await outcomes(ctx)))
    ctx.log.append(f"killed {await ctx.workers.kill_one()} at {entries} entries")
    return int(mid_run)


async def _write_garbage(ctx: Context, junk: Garbage, ids: list[str]) -> None:
    consumed = sorted({t for s in ctx.pipeline.steps.values() for t in s.consumes})
    event_type = consumed[junk.stream % len(consumed)]
    fields: dict[str, str] = {"attempt": "1", "producer": GARBAGE}
    if junk.run is not None:
        run = f"junk-{junk.stream}-{junk.kind}" if junk.run < 0 else ids[junk.run % len(ids)]
        fields["correlation_id"] = run
        if junk.run < 0:
            ctx.runs.setdefault(run, "approve")  # a run of its own: it must end too
    else:
        run = ""
    if junk.kind == "nonjson":
        fields["data"] = '{"run": 1, "modes": ['
    elif junk.kind == "huge":
        fields["data"] = json.dumps({"modes": [], "pad": "g" * (PAYLOAD_LIMIT + 10)})
    where = ctx.keys.of(run) if run else ctx.keys.at(0)
    await ctx.redis.xadd(where.stream(event_type), fields)  # type: ignore[arg-type]
    ctx.log.append(f"garbage {junk.kind} in {event_type} naming {run or 'no run'}")


async def _replay(ctx: Context, run_id: str, step: int | None) -> int:
    names = list(ctx.pipeline.steps)
    from_step = None if step is None else names[step % len(names)]
    try:
        result = await replay(ctx.redis, ctx.keys, ctx.pipeline, run_id, from_step)
    except ReplayError as exc:
        ctx.log.append(f"replay of {run_id} from {from_step}: {exc}")
        return 0
    except ValueError as exc:  # a JSONDecodeError: replay took an undecodable entry
        if "replay" not in IGNORE:
            raise AssertionError(f"replay of {run_id} from {from_step} raised "
                                 f"{type(exc).__name__}: {exc}, not ReplayError") from exc
        ctx.log.append(f"replay of {run_id} from {from_step}: {exc!r}")
        return 0
    ctx.runs[result.new_id] = ctx.runs.get(run_id, "approve")
    ctx.modes[result.new_id] = ctx.modes.get(run_id, ())  # the same data, the same handlers
    ctx.log.append(f"replay of {run_id} from {from_step or 'ingress'} as {result.new_id}")
    return 1


# -- waiting -------------------------------------------------------------------------------


#: Seconds everything must look settled in a row before the example is checked.
QUIET_S = 0.1


def settle_bound(example: Example) -> float:
    """How long an example may take to settle: :data:`SETTLE_TIMEOUT`, and the event loop
    each ``stall`` blocks on purpose (:data:`STALL` per first delivery of each attempt a
    stage may make of it, and once more for its entry claimed after the lease lapsed),
    since the worker can do nothing else meanwhile."""
    stalls = sum(2 * max(1, stage.attempts)
                 for run in example.runs for stage, mode in zip(example.shape.stages, run.modes,
                                                                strict=False)
                 if mode == "stall")
    return SETTLE_TIMEOUT + STALL * stalls


async def settle(ctx: Context, what: str) -> None:
    """Decide every open review as the example says, until every run ended, no review
    is open and everything is read and acknowledged; bounded by :func:`settle_bound`."""

    quiet_since: list[float] = []
    bound = settle_bound(ctx.example)

    async def still() -> bool:
        await decide_reviews(ctx)
        ended = await outcomes(ctx)
        if set(ctx.runs) - set(ended):
            return False
        if await unsettled(ctx) or await open_reviews(ctx):
            return False
        return not await unsettled(ctx)

    async def settled() -> bool:
        """Still for :data:`QUIET_S` in a row: the looks are not one atomic read, and a
        run that ended failed may still reach a budget's hold (a review) after it."""
        if not await still():
            quiet_since.clear()
            return False
        quiet_since[:1] = quiet_since[:1] or [time.monotonic()]
        return time.monotonic() - quiet_since[0] >= QUIET_S

    try:
        await wait_for(settled, timeout=bound, interval=0.01, message=what)
    except TimeoutError:
        raise AssertionError(f"{what} did not settle within {bound:g} s:\n"
                             + await diagnosis(ctx)) from None


async def decide_reviews(ctx: Context) -> None:
    pipeline = ctx.pipeline
    if ctx.example.reviews == "deadline":
        kinds = {kind: 0.05 for kind in pipeline.review_kinds}
        kinds.update({f"gate{i}": 0.05 for i in range(len(ctx.example.shape.stages))})
        kinds.update({f"answer{i}": 0.05 for i in range(len(ctx.example.shape.stages))})
        made = await reviews.expire_reviews(ctx.redis, ctx.keys, pipeline, kinds)
        ctx.decided["deadline"] += len(made)
        return
    for review in await reviews.list_reviews(ctx.redis, ctx.keys, pipeline):
        run = review["correlation_id"]
        decision = ctx.runs.get(run, "approve")
        try:
            if decision == "approve":
                await reviews.approve(ctx.redis, ctx.keys, pipeline, review["id"], by="fuzz")
            else:
                await reviews.reject(ctx.redis, ctx.keys, pipeline, review["id"], by="fuzz",
                                     note="fuzz")
        except ReviewNotFound:
            continue
        except ReviewRunEnded:  # its run had ended: the review closed, nothing written
            ctx.log.append(f"review {review['kind']} of {run}: {decision}: the run had ended")
            continue
        ctx.decided[f"{review['kind']}:{decision}"] += 1
        ctx.log.append(f"review {review['kind']} of {run}: {decision}")


async def open_reviews(ctx: Context) -> list[dict[str, Any]]:
    return await reviews.list_reviews(ctx.redis, ctx.keys, ctx.pipeline)


async def entries(ctx: Context, event_type: str) -> list[tuple[str, dict[str, str]]]:
    found: list[tuple[str, dict[str, str]]] = []
    for part in ctx.keys.each():
        found += await ctx.redis.xrange(part.stream(event_type))
    return found


async def outcomes(ctx: Context) -> dict[str, list[tuple[str, str]]]:
    """Run id -> its outcome entries ``(entry id, type)``."""
    ended: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for event_type in ctx.pipeline.outcomes:
        for entry_id, fields in await entries(ctx, event_type):
            run = correlation_of(fields, ctx.pipeline.correlation_field)
            if run:
                ended[run].append((entry_id, event_type))
    return ended


async def streams(ctx: Context) -> list[str]:
    return sorted([key async for key in ctx.redis.scan_iter(match=f"{ctx.keys.prefix}:*",
                                                             _type="STREAM", count=1000)])


async def unsettled(ctx: Context) -> list[str]:
    """What is not settled yet: groups holding entries or behind their stream, joins not
    finished."""
    found = []
    for stream in await streams(ctx):
        try:
            groups = await ctx.redis.xinfo_groups(stream)
        except aioredis.ResponseError:
            continue
        last = ""
        for group in groups:
            lag = group.get("lag")
            if lag is None:  # unknown once entries were deleted (withdrawn outputs)
                if not last:  # (the last entry there is: a deleted one is never read)
                    newest = await ctx.redis.xrevrange(stream, count=1)
                    last = newest[0][0] if newest else "0-0"
                lag = int(_order(group["last-delivered-id"]) < _order(last))
            if group["pending"] or lag:
                found.append(f"{stream} group {group['name']}: pending {group['pending']}, "
                             f"lag {lag}")
    for join in ctx.built.joins:
        for part in ctx.keys.each():
            due = await ctx.redis.zcard(part.join_deadlines(join))
            if due:
                found.append(f"join {join}: {due} not finished")
    return found


async def diagnosis(ctx: Context) -> str:
    ended = await outcomes(ctx)
    lines = [f"runs not ended: {sorted(set(ctx.runs) - set(ended))}",
             f"open reviews: {[(r['kind'], r['correlation_id']) for r in await open_reviews(ctx)]}",
             f"unsettled: {await unsettled(ctx)}",
             f"workers: {ctx.workers.states()}"]
    lines += [f"  {line}" for line in ctx.log]
    lines.append("entries:")
    for stream in await streams(ctx):
        for entry_id, fields in await ctx.redis.xrange(stream):
            shown = {k: (v[:80] + "..." if len(v) > 80 else v) for k, v in fields.items()
                     if k in ("type", "correlation_id", "producer", "reason_code", "error",
                              "data", "idempotency_key", "cost", "kind", "step", "attempt",
                              "text", "passed", "reasons")}
            lines.append(f"  {stream.removeprefix(ctx.keys.prefix)} {entry_id} {shown}")
    return "\n".join(lines)


# -- the invariants ------------------------------------------------------------------------


async def check(ctx: Context, figures: Figures) -> None:
    """Every invariant, once the example settled; an AssertionError naming each broken
    one, with the example's entries."""
    problems = ctx.workers.problems()  # none failed; Limit(concurrency=N) held
    problems += [f"unsettled: {line}" for line in await unsettled(ctx)]
    problems += await _run_problems(ctx, figures)
    problems += await _write_problems(ctx)
    problems += await _blame_problems(ctx)
    problems += await _audit_problems(ctx)
    if not figures.kills:  # a process killed mid-attempt cannot retract what it showed
        problems += await _stream_problems(ctx)
    if problems:
        raise AssertionError("invariants broken:\n  " + "\n  ".join(problems) + "\n"
                             + await diagnosis(ctx))


async def _run_problems(ctx: Context, figures: Figures) -> list[str]:
    """Every run ended; a dead letter after the outcome ends nothing."""
    problems = []
    ended = await outcomes(ctx)
    for run in ctx.runs:
        # Entries of two streams in one millisecond have no order of their own: a
        # run:failed tied with an outcome came first (a dead letter, commit.lua, writes none for a
        # run its index has seen end by an outcome), and the run went on to that outcome
        # (another branch, which a dead letter does not stop).
        found = sorted(ended.get(run, []),
                       key=lambda e: (_order(e[0])[0], e[1] != RUN_FAILED, _order(e[0])[1]))
        if not found:
            problems.append(f"run {run} has no outcome")
            continue
        figures.statuses[found[0][1]] += 1
        # (A run that ended failed may end failed again: a dead letter in commit.lua.)
        late = [e for e in found[1:] if e[1] == RUN_FAILED and found[0][1] != RUN_FAILED]
        if late and "late" not in IGNORE:
            problems.append(f"run {run}: run:failed {late} after its outcome {found[0]}")
    return problems


async def _write_problems(ctx: Context) -> list[str]:
    """No event written twice (per stream and run, one entry per idempotency key); no
    output duplicated (per run, one entry of each of its chain's types); spent equals
    the sum of the costs its entries committed (each handler call once)."""
    pipeline, field_name = ctx.pipeline, ctx.pipeline.correlation_field
    keyed: Counter[tuple[str, str, str]] = Counter()
    chain: Counter[tuple[str, str]] = Counter()
    calls: dict[str, dict[tuple[str, str, str], float]] = defaultdict(dict)
    chain_types = set(ctx.built.chain[1:])
    for stream in await streams(ctx):
        _, event_type = ctx.keys.locate(stream)
        for _entry_id, fields in await ctx.redis.xrange(stream):
            run = correlation_of(fields, field_name) or ""
            key = fields.get("idempotency_key")
            if key:
                keyed[(event_type, run, _identity(event_type, key, fields))] += 1
            if (event_type in chain_types and run and REPLAY_FOR not in fields
                    and fields.get("producer") != GARBAGE):
                chain[(event_type, run)] += 1  # (a budget's release is for one step)
            cost = fields.get("cost")
            if cost and fields.get("producer") in pipeline.steps and event_type != "dlq":
                call = (fields["producer"], fields.get("duration_ms", ""), cost)
                calls[run][call] = float(json.loads(cost).get("usd", 0))
    problems = [f"{n} entries of {t} for run {r} with idempotency key {k}"
                for (t, r, k), n in keyed.items() if n > 1]
    problems += [f"{n} entries of {t} for run {r}" for (t, r), n in chain.items() if n > 1]
    if pipeline.has_budgets:
        for run in ctx.runs:
            held = await ctx.redis.hgetall(ctx.keys.of(run).budget(run))
            spent = decode_spent(held.get("usd"))
            committed = sum(calls.get(run, {}).values())
            if abs(spent - committed) > 1e-6:
                problems.append(f"run {run}: spent {spent!r} but its entries committed "
                                f"{committed!r} ({sorted(calls.get(run, {}).values())})")
    return problems


async def _audit_problems(ctx: Context) -> list[str]:
    """A middleware's audit record is committed with its call's outputs: what it names of
    the chain's types was written by its step for its run (and at most one per entry: the
    idempotency-key check of :func:`_write_problems`). Reviews are left out: a decided
    one leaves the review stream."""
    if not ctx.built.pipeline.middleware:
        return []
    written: set[tuple[str, str, str]] = set()
    field_name = ctx.pipeline.correlation_field
    for stream in await streams(ctx):
        _, event_type = ctx.keys.locate(stream)
        for _entry_id, fields in await ctx.redis.xrange(stream):
            # A withheld output was written, then withheld: its run had ended.
            written.add((fields.get("type", "") if event_type == WITHHELD else event_type,
                         fields.get("producer", ""),
                         correlation_of(fields, field_name) or ""))
    problems = []
    for _entry_id, fields in await entries(ctx, AUDIT):
        data, run = json.loads(fields["data"]), correlation_of(fields, field_name) or ""
        problems += [f"run {run}: {data['step']}'s audit of {data['entry']} names {t}, "
                     "which it did not write" for t in data["wrote"]
                     if t in ctx.built.chain and (t, data["step"], run) not in written]
    return problems


async def _blame_problems(ctx: Context) -> list[str]:
    """A process's death is blamed on the entry that kills it alone: no dead letter for
    a death (its error says the process died) of a run whose handlers never crash."""
    problems = []
    crashing = {run for run, modes in ctx.modes.items() if "crash" in modes}
    for _entry_id, fields in await entries(ctx, "dlq"):
        run = correlation_of(fields, ctx.pipeline.correlation_field) or ""
        if "died" in fields.get("error", "") and run not in crashing:
            problems.append(f"run {run} (no crash in it) dead-lettered for a death: "
                            f"{fields.get('error')}")
    return problems


async def _stream_problems(ctx: Context) -> list[str]:
    """Every draft shown is closed: each step's partials of a run are followed by a
    verdict of that step (passed or retracted), whatever failed (reference: streaming
    through the gate)."""
    problems = []
    for run in ctx.runs:
        open_: dict[str, str] = {}
        for entry_id, fields in await ctx.redis.xrange(ctx.keys.of(run).partials(run)):
            if fields.get("kind") == "partial":
                open_.setdefault(fields["step"], entry_id)
            else:
                open_.pop(fields["step"], None)
        problems += [f"run {run}: the draft of {step} shown at {at} has no verdict"
                     for step, at in open_.items()]
    return problems


def _identity(event_type: str, key: str, fields: Mapping[str, str]) -> str:
    """What makes an entry one event: its idempotency key, and for those written once
    per group that handled an entry (its dead letter, which copies the entry's key, and
    the ``run:failed`` that names the entry) the group, and for a copy meant for some
    steps (a budget's release) those steps."""
    if event_type in ("dlq", RUN_FAILED):
        key += f" by {fields.get('worker') or fields.get('producer')}"
    if REPLAY_FOR in fields:
        key += f" for {fields[REPLAY_FOR]}"
    return key


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def summary(figures: list[Figures]) -> str:
    statuses: Counter[str] = Counter()
    for f in figures:
        statuses.update(f.statuses)
    return (f"examples {len(figures)}, runs {sum(f.runs for f in figures)}, "
            f"outcomes {dict(statuses)}, reviews decided {sum(f.reviews for f in figures)}, "
            f"replays {sum(f.replays for f in figures)}, "
            f"garbage entries {sum(f.garbage for f in figures)}, "
            f"kill -9 mid-run {sum(f.kills for f in figures)}, "
            f"slowest example {max((f.seconds for f in figures), default=0):.2f} s")
