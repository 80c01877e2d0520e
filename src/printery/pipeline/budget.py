"""Budgets (CONTRACT §13): how much one run may spend, per cost unit, for the whole
pipeline and for a step's own share.

What a run has spent lives in one Redis hash per run (``StreamKeys.budget``), updated by
the commit of each entry that spent it (``commit.lua``), so it is exact across processes
and crashes. Its fields: ``<unit>`` (the run's total), ``step:<step>:<unit>`` (a step's
share, kept for steps with a budget of their own), ``raise:<field>`` (what approved
reviews added to that field's limit), each in whole billionths of the unit
(:data:`~printery.transport.commit.SPENT_SCALE`: integer adds, exact sums), and
``warned:<field>`` (the soft warning was written). This module is the pure part: the
limits, what a step reads and charges, and what a decision on a ``budget_exceeded``
review does.

One decision per breach (reference: failures): every entry a run over a ``review`` limit holds
is kept in the run's held stream (:func:`held_type`, in the run's partition), written by
the commit that acknowledges it, with the fields it goes back to its step with and the
stream it came from. The first hold of a run and limit field also writes the review; the
others find its ``once`` guard (:func:`review_guard`) taken. An approval raises the
limit once and, in the decision's transaction, puts every held entry back on its source
stream (:data:`RELEASE_LUA`), typed as it was (a loop's attempt goes back to
``<loop>:loop`` as ``<loop>:attempt``), for its step alone; it frees the guard, so a
later breach of the raised limit asks again. A rejection writes ``budget:exceeded`` and
keeps the guard taken while the run's budget lives: the entries held after it wait for
nothing, as they would with ``stop``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from printery import _json
from printery.errors import PipelineError, ReviewActionFailed
from printery.fields import REPLAY_FOR, SOURCE_STREAM, STEP
from printery.pipeline.review_kinds import (
    REJECTED_BY_REVIEWER,
    ReviewCase,
    ReviewKind,
    ReviewOutcome,
)
from printery.runtime.handler import Output
from printery.transport.commit import encode_amount

__all__ = [
    "BUDGET_EXCEEDED",
    "BUDGET_REVIEW_KIND",
    "BUDGET_WARNING",
    "Budget",
    "BudgetPlan",
    "Exceeded",
    "budget_review_kind",
    "exceeded_data",
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
#: Milliseconds a rejected run's held entries and review guard are kept when its budget
#: hash has no expiry to go by (the default idempotency record ttl).
REJECTED_KEEP_MS = 7 * 86400 * 1000

#: An approval's release (KEYS[1]: the run's held stream; ARGV[1]: :data:`HELD_FROM`):
#: every held entry is added back to the stream it came from, without that field, and the
#: held stream is deleted; the number released. In the decision's MULTI: atomic with the
#: raise and with every commit that holds an entry.
RELEASE_LUA = """
local n = 0
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local f, to, out = entry[2], nil, {}
  for i = 1, #f, 2 do
    if f[i] == ARGV[1] then to = f[i + 1] else out[#out + 1] = f[i]; out[#out + 1] = f[i + 1] end
  end
  if to then
    redis.call('XADD', to, '*', unpack(out))
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
"""

#: A rejection (KEYS: the held stream, the review guard, the run's budget hash; ARGV[1]:
#: :data:`REJECTED_KEEP_MS`): the guard stays taken, and the held entries are kept, as
#: long as the run's budget hash lives (else ARGV[1] ms); no later hold asks again.
REJECT_LUA = """
local ttl = redis.call('PTTL', KEYS[3])
if ttl <= 0 then ttl = tonumber(ARGV[1]) end
redis.call('SET', KEYS[2], 'rejected', 'PX', ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ttl) end
return ttl
"""


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
    """A hard limit a run is at or over, as found before a handler runs."""

    field: str
    unit: str
    limit: float
    spent: float
    on_exceeded: str
    step: str


def exceeded_data(unit: str, limit: float, spent: float) -> dict[str, Any]:
    """The ``data`` of ``budget:exceeded`` (CONTRACT §13)."""
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


# -- the review kind --------------------------------------------------------------------------


def budget_review_kind() -> ReviewKind:
    """The ``budget_exceeded`` kind: an approval raises the run's limit by its original
    amount and puts every entry the run's breach held back on its source stream, for its
    step alone, both in the decision's transaction; a rejection writes
    ``budget:exceeded``. Approvals take no edited data."""

    async def approve(case: ReviewCase) -> ReviewOutcome:
        fields = case.fields
        raise_by = float(fields.get(BUDGET_RAISE, "0") or 0)
        if case.keys is None:
            raise ReviewActionFailed("a budget review is decided with the stream keys")
        keys, run, field = case.keys, case.correlation_id, fields.get(BUDGET_FIELD, "")
        commands: list[tuple[Any, ...]] = [
            ("HINCRBY", keys.budget(run), f"raise:{field}", encode_amount(raise_by))]
        held_in = fields.get(HELD_IN)
        if held_in is None:  # a review of an earlier version: it held the entry it shows
            return ReviewOutcome([_held_copy(case)], detail=f"limit raised by {raise_by:g}",
                                 commands=commands)
        commands += [("EVAL", RELEASE_LUA, 1, held_in, HELD_FROM),
                     ("DEL", keys.once(review_guard(run, field)))]
        return ReviewOutcome(
            detail=f"limit raised by {raise_by:g}; the entries the run held run again",
            commands=commands)

    async def reject(case: ReviewCase) -> ReviewOutcome:
        fields = case.fields
        data = {**exceeded_data(fields.get(BUDGET_UNIT, ""),
                                float(fields.get(BUDGET_LIMIT, "0") or 0),
                                float(fields.get(BUDGET_SPENT, "0") or 0)),
                case.correlation_field: case.correlation_id,
                "reasons": [{"code": REJECTED_BY_REVIEWER, "field": "", "message": case.note}]}
        commands: list[tuple[Any, ...]] = []
        if case.keys is not None:
            keys, run = case.keys, case.correlation_id
            commands.append((
                "EVAL", REJECT_LUA, 3, keys.stream(held_type(run)),
                keys.once(review_guard(run, fields.get(BUDGET_FIELD, ""))), keys.budget(run),
                REJECTED_KEEP_MS))
        return ReviewOutcome([Output(
            BUDGET_EXCEEDED, data, correlation_id=case.correlation_id,
            idempotency_key=f"{BUDGET_EXCEEDED}:{case.correlation_id}",
        )], commands=commands)

    return ReviewKind(BUDGET_REVIEW_KIND, approve, reject, accepts_data=False)


def _held_copy(case: ReviewCase) -> Output:
    """The entry a review written before held streams shows, back on its source stream
    with its own type (a loop's attempt is an entry of ``<loop>:loop``), for its step."""
    assert case.keys is not None
    fields = case.fields
    source = case.keys.event_type(fields.get(SOURCE_STREAM, "")) or case.resume_type
    return Output(
        source, case.data, correlation_id=case.correlation_id,
        idempotency_key=f"{fields.get(HELD_KEY, case.resume_type)}:budget:{case.review_id}",
        extra={"type": case.resume_type, REPLAY_FOR: fields.get(STEP, "")},
    )
