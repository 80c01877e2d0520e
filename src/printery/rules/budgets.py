"""Budgets: how much one run may spend, per cost unit, for the whole pipeline and for a
step's own share (reference: budgets).

What a run has spent lives in one Redis hash per run (``StreamKeys.budget``), updated by
the commit of each entry that spent it (``commit.lua``), so it is exact across processes
and crashes. Its fields: ``<unit>`` (the run's total), ``step:<step>:<unit>`` (a step's
share, kept for steps with a budget of their own), ``raise:<field>`` (what approved
reviews added to that field's limit), each in whole billionths of the unit
(:data:`~printery.transport.commit.SPENT_SCALE`: integer adds, exact sums), and
``warned:<field>`` (the soft warning was written). This module is the pure part, low
beside :mod:`printery.rules.limits` so that the runtime reads it without reaching up into the
pipeline: the limits, what a step reads and charges, and the names of what a breach
writes. What a decision on a ``budget_exceeded`` review does is
:mod:`printery.pipeline.budget_review`.

One decision per breach (reference: failures): every entry a run over a ``review`` limit holds
is kept in the run's held stream (:func:`held_type`, in the run's partition), written by
the commit that acknowledges it, with the fields it goes back to its step with and the
stream it came from. The first hold of a run and limit field also writes the review; the
others find its ``once`` guard (:func:`review_guard`) taken.

Reserved budgets: a step that declares what one call is expected to spend (``estimate=``)
reserves it against its run's limits before its handler runs, atomically with every
other reservation of the run (``transport/lua/reserve.lua``, a reservations hash per run
beside its budget hash); the entry's commit replaces its reservation with what it spent.

Its namesake in other layers (the same job there): :mod:`printery.store.budgets`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from printery.base import _json
from printery.base.errors import PipelineError

__all__ = [
    "BUDGET_EXCEEDED",
    "BUDGET_REVIEW_KIND",
    "BUDGET_WARNING",
    "Budget",
    "BudgetPlan",
    "Estimate",
    "Exceeded",
    "check_estimate",
    "exceeded_data",
    "held_type",
    "review_guard",
]

BUDGET_WARNING = "budget:warning"
BUDGET_EXCEEDED = "budget:exceeded"
#: The review kind a run over a ``review`` budget waits in.
BUDGET_REVIEW_KIND = "budget_exceeded"
_MODES = ("stop", "review")

# Fields of a ``budget_exceeded`` review entry beside the review fields: what was
# exceeded, and what the held entry needs to run again.
BUDGET_UNIT = "budget_unit"
BUDGET_FIELD = "budget_field"
BUDGET_LIMIT = "budget_limit"
BUDGET_SPENT = "budget_spent"
BUDGET_RAISE = "budget_raise"
HELD_KEY = "held_idempotency_key"
#: The field of a held entry (in the run's held stream) naming the stream it goes back to.
HELD_FROM = "held_from"
#: The field of a review naming the held stream its decision releases (a review written
#: before held streams has none: its approval puts back the entry it shows).
HELD_IN = "budget_held_in"

def held_type(run: str) -> str:
    """The "type" of a run's held stream (its key is ``keys.stream(held_type(run))``, in
    the run's partition): the entries a ``review`` budget holds until its decision."""
    return f"budget:held:{run}"


def review_guard(run: str, field: str) -> str:
    """The ``once`` guard of the one open ``budget_exceeded`` review of ``run`` and the
    limit ``field`` (``keys.once(...)`` is its key)."""
    return f"budget-review:{run}:{field}"


class Budget:
    """Limits for one run, per cost unit: ``usd``, ``tokens`` and any other unit of the
    pipeline as a keyword. At ``soft`` times a limit a ``budget:warning`` is written once per
    run and unit; at the limit no further handler runs: ``on_exceeded`` ``"stop"`` ends
    the run with ``budget:exceeded``, ``"review"`` asks a person (review kind
    ``budget_exceeded``) whether to raise the limit by its original amount."""

    __slots__ = ("limits", "on_exceeded", "soft")

    def __init__(
        self,
        usd: float | None = None,
        tokens: float | None = None,
        *,
        soft: float = 0.8,
        on_exceeded: str = "stop",
        **units: float,
    ) -> None:
        given = {"usd": usd, "tokens": tokens, **units}
        limits: dict[str, float] = {}
        for unit, limit in given.items():
            if limit is None:
                continue
            if (isinstance(limit, bool) or not isinstance(limit, int | float)
                    or not math.isfinite(limit) or limit <= 0):
                raise PipelineError(f"Budget: {unit}={limit!r} is not a limit; write a number > 0")
            limits[unit] = float(limit)
        if not limits:
            raise PipelineError("Budget: give at least one limit (usd=..., tokens=..., or a unit)")
        if isinstance(soft, bool) or not isinstance(soft, int | float) or not 0 < soft <= 1:
            raise PipelineError(f"Budget: soft={soft!r} must be a fraction in (0, 1]")
        if on_exceeded not in _MODES:
            raise PipelineError(f"Budget: on_exceeded={on_exceeded!r} must be 'stop' or 'review'")
        self.limits: Mapping[str, float] = limits
        self.soft = float(soft)
        self.on_exceeded = on_exceeded

    def __repr__(self) -> str:
        limits = ", ".join(f"{unit}={limit:g}" for unit, limit in self.limits.items())
        return f"Budget({limits}, soft={self.soft:g}, on_exceeded={self.on_exceeded!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Budget) and (self.limits, self.soft, self.on_exceeded) == (
            other.limits, other.soft, other.on_exceeded)

    def __hash__(self) -> int:
        return hash((tuple(self.limits.items()), self.soft, self.on_exceeded))


#: What one handler call of a step is expected to spend, per cost unit (``{"tokens":
#: 2000}``), or a function of the :class:`~printery.Message` returning that (None or
#: empty: nothing to reserve for this message).
Estimate = Mapping[str, float] | Callable[[Any], Mapping[str, float] | None]


def check_estimate(what: str, estimate: object, units: tuple[str, ...]) -> None:
    """Refuse, when the pipeline is defined, an estimate that is neither a mapping of
    declared cost units to amounts >= 0 nor a function (checked per message then)."""
    if estimate is None or callable(estimate):
        return
    if not isinstance(estimate, Mapping) or not estimate:
        raise PipelineError(f"{what}: estimate={estimate!r} is not what a call spends; write "
                            "e.g. estimate={'tokens': 2000}, or a function of the message")
    estimated_amounts(what, estimate, units)


def estimated_amounts(what: str, estimate: Mapping[Any, Any], units: tuple[str, ...]
                      ) -> dict[str, float]:
    """``estimate`` checked: declared units, finite amounts >= 0 (raises
    :class:`PipelineError` naming ``what``)."""
    found: dict[str, float] = {}
    for unit, amount in estimate.items():
        if unit not in units:
            raise PipelineError(f"{what}: estimate names {unit!r}, not a cost unit of the step "
                                f"({list(units)})")
        if (isinstance(amount, bool) or not isinstance(amount, int | float)
                or not math.isfinite(amount) or amount < 0):
            raise PipelineError(f"{what}: estimate {unit}={amount!r} is not an amount >= 0")
        found[unit] = float(amount)
    return found


def step_field(step: str, unit: str) -> str:
    """The hash field of a step's own share of ``unit``."""
    return f"step:{step}:{unit}"


@dataclass(frozen=True, slots=True)
class _Limit:
    field: str
    unit: str
    limit: float
    budget: Budget
    step: str  # "" for the run's budget


@dataclass(frozen=True, slots=True)
class Exceeded:
    """A hard limit a run is at or over, as found before a handler runs (``reserved``:
    what other entries of the run hold of it, when a reservation was refused)."""

    field: str
    unit: str
    limit: float
    spent: float
    on_exceeded: str
    step: str
    reserved: float = 0.0


def exceeded_data(unit: str, limit: float, spent: float) -> dict[str, Any]:
    """The ``data`` of ``budget:exceeded`` (reference: budgets)."""
    return {"status": "budget_exceeded", "unit": unit, "limit": limit, "spent": spent}


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    """What one step of a pipeline with budgets does about them: the limits it checks
    before its handler runs (the run's and its own), and the hash fields its commits
    charge (every unit it may report, to the run's total and, with a budget of its own,
    to its share)."""

    step: str
    units: tuple[str, ...]
    run: Budget | None = None
    own: Budget | None = None
    #: What one call reserves before it runs (None: nothing; see :data:`Estimate`).
    estimate: Estimate | None = None

    @property
    def limits(self) -> tuple[_Limit, ...]:
        found = []
        if self.run is not None:
            found += [_Limit(u, u, lim, self.run, "") for u, lim in self.run.limits.items()]
        if self.own is not None:
            found += [_Limit(step_field(self.step, u), u, lim, self.own, self.step)
                      for u, lim in self.own.limits.items()]
        return tuple(found)

    def charged(self) -> list[tuple[str, str, float | None, str]]:
        """Per charged field: its name, its unit, its soft threshold (None: no limit) and
        the start of its warning's data (the spent and ``}`` follow)."""
        found: list[tuple[str, str, float | None, str]] = []
        for budget, step in ((self.run, ""), (self.own, self.step)):
            if budget is None:
                continue
            for unit in self.units:
                name = step_field(step, unit) if step else unit
                limit = budget.limits.get(unit)
                if limit is None:
                    found.append((name, unit, None, ""))
                    continue
                note = {"status": "budget_warning", "unit": unit, "limit": limit,
                        "soft": budget.soft, **({"step": step} if step else {})}
                found.append((name, unit, limit * budget.soft,
                              _json.dumps(note)[:-1] + ', "spent": '))
        return found
