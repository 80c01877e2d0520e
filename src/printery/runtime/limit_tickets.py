"""One handler call's claim on its step's limits (:mod:`printery.runtime.limit_gate`)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from printery.base.errors import PipelineError
from printery.rules.limits import Limit
from printery.runtime.handler import Message
from printery.transport.limit_store import Bound
from printery.wire.keys import StreamKeys

__all__ = ["Claims", "Ticket", "slot_bases"]


class Ticket:
    """One handler call's claim on the step's limits (the same ticket again for a retry:
    :meth:`LimitGate.release` makes it a new claim). ``wait``: the last request's reply
    for it (0 admitted, else the ms until the window can admit it, or
    :data:`WAIT_FOR_SLOT`); ``held``: what held it back since it asked; ``abandoned``:
    its caller is gone, so an admission that comes now is given back at once; ``gave_up``:
    its call runs the step's fallback instead (a ``max_wait`` ran out), holding nothing."""

    __slots__ = ("abandoned", "admitted", "bounds", "gave_up", "held", "since", "wait")

    def __init__(self, bounds: tuple[Bound, ...], since: float) -> None:
        self.bounds = bounds
        self.since = since
        self.admitted = False
        self.abandoned = False
        self.gave_up = False
        self.wait = 0
        #: What held it back since it asked (:data:`HELD_BY_SLOT`, :data:`HELD_BY_WINDOW`).
        self.held = 0


def slot_bases(bounds: Sequence[Bound]) -> tuple[str, ...]:
    """The limit keys of ``bounds`` whose concurrency a call holds."""
    return tuple(bound.base for bound in bounds if bound.concurrency > 0)


class Claims:
    """The claims of one step's calls on its ``limits``: each call's bounds, from its
    limits' keys (computed once when no key is a function: ``static``)."""

    def __init__(self, keys: StreamKeys, limits: Sequence[Limit]) -> None:
        self.keys = keys
        self.limits = tuple(limits)
        #: The bounds of every call when no key is a function (None: some key is).
        self.static = None if any(callable(limit.key) for limit in self.limits) else tuple(
            self._bound(limit, limit.key) for limit in self.limits if isinstance(limit.key, str))

    def tickets(
        self, count: int, messages: Iterable[Message]
    ) -> tuple[list[Ticket], dict[int, PipelineError]]:
        """A claim for one handler call of each of ``messages`` (the ``count`` entries of
        a read batch, read only when a limit's key is a function of them), but for those
        whose key function failed: their errors, by position."""
        now = time.perf_counter()
        bounds = self.static
        if bounds is not None:
            return [Ticket(bounds, now) for _ in range(count)], {}
        claims: list[Ticket] = []
        failed: dict[int, PipelineError] = {}
        for n, message in enumerate(messages):
            try:
                claims.append(Ticket(tuple(self._bound(limit, limit.key_of(message))
                                           for limit in self.limits), now))
            except PipelineError as exc:
                failed[n] = exc
        return claims, failed

    def _bound(self, limit: Limit, key: str) -> Bound:
        return Bound(self.keys.limit(key), limit.concurrency or 0,
                     limit.requests_per_minute or 0, limit.tokens_per_minute or 0)

    def groups(self, tickets: list[Ticket]) -> list[list[Ticket]]:
        """``tickets`` by their bounds (one group when no limit key is a function)."""
        if self.static is not None:
            return [tickets]
        groups: dict[tuple[Bound, ...], list[Ticket]] = {}
        for ticket in tickets:
            groups.setdefault(ticket.bounds, []).append(ticket)
        return list(groups.values())
