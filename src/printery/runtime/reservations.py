"""Reserved budgets at run time (reference: budgets): what a step with ``estimate=``
reserves of its runs' limits before its handlers run.

Checking what a run spent before a handler and charging it at commit lets every sibling
running at once pass the check together (fifty items of a map, each under the limit
alone, overshoot it fifty-fold). Here the check is a reservation, taken atomically with
every other of the run by one script per read batch (``transport/lua/reserve.lua``): an entry
runs only while spent + reserved + its estimate stays within the limit, else its budget's
``on_exceeded`` applies as for a breach. The entry's commit removes its reservation in
the same transaction that adds what it spent (``commit.lua``, see
:attr:`~printery.transport.commit.ChargePlan.reserved`); a reservation whose handler died
lapses after the step's timeout and the visibility timeout (a redelivery of the entry
finds it and renews it instead of reserving again).

A step without ``estimate=`` has none of this: no round trip, no argument, no script
work.

Its namesake in other layers (the same job there): :mod:`printery.policies.reservations`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from printery.base.errors import PipelineError, WorkerCrashed, describe
from printery.rules.budgets import BudgetPlan, Exceeded, estimated_amounts
from printery.runtime.handler import Message
from printery.transport.commit import decode_spent, encode_amount, encode_limit
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.keys import StreamKeys, parse_reservation, raise_field

RESERVE_LUA = script("reserve")

#: The ``reason_code`` of an entry whose step's estimate function failed or answered
#: something that is not an estimate.
INVALID_ESTIMATE = "invalid_estimate"


class Reservations:
    """One step's estimate, reserved against its runs' hard limits (the run's and the
    step's own) by :meth:`reserve`."""

    def __init__(
        self, plan: BudgetPlan, *, keys: StreamKeys, client: Redis, lease_ms: int,
    ) -> None:
        assert plan.estimate is not None
        self.plan = plan
        self.keys = keys
        self.estimate = plan.estimate
        self._scripts = Scripts(client)
        #: The limited fields a reservation counts against, in the script's order.
        self._limits = plan.limits
        self._head: list[Any] = [lease_ms, len(self._limits)]
        for limit in self._limits:
            self._head += (limit.field, raise_field(limit.field), encode_limit(limit.limit))
        #: The amounts of a fixed estimate, encoded once.
        self._fixed = None if callable(self.estimate) else self._encoded(self.estimate)

    def amounts(self, message: Message) -> tuple[str, ...] | None:
        """What ``message``'s call reserves per limited field (None: nothing). Raises
        :class:`PipelineError` when the step's estimate function fails or answers
        something that is not an estimate (the entry is dead-lettered)."""
        if self._fixed is not None:
            return self._fixed
        estimate = self.estimate
        assert callable(estimate)
        try:
            found = estimate(message)
            if found is None:
                return None
            if not isinstance(found, Mapping):
                raise PipelineError(f"step {self.plan.step!r}: the estimate function returned "
                                    f"{found!r}, not a mapping of cost units to amounts")
            return self._encoded(found) if found else None
        except (PipelineError, WorkerCrashed):
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code: whatever it
            # raises (a bad Mapping's items too) fails its entry only, never the batch
            raise PipelineError(
                f"step {self.plan.step!r}: the estimate function raised {describe(exc)}") from exc

    def _encoded(self, estimate: Mapping[Any, Any]) -> tuple[str, ...]:
        amounts = estimated_amounts(f"step {self.plan.step!r}", estimate, self.plan.units)
        return tuple(encode_amount(amounts.get(limit.unit, 0.0)) for limit in self._limits)

    async def reserve(
        self, messages: Sequence[Message], amounts: Sequence[tuple[str, ...] | None]
    ) -> dict[int, Exceeded]:
        """Reserve ``amounts`` (of :meth:`amounts`) for each of ``messages`` (those of a
        read batch about to run; None: nothing to reserve) in one round trip; the limit
        each refused one would pass, by its position."""
        positions = [n for n, found in enumerate(amounts) if found is not None]
        if not positions or not self._limits:
            return {}
        keys: list[str] = []
        args = list(self._head)
        for n in positions:
            message = messages[n]
            run = message.envelope.correlation_id
            keys += (self.keys.budget(run), self.keys.reserved(run))
            args.append(message.envelope.idempotency_key)
            args += amounts[n]  # type: ignore[arg-type]
        refused = await self._scripts.call(RESERVE_LUA, keys, args)
        found: dict[int, Exceeded] = {}
        for position, number, spent, raised, reserved in refused:
            limit = self._limits[int(number) - 1]
            found[positions[int(position) - 1]] = Exceeded(
                limit.field, limit.unit, limit.limit + decode_spent(raised), decode_spent(spent),
                limit.budget.on_exceeded, limit.step, reserved=decode_spent(reserved))
        return found


def reserved_sums(held: Mapping[str, str], now_ms: float | None = None) -> dict[str, float]:
    """What the live reservations of a run's reservations hash (``StreamKeys.reserved``,
    in the encoding :func:`~printery.wire.keys.parse_reservation` reads) hold, per budget
    field, in units; a lapsed one counts for nothing (the next reservation sweeps it)."""
    now = time.time() * 1000 if now_ms is None else now_ms
    sums: dict[str, float] = {}
    for value in held.values():
        expires, amounts = parse_reservation(value)
        if expires <= now:
            continue
        for field, amount in amounts.items():
            sums[field] = sums.get(field, 0.0) + decode_spent(amount)
    return sums
