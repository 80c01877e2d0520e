"""Waiting out an unreachable server: one policy for every caller, one definition of
"unreachable".

Losing the server is not a failure of whoever reads or writes (reference: failures): a
worker, the service starting before its server, a client following a run and the shared
live read all wait it out the same way, backing off (100 ms doubling to 2 s unless told
otherwise) and carrying on when it is back. What counts as unreachable is
:data:`UNREACHABLE`: a refused or dropped connection, a timeout, and on a cluster a
failover in progress (CLUSTERDOWN, TRYAGAIN, a slot no master holds yet) that outlasted
the cluster client's own retries. Anything else the server answers (a wrong type, an ACL
refusal) is raised at once: no wait heals it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from printery.base._util import idle, wait_event
from printery.base.backoff import compute_backoff
from printery.base.errors import ServerRefused
from printery.transport.refusal import REFUSALS, refusal_error
from printery.transport.streams import CONNECTION_ERRORS

__all__ = ["UNREACHABLE", "Outage", "unreachable"]

log = structlog.get_logger("printery.store")

T = TypeVar("T")

#: What "the server is not reachable right now" looks like: worth waiting and retrying.
UNREACHABLE: tuple[type[BaseException], ...] = CONNECTION_ERRORS

#: Called at each failed attempt instead of the default log line: the error, the
#: attempt's number in this outage (from 1) and the seconds about to be waited.
OnAttempt = Callable[[BaseException, int, float], None]


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server cannot be reached now (see :data:`UNREACHABLE`):
    not a refusal of the credentials or of the ACL, which the client library raises as a
    connection error too, but no wait heals."""
    return isinstance(exc, UNREACHABLE) and not isinstance(exc, (*REFUSALS, ServerRefused))


class Outage:
    """One caller's view of the server (``who``, named in its log lines): reachable or
    not, and how to wait for it.

    ``stopping`` ends a wait early (a stopping worker waits for nothing); ``base_ms`` and
    ``cap_ms`` shape the backoff; ``on_attempt`` replaces the default log (one warning
    when an outage begins, one line when it ends) by the caller's own.
    """

    def __init__(
        self, who: str, stopping: asyncio.Event | None = None, *, base_ms: int = 100,
        cap_ms: int = 2000, on_attempt: OnAttempt | None = None,
    ) -> None:
        self.who = who
        self.stopping = stopping
        self.base_ms = base_ms
        self.cap_ms = cap_ms
        self.on_attempt = on_attempt
        self.connected = True

    def stopped(self) -> bool:
        """Whether the caller is stopping (never, for a caller that gave no ``stopping``)."""
        return self.stopping is not None and self.stopping.is_set()

    def restored(self) -> None:
        if not self.connected:
            log.info("server reachable again", who=self.who)
        self.connected = True

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed attempt of an outage."""
        return compute_backoff(failures, base_ms=self.base_ms, cap_ms=self.cap_ms)

    async def trouble(self, exc: BaseException, failures: int, delay: float | None = None) -> None:
        """Note a failed attempt (see ``on_attempt``) and wait the backoff (``delay``, else
        :meth:`delay`'s), or less if the caller is stopping."""
        delay = self.delay(failures) if delay is None else delay
        if self.on_attempt is not None:
            self.on_attempt(exc, failures, delay)
        elif self.connected:
            log.warning("server unreachable, backing off", who=self.who, error=str(exc))
        self.connected = False
        if self.stopping is None:
            await idle(delay)
        else:
            await wait_event(self.stopping, delay)

    async def retrying(
        self, action: Callable[[], Awaitable[T]], *, deadline: float | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """``action()`` until it gets through. The error is raised instead of waited out
        when the caller is stopping, when ``give_up()`` says so, or (as
        ``TimeoutError``) when the next wait would pass ``deadline`` (monotonic)."""
        failures = 0
        while True:
            try:
                result = await action()
            except UNREACHABLE as exc:
                if not unreachable(exc):
                    refusal = refusal_error(exc)
                    if refusal is None:
                        raise
                    raise refusal from exc
                if give_up is not None and give_up():
                    raise
                failures += 1
                delay = self.delay(failures)  # once: it is jittered
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TimeoutError(f"server unreachable: {exc}") from exc
                await self.trouble(exc, failures, delay)
                if self.stopping is not None and self.stopping.is_set():
                    raise
                continue
            if failures:
                self.restored()
            return result
