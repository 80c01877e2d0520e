"""Flow-control limits (docs/reference.md, Flow control): the batch asks the step's
limits for all its entries in one request (``admit``); an entry not admitted then waits
before its call takes a handler slot (``attempt``: a waiting entry has not started, so a
drain hands it back at once), and gives its claim back as its call ends (``wrap``; not a
call given up on at its timeout, whose claim went back then: ``abandoned``). A limit key
function that fails dead-letters its entry (``invalid_limit_key``): it would fail again
on every delivery. The gate itself (counts, requests, waits) is
:class:`~printery.runtime.limit_gate.LimitGate`'s.

A limit with ``max_wait`` lets an entry give up waiting for it: when the step has a
fallback for that entry (its ``falls_back`` says so, asked here), the wait ends once it
passes ``max_wait`` (or at once when the window's reply says it would), and the call runs
the fallback instead, without the slot or the window: it is another provider's call.

Its namesake in other layers (the same job there): :mod:`printery.rules.limits`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from weakref import WeakKeyDictionary

from printery.base.errors import WorkerCrashed, describe
from printery.policies.base import Batch, Call, Policy
from printery.runtime.consumer import Delivery
from printery.runtime.failures import CallFailed, Failures
from printery.runtime.handler import HandlerResult, Message
from printery.runtime.limit_gate import LimitGate
from printery.runtime.limit_tickets import Ticket
from printery.store.outage import Outage

__all__ = ["FallsBackFailed", "Limits"]

#: The reason code of an entry whose limit key function failed.
INVALID_LIMIT_KEY = "invalid_limit_key"


class FallsBackFailed(CallFailed):
    """The step's ``falls_back`` raised for an entry (the ``__cause__``): that entry's
    call fails as if its handler had raised, and holds nothing of the limits."""


class Limits(Policy):
    """``falls_back``: whether the step has a fallback for a message, to run instead of
    its handler once a limit's ``max_wait`` runs out (None: none; asked only when a limit
    has a ``max_wait``)."""

    name = "limits"

    def __init__(self, gate: LimitGate, failures: Failures, connectivity: Outage,
                 falls_back: Callable[[Message], bool] | None = None) -> None:
        self.gate = gate
        self.failures = failures
        self.connectivity = connectivity
        self.falls_back = falls_back if gate.gives_up else None
        #: Each held entry's claim (the same claim again for its retries).
        self.tickets: WeakKeyDictionary[Delivery, Ticket] = WeakKeyDictionary()

    async def admit(self, batch: Batch) -> None:
        if self.connectivity.stopped():
            return  # nothing starts: the batch's entries are handed back unclaimed
        gate = self.gate
        entries = batch.entries
        tickets, failed = gate.tickets(len(entries), (message for _, message in entries))
        if failed:
            for n, exc in failed.items():
                delivery, message = entries[n]
                batch.decide(self.failures.dead_letter(delivery, message.fields,
                                                       INVALID_LIMIT_KEY, str(exc)))
            entries = [entry for n, entry in enumerate(entries) if n not in failed]
            batch.keep(entries)
        for (delivery, _), ticket in zip(entries, tickets, strict=True):
            self.tickets[delivery] = ticket
        await self.connectivity.retrying(lambda: gate.try_admit(tickets))

    async def attempt(self, delivery: Delivery, message: Message) -> None:
        ticket = self.tickets.get(delivery)
        if ticket is not None and not ticket.admitted:
            may_give_up = self._may_give_up(message)  # before anything is held or counted
            await self.connectivity.retrying(functools.partial(
                self.gate.admit, ticket, message if may_give_up else None))

    def _may_give_up(self, message: Message) -> bool:
        """Whether ``message``'s wait may end in the step's fallback (its ``falls_back``
        says so). What that user function raises is :class:`FallsBackFailed`: the entry's
        call fails as its handler's would (retried, then dead-lettered), never the batch."""
        falls_back = self.falls_back
        if falls_back is None:
            return False
        try:
            return bool(falls_back(message))
        except WorkerCrashed:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise FallsBackFailed(
                f"{self.gate.worker}: its falls_back raised {describe(exc)}") from exc

    def wrap(self, call: Call) -> Call:
        gate, tickets = self.gate, self.tickets

        async def limited(delivery: Delivery, message: Message) -> HandlerResult:
            try:
                return await call(delivery, message)
            finally:
                if not delivery.abandoned and (ticket := tickets.get(delivery)) is not None:
                    gate.release(ticket, message.costs)  # then a retry's claim

        return limited

    def abandoned(self, delivery: Delivery) -> None:
        ticket = self.tickets.get(delivery)
        if ticket is not None:
            self.gate.release(ticket, {})
