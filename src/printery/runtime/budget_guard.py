"""A step's budgets at run time (reference: budgets): the check before handlers run, what a
held entry writes instead, and what a commit charges to its run.

The check is a ``ZMSCORE`` of the batch's runs in the sorted set of runs that reached a
hard limit (``StreamKeys.budgets_over``, kept by the commits that charge them), sent in
the round trip that looks up the batch's idempotency records
(:meth:`~printery.transport.records.RecordLookup.recorded_and_read`): a pipeline with
budgets costs no round trip more in the usual case, and the server does next to nothing
per entry. Only a run found there is compared with the limits and their raises, by one
script (``budget_check.lua``) over those runs in a round trip of its own: a run in the set
may be under a raised limit (a review approved it), never over one without being in it,
since the commit that takes a run to a hard limit puts it there in the same transaction.
One without budgets costs nothing (the entry pipeline has no guard then). A step with
``estimate=`` also reserves its estimate before its handlers run
(:mod:`printery.runtime.reservations`); one without reserves nothing.

The charge travels with the entry's commit
(:class:`~printery.transport.commit.BudgetCharge`, of the step's
:class:`~printery.transport.commit.ChargePlan`): spent is counted if and only if the
entry's outputs are written, and the soft warning is decided inside the same script.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from printery.rules.budgets import (
    BUDGET_EXCEEDED,
    BUDGET_FIELD,
    BUDGET_LIMIT,
    BUDGET_RAISE,
    BUDGET_REVIEW_KIND,
    BUDGET_SPENT,
    BUDGET_UNIT,
    BUDGET_WARNING,
    HELD_FROM,
    HELD_IN,
    HELD_KEY,
    BudgetPlan,
    Exceeded,
    exceeded_data,
    held_type,
    review_guard,
)
from printery.runtime.handler import Message, Output
from printery.runtime.reservations import Reservations
from printery.transport.channel import Command
from printery.transport.commit import (
    BudgetCharge,
    ChargePlan,
    decode_spent,
    encode_amount,
    encode_limit,
)
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.envelope import Codec
from printery.wire.fields import REPLAY_FOR, TRACEPARENT, review_fields
from printery.wire.keys import REVIEW, StreamKeys, raise_field

#: Fields of a held entry's envelope it does not keep: what its producing call cost and
#: took (the held copy is not that call), and the steps it was meant for (now this one);
#: its trace and replay mark come with every output of the hold.
_NOT_KEPT = frozenset({"cost", "duration_ms", REPLAY_FOR, TRACEPARENT, "replay_of"})

BUDGET_CHECK_LUA = script("budget_check")


class BudgetGuard:
    """One step's budgets, for its entry pipeline."""

    def __init__(
        self, plan: BudgetPlan, *, keys: StreamKeys, codec: Codec, worker: str,
        client: Redis, reserve_ms: int = 0,
    ) -> None:
        self.plan = plan
        self.keys = keys
        self.codec = codec
        self.worker = worker
        self.client = client
        self._scripts = Scripts(client)
        self._limits = plan.limits  # built once: checked for every batch
        self._check_args = [len(self._limits)] + [
            value for limit in self._limits
            for value in (limit.field, raise_field(limit.field), encode_limit(limit.limit))]
        charged = plan.charged()
        #: The units charged, one amount each (the run's field and the step's share it).
        self._units = tuple(dict.fromkeys(unit for _, unit, _, _ in charged))
        #: The unit when there is one (the usual case: one lookup).
        self._unit = self._units[0] if len(self._units) == 1 else None
        self._last_amount: float | None = None
        self._last_amounts: tuple[str, ...] = ()
        hard = {limit.field: limit.limit for limit in self._limits}
        self._charge_plan = ChargePlan(
            keys.budget_prefix, tuple(name for name, _, _, _ in charged),
            tuple(soft for _, _, soft, _ in charged), tuple(note for _, _, _, note in charged),
            codec.correlation_field, keys.stream(BUDGET_WARNING), {},
            tuple(hard.get(name) for name, _, _, _ in charged), keys.budgets_over,
            tuple(self._units.index(unit) for _, unit, _, _ in charged))
        self._warning_made = -1
        #: The step's estimate, reserved before its handlers run (None: it reserves
        #: nothing); its commits then remove their entry's reservation.
        self.reservations = Reservations(plan, keys=keys, client=client, lease_ms=reserve_ms) \
            if plan.estimate is not None and self._limits else None
        if self.reservations is not None:
            self._charge_plan = self._charge_plan._replace(reserved=keys.reserved_prefix)

    def over_count(self) -> Command | None:
        """The command counting the runs at a hard limit (None: no hard limit to check).
        A read sends it along (:mod:`printery.runtime.intake`): the server runs it right
        after the read returns, so a run over its limit before its entries were read is
        counted, and a batch read with a count of 0 needs no :meth:`reads`."""
        return ("ZCARD", self.keys.budgets_over) if self._limits else None

    def reads(self, runs: Sequence[str]) -> list[Command]:
        """The command that finds which of ``runs`` (those of a read batch's entries)
        reached a hard limit: sent with the batch's record lookup, its replies go to
        :meth:`over`."""
        self._refresh()
        if not self._limits:
            return []
        return [("ZMSCORE", self.keys.budgets_over, *runs)]

    async def over(self, runs: Sequence[str], replies: Sequence[Any]) -> dict[int, Exceeded]:
        """The hard limit each entry of ``runs`` is at or over, by its position (only those
        that are), from the replies of :meth:`reads` and, when some run reached a limit,
        one more round trip that compares those runs with their limits and raises. An
        error reply is raised: the batch is not run unchecked."""
        if not self._limits:
            return {}
        (found,) = replies
        if isinstance(found, Exception):
            raise found
        if found.count(None) == len(found):  # the usual case: no run at a limit
            return {}
        candidates = [n for n, score in enumerate(found) if score is not None]
        prefix = self._charge_plan.prefix
        keys = [prefix + runs[n] for n in candidates]
        verdicts = await self._scripts.call(BUDGET_CHECK_LUA, keys, self._check_args)
        over = {}
        for position, number, spent, raised in verdicts:
            limit = self._limits[int(number) - 1]
            over[candidates[int(position) - 1]] = Exceeded(
                limit.field, limit.unit, limit.limit + decode_spent(raised), decode_spent(spent),
                limit.budget.on_exceeded, limit.step)
        return over

    def held(self, message: Message, exceeded: Exceeded) -> list[Output]:
        """What a held entry writes instead of running, committed with its ack: the run's
        terminal ``budget:exceeded`` (once per run); or, for a ``review`` budget, the
        entry itself kept in its run's held stream (what it goes back to its step with,
        and where from) and the ``budget_exceeded`` review of this breach, written by the
        first hold of the run and limit only (a ``once`` guard): one decision releases
        every entry it held (reference: failures)."""
        run = message.correlation_id
        if exceeded.on_exceeded == "stop":
            return [Output(
                BUDGET_EXCEEDED,
                {**exceeded_data(exceeded.unit, exceeded.limit, exceeded.spent),
                 **({"step": exceeded.step} if exceeded.step else {}),
                 **({"reserved": exceeded.reserved} if exceeded.reserved else {})},
                idempotency_key=f"{BUDGET_EXCEEDED}:{run}", once=f"budget-exceeded:{run}",
            )]
        budget = self.plan.own if exceeded.step else self.plan.run
        assert budget is not None
        where = f"step {exceeded.step}" if exceeded.step else "run"
        envelope = message.envelope
        kept = {name: value for name, value in envelope.extra.items()
                if name not in _NOT_KEPT}
        entry = Output(
            held_type(run), message.data,
            idempotency_key=f"{envelope.idempotency_key}:held",
            extra={**kept, "type": message.type, "attempt": str(envelope.attempt),
                   REPLAY_FOR: self.worker, HELD_FROM: message.stream},
        )
        review = Output(
            REVIEW, message.data,
            idempotency_key=f"{REVIEW}:{BUDGET_REVIEW_KIND}:{run}:{exceeded.field}",
            once=review_guard(run, exceeded.field),
            extra={**review_fields(
                kind=BUDGET_REVIEW_KIND, step=self.worker,
                reason=f"{where} budget of {exceeded.unit} reached: spent "
                       f"{exceeded.spent:g} of {exceeded.limit:g}" + (
                           f", {exceeded.reserved:g} reserved by entries running"
                           if exceeded.reserved else ""),
                source_stream=message.stream, source_id=message.entry_id,
                resume_type=message.type, reject_type=BUDGET_EXCEEDED),
                BUDGET_UNIT: exceeded.unit, BUDGET_FIELD: exceeded.field,
                BUDGET_LIMIT: repr(exceeded.limit), BUDGET_SPENT: repr(exceeded.spent),
                BUDGET_RAISE: repr(budget.limits[exceeded.unit]),
                HELD_KEY: envelope.idempotency_key, HELD_IN: self.keys.stream(held_type(run))},
        )
        return [entry, review]

    def charge(self, message: Message) -> BudgetCharge | None:
        """What the commit of ``message``'s outputs adds to its run (None: nothing)."""
        costs = message.costs
        if not costs:
            if self.reservations is None:
                return None
            costs = {}  # nothing spent: the commit still removes the reservation
        unit = self._unit
        if unit is not None:  # one unit: one amount, encoded again only when it changes
            amount = costs.get(unit, 0)
            if amount != self._last_amount:
                self._last_amount = amount
                self._last_amounts = (encode_amount(amount),)
            return BudgetCharge(self._charge_plan, message.envelope.correlation_id,
                                self._last_amounts)
        if not self._units:
            return None
        return BudgetCharge(self._charge_plan, message.envelope.correlation_id,
                            tuple([encode_amount(costs.get(unit, 0)) for unit in self._units]))

    def _refresh(self) -> None:
        """Make the fields of a warning the step's commits may write (the script fills in
        the run, the data and the ids) again once a second, for its ``produced_at``,
        rather than for every commit: called once per read batch."""
        now = int(time.monotonic())
        if now != self._warning_made:
            self._charge_plan = self._charge_plan._replace(warning=self.codec.new_fields(
                BUDGET_WARNING, None, correlation_id="", producer=self.worker))
            self._warning_made = now
