"""Aggregators: join parallel branches by correlation id under an explicit merge policy.

Partial results live in Redis (a hash per correlation id, with a TTL), so a restart loses
no join. The result is written with a ``once`` guard, so it is emitted exactly once
however many consumers or redeliveries evaluate the same join; a branch arriving after
that is recorded in the hash (``late:<branch>``), not emitted again. A join opened but
not complete at its deadline (counted from the opening entry's ``produced_at``) is
finished by a sweeper with the missing branches named (sweepers lease the joins they take).
A failure there stays with its join (docs/reference.md, Failures): a policy (or
``on_timeout``) that raises, or does not decide, is retried on later sweeps with backoff
(attempts counted in the hash), then goes to ``dlq`` (``merge_failed``) under the result's
``once`` guard.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from printery.base import _json
from printery.base._util import idle, parse_rfc3339
from printery.base.backoff import compute_backoff
from printery.base.errors import PipelineError
from printery.pipeline.step import (
    BoundStep,
    Step,
    check_concurrency,
    check_renamed_from,
    refuses_unknown_options,
)
from printery.runtime.handler import HandlerResult, Message, Output
from printery.runtime.step_context import StepContext
from printery.runtime.writes import dead_letter_write
from printery.store.joins import JoinStore, arrivals
from printery.store.outage import UNREACHABLE
from printery.wire.keys import StreamKeys

log = structlog.get_logger("printery.aggregate")

MERGE_FAILED = "merge_failed"
SWEEP_BATCH, SWEEP_LEASE_MS, TRACEBACK_LIMIT = 100, 10_000, 4000


class JoinFailed(Exception):
    """A join's merge policy (or ``on_timeout``) failed, or did not decide at the deadline."""


@dataclass(frozen=True, slots=True)
class JoinState:
    """What a merge policy sees: the arrivals so far, by branch name."""

    correlation_id: str
    arrived: Mapping[str, Any]
    branches: tuple[str, ...]
    closed_by: str | None = None
    timed_out: bool = False
    missing: tuple[str, ...] = field(default=())

    @property
    def complete(self) -> bool:
        return all(b in self.arrived for b in self.branches)


MergePolicy = Callable[[JoinState], Any | None]
"""Returns the merged data once the join is decided, or None to keep waiting. It must
decide when ``closed_by`` is set or ``timed_out`` is true."""


def all_must_pass(
    *, status_of: Callable[[str, Any], str], precedence: Sequence[str], timeout_status: str
) -> MergePolicy:
    """Decide when every branch arrived (or at the deadline): the status is the arrivals'
    status that comes first in ``precedence`` (e.g. rejected > blocked > failed > ok)."""
    rank = {status: i for i, status in enumerate(precedence)}

    def policy(state: JoinState) -> Any | None:
        if not (state.complete or state.closed_by or state.timed_out):
            return None
        statuses = [status_of(name, data) for name, data in state.arrived.items()]
        if state.missing:
            statuses.append(timeout_status)
        status = min(statuses, key=lambda s: rank.get(s, len(rank))) if statuses else timeout_status
        return {"status": status, "branches": dict(state.arrived), "missing": list(state.missing)}

    return policy


def any_pass(*, passed: Callable[[str, Any], bool]) -> MergePolicy:
    """Decide as soon as one branch passes; fail when all arrived (or timed out) and none did."""

    def policy(state: JoinState) -> Any | None:
        for name, data in state.arrived.items():
            if name in state.branches and passed(name, data):
                return {"status": "passed", "branch": name, "data": data}
        if state.complete or state.closed_by or state.timed_out:
            return {"status": "failed", "branches": dict(state.arrived), "missing": list(state.missing)}
        return None

    return policy


def first_wins() -> MergePolicy:
    """The first branch to arrive decides."""

    def policy(state: JoinState) -> Any | None:
        for name in state.branches:
            if name in state.arrived:
                return {"status": "decided", "branch": name, "data": state.arrived[name]}
        if state.closed_by or state.timed_out:
            return {"status": "failed", "branches": dict(state.arrived), "missing": list(state.missing)}
        return None

    return policy


#: The policy factories and how to call them, for the error that names what to write.
_FACTORY_CALLS: dict[Callable[..., MergePolicy], str] = {
    all_must_pass: 'all_must_pass(status_of=lambda branch, data: data["status"], '
                   'precedence=[...], timeout_status="failed")',
    any_pass: "any_pass(passed=lambda branch, data: ...)",
    first_wins: "first_wins()",
}


def check_policy(name: str, policy: object) -> None:
    """Refuse, when the aggregator is defined, a policy that could only fail at run time:
    a factory passed uncalled, or anything not callable with one :class:`JoinState`."""
    for factory, call in _FACTORY_CALLS.items():
        if policy is factory:
            raise PipelineError(f"aggregator {name!r}: policy={factory.__name__} is the policy "
                                f"factory, not a policy; call it: policy={call}")
    if not callable(policy):
        raise PipelineError(f"aggregator {name!r}: policy={policy!r} is not callable; write a "
                            "function of one JoinState that returns the merged data or None")
    try:
        inspect.signature(policy).bind(None)
    except TypeError:
        raise PipelineError(
            f"aggregator {name!r}: policy {getattr(policy, '__name__', policy)!r} cannot be "
            f"called with one JoinState (its signature is {inspect.signature(policy)}); write "
            "a function of one JoinState that returns the merged data or None"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): trust it
        return


@refuses_unknown_options("aggregator")
class Aggregator:
    """Builds the aggregator step (``pipeline.add`` it).

    ``opens`` is the event type whose arrival opens a join (its name in the arrivals is
    ``opens_as``) and starts the deadline; ``branches`` maps each branch's event type to its
    branch name; ``closes`` maps event types that decide a join at once (e.g. a rejection)
    to the name they are stored under. ``emits`` is the merged event's type.
    ``renamed_from``: the aggregator's old name, whose groups it takes over (reference:
    where a group starts; its open joins are kept under its name).
    """

    def __init__(
        self,
        name: str,
        *,
        opens: str,
        opens_as: str,
        branches: Mapping[str, str],
        emits: str,
        policy: MergePolicy,
        closes: Mapping[str, str] | None = None,
        deadline: float = 120.0,
        ttl: float = 7 * 86400.0,
        sweep_interval: float | None = None,
        concurrency: int = 1,
        on_timeout: Callable[[JoinState, Any], Sequence[Output]] | None = None,
        extra_produces: Sequence[str] = (),
        renamed_from: str | None = None,
    ) -> None:
        check_policy(name, policy)
        check_renamed_from(f"aggregator {name!r}", name, renamed_from)
        check_concurrency(f"aggregator {name!r}", concurrency)
        self.name = name
        self.opens, self.opens_as = opens, opens_as
        self.branches = dict(branches)
        self.closes = dict(closes or {})
        self.emits = emits
        self.policy = policy
        self.deadline = deadline
        self.ttl_s = int(ttl)
        self.sweep_interval = sweep_interval or max(0.05, min(deadline / 4, 1.0))
        self.concurrency = concurrency
        self.on_timeout = on_timeout
        self.extra_produces = tuple(extra_produces)
        self.renamed_from = renamed_from

    def steps(self) -> tuple[Step]:
        """The aggregator's one step (what :meth:`Pipeline.add <printery.Pipeline.add>`
        adds when given it)."""
        return (self.step(),)

    def step(self) -> Step:
        """The aggregator as a pipeline step; its handler, which keeps the joins in the
        server, is built for each worker that runs it (``Step.bind``)."""
        return Step(
            name=self.name,
            consumes=(self.opens, *self.branches, *self.closes),
            produces=(self.emits, *self.extra_produces),
            handler=self.handle,
            concurrency=self.concurrency,
            companions=(self._sweep,),
            bind=self._bind,
            # One join evaluation at a time per consumer, so a branch that arrives after the
            # decision sees it and is recorded as late; across consumers the ``once`` guard
            # still keeps the result unique.
            settings={"parallel": 1},
            renamed_from=self.renamed_from,
        )

    def _bind(self, context: StepContext) -> BoundStep:
        """The handler of one worker of this step: the joins where its keys say."""
        keys, arrive = context.keys, self._arrive
        joins = JoinStore(context.store, self.name, ttl_s=self.ttl_s)

        def handle(message: Message) -> Awaitable[HandlerResult]:  # no coroutine of its own
            return arrive(message, keys, joins)

        return BoundStep(handle)

    def _once(self, correlation_id: str) -> str:
        return f"{self.emits}:{correlation_id}"

    def _state(self, correlation_id: str, raw: Mapping[str, str], *, timed_out: bool = False) -> JoinState:
        arrived = {k: _json.loads(v) for k, v in arrivals(raw).items()}
        closed_by = next((n for n in self.closes.values() if n in raw), None)
        names = (self.opens_as, *self.branches.values())
        missing = tuple(b for b in names if b not in arrived) if timed_out else ()
        return JoinState(correlation_id, arrived, names, closed_by, timed_out, missing)

    async def handle(self, message: Message) -> HandlerResult:
        """The handler outside a worker: a join needs the server, which the handler a
        worker runs is built with (``Step.bind``, by :meth:`Pipeline.build_workers
        <printery.Pipeline.build_workers>`)."""
        raise RuntimeError(f"aggregator {self.name!r}: its handler runs in a worker built by "
                           "Pipeline.build_workers (its joins live in the server)")

    async def _arrive(self, message: Message, every: StreamKeys,
                      joins: JoinStore) -> HandlerResult:
        cid, kind = message.correlation_id, message.type
        keys = every.of(cid)  # a run's join state lives in its partition
        slot = self.opens_as if kind == self.opens else self.branches.get(kind) or self.closes[kind]
        opened_ms = None
        if kind == self.opens:
            opened_ms = int(parse_rfc3339(message.envelope.produced_at).timestamp() * 1000)
        decided, raw = await joins.arrive(
            keys, cid, once=keys.once(self._once(cid)), slot=slot, data=_json.dumps(message.data),
            opened_ms=opened_ms, deadline_ms=(opened_ms or 0) + int(self.deadline * 1000))
        if decided:
            # Already decided: record the late arrival, emit nothing.
            await joins.late(keys, cid, slot, message.envelope.produced_at)
            log.info("late arrival recorded", worker=self.name, correlation_id=cid, branch=slot)
            return None
        merged = self.policy(self._state(cid, raw))
        if merged is None:
            return None
        return Output(self.emits, merged, correlation_id=cid, once=self._once(cid))

    async def _sweep(self, context: StepContext) -> None:
        """Finish joins whose deadline passed, with the missing branches named."""
        joins = JoinStore(context.store, self.name, ttl_s=self.ttl_s)  # its script loaded once
        while True:
            await idle(self.sweep_interval)
            with contextlib.suppress(*UNREACHABLE):
                await self._sweep_once(context, joins)

    async def _sweep_once(self, context: StepContext, joins: JoinStore | None = None) -> int:
        """Finish (or fail) due joins of every partition; the results written. A
        connection error ends it."""
        finished = 0
        joins = joins or JoinStore(context.store, self.name, ttl_s=self.ttl_s)
        for keys in context.keys.each():
            finished += await self._sweep_partition(context, joins, keys)
        return finished

    async def _sweep_partition(self, context: StepContext, joins: JoinStore, keys: StreamKeys) -> int:
        due = await joins.take_due(keys, int(time.time() * 1000), lease_ms=SWEEP_LEASE_MS,
                                   batch=SWEEP_BATCH)
        finished = 0
        for cid in due:
            decided, raw = await joins.read(keys, cid, keys.once(self._once(cid)))
            if not decided:
                try:
                    finished += await context.emit(self._decide(cid, raw), correlation_id=cid)
                except UNREACHABLE:
                    raise
                except Exception as exc:  # the policy's (JoinFailed), or outputs not writable
                    await self._failed(context, joins, cid, raw, exc)
                    continue
                log.warning("join finished at its deadline", worker=self.name,
                            correlation_id=cid, arrived=sorted(raw))
            await joins.done(keys, cid)
        return finished

    def _decide(self, cid: str, raw: Mapping[str, str]) -> list[Output]:
        state = self._state(cid, raw, timed_out=True)
        try:  # whatever the policy raises is the join's failure, an OSError too
            merged = self.policy(state)
            extra = [] if merged is None or not self.on_timeout else list(self.on_timeout(state, merged))
        except Exception as exc:
            raise JoinFailed(str(exc)) from exc
        if merged is None:
            raise JoinFailed("the merge policy made no decision at the join's deadline")
        return [Output(self.emits, merged, correlation_id=cid, once=self._once(cid)), *extra]

    async def _failed(self, context: StepContext, joins: JoinStore, cid: str,
                      raw: Mapping[str, str], exc: Exception) -> None:
        """Count a failed attempt at deciding a join: retry it later with backoff, or after
        ``max_deliveries`` attempts dead-letter it."""
        if isinstance(exc, JoinFailed) and isinstance(exc.__cause__, Exception):
            exc = exc.__cause__
        keys, settings = context.keys.of(cid), context.settings
        error = f"{type(exc).__name__}: {exc}"
        attempt = await joins.failed_attempt(keys, cid)
        log.error("join failed at its deadline", worker=self.name, correlation_id=cid,
                  attempt=attempt, max_deliveries=settings.max_deliveries, error=error, exc_info=exc)
        if attempt < settings.max_deliveries:
            delay = compute_backoff(attempt, base_ms=settings.retry_backoff_ms,
                                    cap_ms=settings.retry_backoff_cap_ms)
            await joins.due_again(keys, cid, int((time.time() + delay) * 1000))
            return
        # Still leased by this sweep: no one else takes it; due again if the dlq write fails.
        # Its dead letter ends the run (``run:failed``), once (the join's own guard).
        fields = context.codec.new_fields(
            self.emits, self._state(cid, raw).arrived, correlation_id=cid, producer=self.name,
            idempotency_key=f"{self.emits}:{cid}")
        letter = replace(dead_letter_write(
            keys, context.codec, group=self.name, stream=keys.stream(self.opens), entry_id="",
            consumer="", fields=fields, reason_code=MERGE_FAILED, error=error,
            deliveries=attempt,
            traceback="".join(traceback.format_exception(exc))[-TRACEBACK_LIMIT:],
            index=None if context.index is None else context.index.within(keys),
        ), once=keys.once(self._once(cid)), once_ttl_ms=int(settings.record_ttl * 1000))
        try:
            written = await joins.dead_letter(letter)
        except UNREACHABLE:
            raise
        except Exception:
            log.exception("could not dead-letter a failed join", worker=self.name, correlation_id=cid)
            return
        await joins.done(keys, cid)
        log.error("join dead-lettered" if written else "join was decided meanwhile",
                  worker=self.name, correlation_id=cid, reason_code=MERGE_FAILED, deliveries=attempt)
