"""Flow-control limits (docs/reference.md, Flow control): the batch asks the step's
limits for all its entries in one request (``admit``); an entry not admitted then waits
before its call takes a handler slot (``attempt``: a waiting entry has not started, so a
drain hands it back at once), and gives its claim back as its call ends (``wrap``; not a
call given up on at its timeout, whose claim went back then: ``abandoned``). A limit key
function that fails dead-letters its entry (``invalid_limit_key``): it would fail again
on every delivery. The gate itself (counts, requests, waits) is
:class:`~printery.runtime.limit_gate.LimitGate`'s."""

from __future__ import annotations

import functools
from weakref import WeakKeyDictionary

from printery.policies.base import Batch, Call, Policy
from printery.runtime.consumer import Delivery
from printery.runtime.failures import Failures
from printery.runtime.handler import HandlerResult, Message
from printery.runtime.limit_gate import LimitGate, Ticket
from printery.store.outage import Outage

__all__ = ["Limits"]

#: The reason code of an entry whose limit key function failed.
INVALID_LIMIT_KEY = "invalid_limit_key"


class Limits(Policy):
    name = "limits"

    def __init__(self, gate: LimitGate, failures: Failures, connectivity: Outage) -> None:
        self.gate = gate
        self.failures = failures
        self.connectivity = connectivity
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
            await self.connectivity.retrying(functools.partial(self.gate.admit, ticket, message))

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
