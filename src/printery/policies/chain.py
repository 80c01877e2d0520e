"""A step's policies compiled once into the chain its entries go through.

Starlette builds its middleware stack once; so does a step: :class:`Chain` keeps, for
each hook, only the policies that define it, in the chain's order, and wraps the handler
once. A phase no policy has a hook for costs an entry nothing (``wrapped`` is then None
and the handler is called as it is).
"""

from __future__ import annotations

from collections.abc import Sequence

from printery.policies.base import Batch, Call, Entry, LookUp, Policy, Written
from printery.runtime.accounting import Decided
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Handler, HandlerResult, Message
from printery.transport.commit import EntryCommit

__all__ = ["Chain"]


def _defining(policies: Sequence[Policy], hook: str) -> tuple[Policy, ...]:
    """The policies whose class defines ``hook`` (the base's does nothing)."""
    base = getattr(Policy, hook)
    return tuple(p for p in policies if getattr(type(p), hook) is not base)


class Chain:
    """The policies of one step, in order, each hook compiled to the policies that
    define it."""

    def __init__(self, policies: Sequence[Policy], handler: Handler) -> None:
        self.policies = tuple(policies)
        self.readers = _defining(self.policies, "reads")
        self.admitting = _defining(self.policies, "admit")
        self.attempting = _defining(self.policies, "attempt")
        self.before = _defining(self.policies, "before_call")
        self.committing = _defining(self.policies, "on_commit")
        self.after = _defining(self.policies, "after_commit")
        self.abandoning = _defining(self.policies, "abandoned")
        #: The handler wrapped by every ``wrap`` hook (the first policy outermost);
        #: None: no policy wraps it.
        self.wrapped: Call | None = None
        wrapping = _defining(self.policies, "wrap")
        if wrapping:
            async def call(delivery: Delivery, message: Message) -> HandlerResult:
                return await handler(message)
            wrapped: Call = call
            for policy in reversed(wrapping):
                wrapped = policy.wrap(wrapped)
            self.wrapped = wrapped

    def __repr__(self) -> str:
        return f"Chain({', '.join(p.name for p in self.policies)})"

    async def admit(
        self, entries: list[Entry], decided: list[Decided], *, look_up: LookUp,
        written: Written, none_over: bool,
    ) -> list[Entry]:
        """The entries of a batch left to run once every ``admit`` hook decided its
        own (their decisions added to ``decided``)."""
        batch = Batch(entries, decided, look_up=look_up, written=written,
                      readers=self.readers, none_over=none_over)
        for policy in self.admitting:
            if not batch.entries:
                break
            await policy.admit(batch)
        return batch.entries

    async def attempt(self, delivery: Delivery, message: Message) -> None:
        for policy in self.attempting:
            await policy.attempt(delivery, message)

    async def before_call(self, delivery: Delivery, message: Message) -> None:
        for policy in self.before:
            await policy.before_call(delivery, message)

    def on_commit(self, message: Message, commit: EntryCommit, outcome: str) -> EntryCommit:
        for policy in self.committing:
            commit = policy.on_commit(message, commit, outcome)
        return commit

    async def after_commit(self, decided: Sequence[Decided], results: Sequence[object]) -> None:
        for policy in self.after:
            await policy.after_commit(decided, results)

    def abandoned(self, delivery: Delivery) -> None:
        for policy in self.abandoning:
            policy.abandoned(delivery)
