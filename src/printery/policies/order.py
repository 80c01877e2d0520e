"""The chain of one step, in its one order (docs/engine.md, The chain of policies).

Admit hooks run in this order, each on the entries the ones before it left:

1. **placement** (several partitions): an entry elsewhere than its run's partition goes
   there first, before anything of this partition is asked of it;
2. **stops**: an entry of a stopped run (cancelled, or failed and stopped) is settled
   before it costs anything; its ``wrap`` (outermost) cancels a call whose run stops,
   its ``on_commit`` has the commit check the run;
3. **replay skip**: a replay's copy for other steps costs nothing more;
4. **max deliveries**: an entry past its deliveries is dead-lettered before it costs a
   lookup;
5. **dedupe**: the one lookup round trip (the budgets' reads join it); a duplicate is
   acked whatever its run's budget says, since it commits nothing;
6. **budget**: a run at a hard limit holds its entries before they reserve or wait;
7. **reservations**: an entry reserves its estimate only once it will run;
8. **limits**: the last admit hook, as its claims hold slots: an entry decided by any
   hook before never claims one. Its ``attempt`` waits before the call takes a handler
   slot, its ``wrap`` (outermost) gives the claim back whatever the call inside did;
9. **trial**: once the call holds its slot and place (a suspect then runs alone);
10. **middleware** (the user's, the pipeline's then the step's): around the handler,
   inside the limits' claim, and inside the step's timeout;
11. **budget** ``on_commit`` (its charge) and **run index** ``on_commit`` (its mark);
12. **drafts** ``after_commit``: once a commit says an entry was lost.

Decode comes before the chain, the call's failure model
(:mod:`printery.runtime.failures`), the commit and accounting after it: every entry has
those."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from printery.policies.base import Policy
from printery.policies.budget import Budget
from printery.policies.chain import Chain
from printery.policies.dedupe import Dedupe
from printery.policies.drafts import Drafts
from printery.policies.limits import Limits
from printery.policies.max_deliveries import MaxDeliveries
from printery.policies.middleware import Middleware, UserMiddleware
from printery.policies.placement import Placement
from printery.policies.replay_skip import ReplaySkip
from printery.policies.reservations import Reserve
from printery.policies.run_index import IndexRuns
from printery.policies.stops import Stops
from printery.policies.trial import Trials
from printery.rules.limits import fallback_of
from printery.runtime.budget_guard import BudgetGuard
from printery.runtime.failures import Failures
from printery.runtime.handler import Handler
from printery.runtime.limit_gate import LimitGate
from printery.runtime.run_index import RunIndex
from printery.runtime.suspects import Suspects
from printery.store.outage import Outage

__all__ = ["step_chain"]


def step_chain(
    worker: str, handler: Handler, *, failures: Failures, connectivity: Outage,
    max_deliveries: int, suspects: Suspects, written_by: Collection[str] = (),
    placement: Placement | None = None, budget: BudgetGuard | None = None,
    gate: LimitGate | None = None, index: RunIndex | None = None,
    middleware: Sequence[Middleware] = (), stops: Stops | None = None,
) -> Chain:
    """The chain of the step ``worker`` from what it declares, in the chain's order."""
    policies: list[Policy] = [] if placement is None else [placement]
    if stops is not None:
        policies.append(stops)
    policies += [ReplaySkip(worker), MaxDeliveries(failures, max_deliveries), Dedupe(written_by)]
    if budget is not None:
        policies.append(Budget(budget, connectivity))
        if budget.reservations is not None:
            policies.append(Reserve(budget, budget.reservations, failures, connectivity))
    if gate is not None:
        policies.append(Limits(gate, failures, connectivity, fallback_of(handler)))
    policies.append(Trials(suspects))
    policies += [UserMiddleware(each) for each in middleware]
    if index is not None:
        policies.append(IndexRuns(index))
    policies.append(Drafts())
    return Chain(policies, handler)
