"""Where an entry of a limited step waits for its limits (docs/reference.md, Flow control)
before its handler runs, and gives back what it held after.

The decision is the server's (``limit.lua``, atomic, on its own clock), so limits hold
across every process. Round trips are shared: the admissions, releases and lease
renewals asked for while one is on the wire go together in the next (the way the
committer groups commits), and a read batch is admitted in one request before its
handlers start. An entry that waits keeps its lease (its consumer still holds it, so
the lease loop renews it) and counts no delivery: nothing is read or claimed again.

A concurrency slot is the holder's until released, or until its lease lapses: slots are
renewed with the entries' leases, so a process that dies holding one gives it back
within the visibility timeout, and at once when a gate waiting for it sees its holder
died on this host (:mod:`printery.runtime.limit_departed`). A release waits up to
:data:`RELEASE_REPORT_SECONDS` for a request to ride with (a busy step's next batch asks
sooner), so a gate sends one request per batch, not two; when no limit key is a function,
every call holds the same slots, and releases are counted and given back in one go as
that request is made.
An entry may give up waiting once a limit's ``max_wait`` runs out
(:mod:`printery.policies.limits` says when).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import structlog

from printery.base._util import stop_tasks, wait_event, where
from printery.rules.limits import Limit
from printery.runtime.handler import Message
from printery.runtime.limit_departed import DepartedSlots, gate_name
from printery.runtime.limit_tickets import Claims, Ticket, slot_bases
from printery.runtime.limit_waits import HELD_BY_SLOT, HELD_BY_WINDOW, LimitWaits
from printery.runtime.observe import Observer
from printery.transport.limit_store import WAIT_FOR_SLOT, Ask, LimitStore, Report
from printery.transport.streams import CONNECTION_ERRORS
from printery.wire.keys import StreamKeys

log = structlog.get_logger("printery.worker")

#: How often an entry waiting for a concurrency slot asks again (plus up to as much
#: again at random, so processes do not ask in step); a slot given back in this process
#: wakes its waiters at once.
SLOT_POLL_SECONDS = 0.1

#: The longest a release (and the tokens it reports) waits for the gate's next request
#: before it is sent on its own: what another process waiting for the slot sees at most
#: this late, a fifth of its polling interval; a waiter in this process is woken at once.
RELEASE_REPORT_SECONDS = 0.02

class LimitGate:
    """The limits of one step's worker: what it holds is counted here, per limit key, and
    reported with every request (the server keeps one count per gate, not a member per
    handler call)."""

    def __init__(
        self, store: LimitStore, keys: StreamKeys, limits: Sequence[Limit], *, worker: str,
        observer: Observer,
    ) -> None:
        self.store = store
        self.keys = keys
        self.limits = tuple(limits)
        self.worker = worker
        self.observer = observer
        self._gate = gate_name()
        #: The slots of dead processes that its entries wait for, given back at once.
        self._departed = DepartedSlots(store, self._gate, worker, self._found_departed)
        self._asks: list[tuple[list[Ticket], asyncio.Future[None]]] = []
        #: Per limit key: concurrency slots held now, and tokens not yet charged.
        self._held: dict[str, int] = {}
        #: Calls released since the last report whose slots are the static ones.
        self._released = 0
        self._tokens: dict[str, float] = {}
        self._dirty = False
        self._flusher: asyncio.Task[None] | None = None
        self._report_later: asyncio.TimerHandle | None = None
        self._freed = asyncio.Event()
        claims = self._claims = Claims(keys, self.limits)
        #: A claim for each call of a batch (:meth:`Claims.tickets`).
        self.tickets = claims.tickets
        self._static = claims.static
        #: The limit keys whose concurrency every call holds, when no key is a function.
        self._static_slots = None if self._static is None else slot_bases(self._static)
        #: Whether any call was ever abandoned (then admissions look for such tickets).
        self._abandons = False
        self._slot_waiters = 0
        #: Whether a handler's reported tokens are counted (some limit has a token rate).
        self._counts_tokens = any(limit.tokens_per_minute for limit in self.limits)
        #: Which limit holds an entry, and how long entries waited for each.
        self.waits = LimitWaits(self.limits, worker, observer)
        #: Whether an entry may give up waiting at all (a limit has ``max_wait``).
        self.gives_up = bool(self.waits.max_wait)

    async def try_admit(self, tickets: Sequence[Ticket]) -> None:
        """Ask once for all ``tickets`` (a read batch): those the limits let through now
        are admitted, the others wait in :meth:`admit`. Connection errors are raised
        (the caller asks again with the same tickets); cancelled or failing, the tickets
        are abandoned: what the reply admits after all is given back at once."""
        if not tickets:
            return
        try:
            await self._ask(list(tickets))
        except CONNECTION_ERRORS:
            raise
        except BaseException:  # the batch is gone: nobody will release what it holds
            for ticket in tickets:
                self._abandon(ticket)
            raise

    async def admit(self, ticket: Ticket, message: Message | None = None) -> None:
        """Wait until ``ticket`` is admitted, or, given the ``message`` of a step with a
        fallback for it (the caller asked its ``falls_back``), until a limit's
        ``max_wait`` runs out: then the ticket has ``gave_up`` and ``message.over_limit``
        names the limit. Connection errors are raised (the caller retries with the same
        ticket: what a lost reply admitted, the next report gives back)."""
        may_give_up = message is not None and self.gives_up
        self._slot_waiters += 1  # a release wakes it (cheaper than an event per release)
        if not ticket.since:
            ticket.since = time.perf_counter()  # a retry's claim: its wait starts now
        waiting = 0  # what holds it, as counted in `waiting`
        try:
            while not ticket.admitted:
                freed = self._freed
                await self._ask([ticket])
                if ticket.admitted:
                    break
                held = HELD_BY_SLOT if ticket.wait == WAIT_FOR_SLOT else HELD_BY_WINDOW
                if may_give_up:
                    assert message is not None
                    over = self.waits.gives_up(held, time.perf_counter() - ticket.since,
                                               max(ticket.wait, 0) / 1000)
                    if over:
                        ticket.gave_up = True
                        message.over_limit = over
                        break
                if held != waiting:
                    if waiting:
                        self.waits.count_waiting(waiting, -1)
                    waiting = held
                    self.waits.count_waiting(held, 1)
                if ticket.wait == WAIT_FOR_SLOT:
                    await wait_event(freed, SLOT_POLL_SECONDS * (1 + random.random()))
                else:
                    await asyncio.sleep(max(ticket.wait, 1) / 1000)
        except CONNECTION_ERRORS:
            raise
        except BaseException:  # cancelled (the drain) or failing: nobody will release it
            self._abandon(ticket)
            raise
        finally:
            self._slot_waiters -= 1
            if waiting:
                self.waits.count_waiting(waiting, -1)

    def release(self, ticket: Ticket, costs: dict[str, float]) -> None:
        """The handler call is over: give back its slots and charge the tokens it
        reported (sent with the next round trip, which starts now if none is on the wire).
        The ticket is then the claim of a next call (a retry) under the same keys."""
        if ticket.gave_up:  # the fallback ran: it held nothing here, and its tokens are
            ticket.gave_up = False  # another provider's
            ticket.since = 0.0
            ticket.held = 0
            return
        if ticket.admitted:
            ticket.admitted = False
            if self._static_slots is None:
                for base in slot_bases(ticket.bounds):
                    self._held[base] -= 1
                    self._dirty = True
            else:  # every call holds the same slots: counted, and given back in one go
                self._released += 1
        if self._counts_tokens and (tokens := costs.get("tokens", 0)):
            for bound in ticket.bounds:
                if bound.tokens_per_minute > 0:
                    self._tokens[bound.base] = self._tokens.get(bound.base, 0.0) + tokens
                    self._dirty = True
        ticket.since = 0.0  # until its next call asks
        ticket.held = 0
        if self._released or self._dirty:
            self._wake()
            if self._flusher is None and self._report_later is None:
                self._report_later = asyncio.get_running_loop().call_later(
                    RELEASE_REPORT_SECONDS, self._report)

    def renew(self) -> None:
        """Renew every held slot (with the entries' leases)."""
        self._settle()
        if any(self._held.values()):
            self._dirty = True
            self._kick()

    async def close(self) -> None:
        """Give back what is still held as the worker stops (best effort: what cannot
        be given back lapses with its lease)."""
        if self._report_later is not None:
            self._report_later.cancel()
            self._report_later = None
            self._kick()  # the releases it was waiting to report
        self._settle()
        if any(self._held.values()):
            self._held = dict.fromkeys(self._held, 0)
            self._dirty = True
            self._kick()
        await self._departed.close()
        flusher = self._flusher
        if flusher is not None:
            _, late = await asyncio.wait([flusher], timeout=2.0)
            if late:  # the server is not answering: what it holds lapses with its lease
                for task in await stop_tasks(late, timeout=2.0):
                    log.error("limit flusher did not stop: left behind", at=where(task))
        await self.store.close()

    # -- internals -----------------------------------------------------------------------

    def _admitted(self, group: list[Ticket], admitted: int) -> None:
        """The first ``admitted`` of ``group`` (tickets of one bounds) were admitted by
        one reply. Marked here, not by the askers: a caller gone meanwhile loses nothing."""
        now = time.perf_counter()
        waits = []
        held = []
        for ticket in group[:admitted]:
            if not ticket.admitted:  # (never asked for twice; were it, held once)
                ticket.admitted = True
                waits.append(now - ticket.since)
                held.append(ticket.held)
        if not waits:
            return
        slots = self._static_slots
        for base in slot_bases(group[0].bounds) if slots is None else slots:
            self._held[base] = self._held.get(base, 0) + len(waits)
        self.waits.admitted(waits, held)
        if self._abandons:
            for ticket in group[:admitted]:
                if ticket.abandoned:  # its caller is gone: give it back
                    self.release(ticket, {})

    def _wake(self) -> None:
        """Wake the entries waiting for a slot: one may be free now."""
        if self._slot_waiters:
            fresh, self._freed = self._freed, asyncio.Event()
            fresh.set()

    def _found_departed(self) -> None:
        """Slots of dead processes were found: the next request gives them back."""
        self._dirty = True
        self._kick()

    def _abandon(self, ticket: Ticket) -> None:
        ticket.abandoned = True
        self._abandons = True
        if ticket.admitted:
            self.release(ticket, {})

    async def _ask(self, tickets: list[Ticket]) -> None:
        """Ask for ``tickets``; each one's reply is then its ``wait`` (and ``admitted``)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asks.append((tickets, future))
        self._kick()
        return await asyncio.shield(future)

    def _report(self) -> None:
        """Send what releases left to report, unless a request carried it meanwhile."""
        self._report_later = None
        self._settle()
        if self._dirty:
            self._kick()

    def _settle(self) -> None:
        """Count the slots of the calls released since as given back (see
        :meth:`release`): then there is something to report."""
        released, self._released = self._released, 0
        if released and self._static_slots:
            for base in self._static_slots:
                self._held[base] -= released
            self._dirty = True

    def _kick(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name=f"{self.worker}:limits")

    async def _flush(self) -> None:
        """Send what is queued until nothing is; a failed round trip fails the
        admissions in it and keeps the tokens for the next (what it may have admitted,
        the next report gives back)."""
        try:
            while True:
                self._settle()
                if not (self._asks or self._dirty):
                    break
                asks, self._asks = self._asks, []
                tokens, self._tokens = self._tokens, {}
                departed = self._departed.take()
                self._dirty = False
                reports = [Report(base, held, tokens.get(base, 0.0))
                           for base, held in self._held.items()]
                reports += [Report(base, 0, amount) for base, amount in tokens.items()
                            if base not in self._held]
                groups = [group for tickets, _ in asks for group in self._claims.groups(tickets)]
                try:
                    results = await self.store.apply(
                        self._gate, reports, [Ask(len(group), group[0].bounds) for group in groups],
                        [(base, gate) for base, gates in departed.items() for gate in gates])
                except Exception as exc:
                    self._failed(asks, tokens, exc, departed)
                    if not self._asks:
                        return
                    continue
                except BaseException:
                    self._failed(asks, tokens, ConnectionError("limit request interrupted"),
                                 departed)
                    raise
                short: set[str] = set()  # limit keys an entry waits for a slot of
                for group, (admitted, wait) in zip(groups, results, strict=True):
                    for ticket in group[admitted:]:
                        ticket.wait = wait or WAIT_FOR_SLOT
                        ticket.held |= HELD_BY_WINDOW if wait > 0 else HELD_BY_SLOT
                    if admitted:
                        self._admitted(group, admitted)
                    if admitted < len(group) and wait == WAIT_FOR_SLOT:
                        short.update(slot_bases(group[0].bounds))
                for _, future in asks:
                    if not future.done():
                        future.set_result(None)
                if departed:  # slots given back: the waiters ask again now
                    self._wake()
                if short:
                    self._departed.look(short)
        finally:
            self._flusher = None

    def _failed(self, asks: list[Any], tokens: dict[str, float], exc: Exception,
                departed: dict[str, set[str]]) -> None:
        for _, future in asks:
            if not future.done():
                future.set_exception(exc)
        for base, amount in tokens.items():
            self._tokens[base] = self._tokens.get(base, 0.0) + amount
        self._departed.keep(departed)  # given back by the next request
        self._dirty = True
        if not isinstance(exc, CONNECTION_ERRORS):
            log.error("limit request failed", worker=self.worker, error=str(exc))
