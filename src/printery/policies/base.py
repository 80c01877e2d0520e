"""The shape every policy of the entry pipeline has, and the batch its admit hooks decide.

A policy is a class with some of six hooks; the chain (:mod:`printery.policies.chain`)
is compiled once per step and calls a hook only of the policies that define it, so a
policy costs nothing in a phase it has no hook for. The hooks, in the order an entry
meets them (docs/engine.md, The chain of policies):

* ``reads(batch)``: read-only commands sent in the batch's one lookup round trip (with
  the idempotency records); their replies come back through :meth:`Batch.replies`;
* ``admit(batch)``: decide entries of the whole batch before any handler runs (ack,
  dead-letter, hold), or prepare what their calls need, in one round trip per policy
  at most;
* ``attempt(delivery, message)``: before each call takes its handler slot (a wait that
  must not hold one: a limit's);
* ``before_call(delivery, message)``: once the call holds its slot and place;
* ``wrap(call)``: around each call, compiled once into one callable;
* ``on_commit(message, commit, outcome)``: what the commit of an entry that writes
  outputs carries besides them (a budget's charge, the run index's mark); ``outcome``
  ``ok`` for a call's, else what wrote them (``budget_exceeded``);
* ``after_commit(decided, results)``: once a commit said what happened to its entries
  (one call per commit, with each entry's result);
* ``abandoned(delivery)``: a call was given up on at its timeout: what it held is given
  back.

A policy's state lives in the policy (per entry, keyed by its delivery), never on
:class:`~printery.runtime.consumer.Delivery` or :class:`~printery.runtime.handler.Message`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from printery.runtime.accounting import Decided
from printery.runtime.consumer import Delivery
from printery.runtime.handler import HandlerResult, Message, Output
from printery.transport.channel import Command
from printery.transport.commit import EntryCommit

__all__ = ["Batch", "Call", "Entry", "LookUp", "Policy", "Written", "acked"]

#: An entry being admitted: its delivery and its decoded message.
Entry = tuple[Delivery, Message]
#: One handler call of an entry, as the chain's ``wrap`` hooks see it.
Call = Callable[[Delivery, Message], Awaitable[HandlerResult]]
#: The one lookup round trip of a batch: whether each idempotency key has a record, and
#: the replies of the joined reads.
LookUp = Callable[[Sequence[str], Sequence[Command]], Awaitable[tuple[list[bool], list[Any]]]]
#: The decision of an entry that writes ``outputs`` without a call (``outcome``: what
#: it is accounted as): its commit with what the chain's ``on_commit`` hooks add.
Written = Callable[[Delivery, Message, Sequence[Output], str], Decided]


class Policy:
    """One policy of a step's entry pipeline. Subclasses define the hooks they need; the
    base's are never called (the chain leaves out a hook a subclass does not define)."""

    #: Its name in docs and logs.
    name = "policy"

    def reads(self, batch: Batch) -> Sequence[Command]:
        return ()

    async def admit(self, batch: Batch) -> None:
        return None

    async def attempt(self, delivery: Delivery, message: Message) -> None:
        return None

    async def before_call(self, delivery: Delivery, message: Message) -> None:
        return None

    def wrap(self, call: Call) -> Call:
        return call

    def on_commit(self, message: Message, commit: EntryCommit, outcome: str) -> EntryCommit:
        return commit

    async def after_commit(self, decided: Sequence[Decided], results: Sequence[object]) -> None:
        return None

    def abandoned(self, delivery: Delivery) -> None:
        return None


class Batch:
    """The entries of one read batch as the chain admits them: ``entries`` still to run
    (in read order) and ``decided`` (committed without a call). An admit hook takes the
    entries it decides out of ``entries`` and adds their decisions to ``decided``.
    ``none_over``: no run was at a hard limit of its budget as the batch was read."""

    __slots__ = ("_look_up", "_readers", "_replies", "decided", "entries", "none_over", "written")

    def __init__(
        self, entries: list[Entry], decided: list[Decided], *, look_up: LookUp,
        written: Written, readers: Sequence[Policy] = (), none_over: bool = False,
    ) -> None:
        self.entries = entries
        self.decided = decided
        self.none_over = none_over
        #: Builds the decision of an entry that writes outputs without a call.
        self.written = written
        self._look_up = look_up
        self._readers = readers
        #: Each reader's replies and the entries they were read for, once read.
        self._replies: dict[Policy, tuple[list[Any], list[Entry]]] | None = None

    def decide(self, decided: Decided) -> None:
        self.decided.append(decided)

    def keep(self, kept: list[Entry]) -> None:
        """The entries left to run, once a hook decided the others."""
        self.entries = kept

    async def look_up(self, keys: Sequence[str]) -> list[bool]:
        """Whether each idempotency key has a record, in the batch's one round trip: the
        readers' reads go with it (made of the entries left now)."""
        found, _ = await self._send(keys)
        return found

    async def replies(self, policy: Policy) -> tuple[list[Any], list[Entry]]:
        """The replies of ``policy``'s reads, and the entries they were read for: from
        the lookup round trip, or (no lookup was made) in a round trip of their own."""
        if self._replies is None:
            await self._send(())
        assert self._replies is not None
        return self._replies.get(policy, ([], []))

    async def _send(self, keys: Sequence[str]) -> tuple[list[bool], list[Any]]:
        sent: list[tuple[Policy, int, list[Entry]]] = []
        reads: list[Command] = []
        if self._replies is None:
            for reader in self._readers:
                commands = reader.reads(self)
                sent.append((reader, len(commands), list(self.entries)))
                reads.extend(commands)
        found, replies = await self._look_up(keys, reads)
        if self._replies is None:
            self._replies = {}
            at = 0
            for reader, count, entries in sent:
                self._replies[reader] = (replies[at:at + count], entries)
                at += count
        return found, replies


def acked(delivery: Delivery, record: str = "") -> EntryCommit:
    """The commit of an entry acked without a call (``record``: its idempotency key)."""
    return EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id, record, ())
