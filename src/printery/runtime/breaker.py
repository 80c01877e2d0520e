"""Circuit breakers of model steps (docs/reference.md, Flow control and model steps): a
provider that is down is found once, by every process sharing the server, not by each
entry on its own.

:class:`Breaker` is the declaration (``OpenAICompatible(..., breaker=Breaker(...))``);
:class:`Circuit` is one model's breaker at run time. Its state lives in the server, one
hash per model name (:meth:`~printery.wire.keys.StreamKeys.breaker`), changed only by
``transport/lua/breaker.lua`` on the server's clock, so every process and every step calling
that model sees the same breaker: ``failures`` consecutive failed requests (a timeout, a
connection error, a 5xx, a stream cut short) within ``window`` seconds open it; for
``reset`` seconds every request is refused at once with
:class:`~printery.base.errors.ProviderDown`, without reaching the provider; then one caller
(across processes) makes the trial request: a success closes the breaker, a failure opens
it for another ``reset``. Any answer that is not a failure (a 2xx, a 4xx: the provider
answered) resets the count.

The breaker speaks to the server of the worker whose handler calls the model (the one its
partials go to, :func:`printery.runtime.partials.current`); a model called outside a
worker (a handler called by a test) has no breaker to ask and calls the provider as if it
had none; so does a call whose server cannot be reached (the worker's own commit then
waits for the server, as any does).
"""

from __future__ import annotations

import math
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import structlog

from printery.base.errors import PipelineError, ProviderDown, describe
from printery.runtime import partials
from printery.store.outage import UNREACHABLE
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.keys import StreamKeys

__all__ = ["Breaker", "Circuit", "breaker_states"]

log = structlog.get_logger("printery.breaker")

BREAKER_LUA = script("breaker")
#: What ``breaker.lua`` answers: closed (call), open (refused), this caller's trial.
CLOSED, OPEN, TRIAL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Breaker:
    """Open after ``failures`` consecutive failed calls within ``window`` seconds; refuse
    every call for ``reset`` seconds; then let one trial call decide (see the module)."""

    failures: int = 5
    window: float = 30.0
    reset: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int) \
                or self.failures < 1:
            raise PipelineError(f"Breaker failures={self.failures!r}: a whole number >= 1")
        for name in ("window", "reset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not 0 < value < math.inf:
                raise PipelineError(f"Breaker {name}={value!r}: a number of seconds > 0")


#: The breaker of each model name this process made a model with, for ``/status`` and the
#: gauge (one small entry per model name: kept for the process's life).
_known: dict[str, Breaker] = {}
#: The script runner of each server client a circuit asked (loaded once per client).
_runners: weakref.WeakKeyDictionary[Any, Scripts] = weakref.WeakKeyDictionary()


class Circuit:
    """The breaker of the model ``model``; ``lease``: seconds a trial call may take before
    another caller may make the trial instead (its caller died)."""

    def __init__(self, model: str, breaker: Breaker, *, lease: float) -> None:
        self.model = model
        self.breaker = breaker
        self._head = [breaker.failures, _ms(breaker.window), _ms(breaker.reset), _ms(lease)]
        _known[model] = breaker

    async def admit(self) -> str:
        """Before a request: the caller's token for :meth:`record` ("" outside a worker).
        Raises :class:`ProviderDown` while the breaker is open or another caller makes
        the trial."""
        caller = uuid.uuid4().hex
        answer = await self._ask("ask", caller)
        if answer is None:
            return ""
        state, ms = answer
        if state == OPEN:
            raise ProviderDown(self.model, f"model {self.model}: its provider is down (the "
                                           f"circuit breaker is open for {ms / 1000:g} s more)",
                               delay=ms / 1000)
        return caller

    async def record(self, caller: str, *, failed: bool) -> None:
        """The outcome of the request ``caller`` (of :meth:`admit`) made."""
        if caller:
            await self._ask("fail" if failed else "ok", caller)

    async def _ask(self, op: str, caller: str) -> tuple[int, int] | None:
        writer = partials.current()
        if writer is None:
            return None
        try:
            state, ms = await _runner(writer.client).call(
                BREAKER_LUA, [writer.keys.breaker(self.model)], [op, *self._head, caller])
        except UNREACHABLE as exc:  # advisory: the call is not failed for it
            log.warning("circuit breaker not reachable: the model is called as if it were "
                        "closed", model=self.model, error=describe(exc))
            return None
        return int(state), int(ms)


def _runner(client: Redis) -> Scripts:
    """The script runner of ``client`` (the script loaded once per client)."""
    runner = _runners.get(client)
    if runner is None:
        runner = _runners[client] = Scripts(client)
    return runner


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


async def breaker_states(client: Redis, keys: StreamKeys) -> dict[str, dict[str, Any]]:
    """Each breaker this process knows (the models its app made with one), as the server
    holds it, judged on the server's clock: ``state`` (``closed``, ``open``, or
    ``half_open``: the reset is over and a trial call decides), ``failures``
    (consecutive, in the window) and, when not closed, ``opened`` (unix seconds) and
    ``trial_in_s`` (seconds until a trial may be made)."""
    runner = _runner(client)
    found: dict[str, dict[str, Any]] = {}
    for model, breaker in sorted(_known.items()):
        head = [breaker.failures, _ms(breaker.window), _ms(breaker.reset), 0]
        state, ms, failures, opened = await runner.call(
            BREAKER_LUA, [keys.breaker(model)], ["peek", *head, ""])
        if int(state) == CLOSED:
            found[model] = {"state": "closed", "failures": int(failures)}
            continue
        found[model] = {"state": "open" if int(state) == OPEN else "half_open",
                        "failures": int(failures), "opened": int(opened) / 1000,
                        "trial_in_s": int(ms) / 1000}
    return found
