"""What a handler sees (a :class:`Message`) and what it returns (:class:`Output` values)."""

from __future__ import annotations

import math
import reprlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from printery.base.errors import OutputContractError
from printery.runtime import partials
from printery.wire.envelope import Envelope


@dataclass(slots=True)
class Output:
    """An event a handler emits; it is written only if the input's commit succeeds.

    ``correlation_id`` defaults to the input's; ``idempotency_key`` to
    ``<type>:<correlation id>``; ``once`` names a guard that makes this output unique
    for ever (e.g. one final result per correlation id), whoever tries to write it again.
    Not frozen, as :class:`~printery.wire.envelope.Envelope` is not: a handler makes one for
    every entry, and printery only reads it.
    """

    type: str
    data: Any
    correlation_id: str | None = None
    idempotency_key: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    once: str | None = None


@dataclass(slots=True)
class Message:
    """One delivered entry: the decoded envelope plus delivery facts.

    ``deliveries`` is Redis's own count (1 on the first delivery), so it survives crashes.
    Handlers report what they spend with :meth:`report_cost`; the amounts travel with the
    outputs as ``cost`` and feed the step cost metric.

    Inside a validation loop (:class:`~printery.Loop`) ``attempt`` is the attempt's number
    (1-based) and ``feedback`` every earlier attempt of the run in that loop, oldest
    first, as ``{"attempt", "data", "reasons"}``; elsewhere 1 and empty. Both default to
    constants, so building a message on the hot path costs nothing more.
    """

    envelope: Envelope
    stream: str
    entry_id: str
    deliveries: int
    worker: str
    consumer: str
    fields: dict[str, str]
    costs: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    attempt: int = 1
    feedback: Sequence[Mapping[str, Any]] = ()
    #: The step's ``max_deliveries``: a handler call with ``deliveries`` at it is the
    #: last before the entry is dead-lettered (a loop turns that failure into a failed
    #: attempt, docs/reference.md).
    max_deliveries: int = 5
    #: Whether :meth:`partial` was called on this message: its attempt then ends with a
    #: verdict (reference: streaming through the gate).
    streamed: bool = False
    #: Set (to the limit's name) when the entry would have waited longer than a
    #: ``Limit``'s ``max_wait``: the call runs the step's fallback instead of its handler
    #: (``escalate(..., fallback=)``, a ``Loop``'s ``fallback``), without that wait.
    over_limit: str = ""
    #: The step's ``estimate=`` (a mapping of cost units to amounts, or a function of the
    #: message; None: none declared): what a model call whose response says nothing of
    #: its usage charges instead (docs/reference.md, Flow control and model steps).
    estimate: Any = None
    #: Set when an earlier delivery of the entry may have shown partials though
    #: ``deliveries`` is 1 (a death among several calls counts for none: a suspect's
    #: trial, :mod:`printery.runtime.suspects`).
    redelivered: bool = False

    @property
    def last_delivery(self) -> bool:
        """Whether a failure of this call dead-letters the entry (no retry is left)."""
        return self.deliveries >= self.max_deliveries

    @property
    def data(self) -> Any:
        return self.envelope.data

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def correlation_id(self) -> str:
        return self.envelope.correlation_id

    def report_cost(self, unit: str, amount: float) -> None:
        """Add ``amount`` of ``unit`` (tokens, usd, probes, ...) to this step's cost.
        Raises ``ValueError`` for an amount that is not a finite number of at least 0: a
        negative one would pay back what a budget counts, and NaN or infinity cannot be
        counted at all."""
        if isinstance(amount, bool) or not isinstance(amount, int | float) \
                or not 0 <= amount < math.inf:
            raise ValueError(f"cost {unit!r}: {amount!r} is not a finite amount of at least 0")
        self.costs[unit] = self.costs.get(unit, 0) + amount

    async def partial(self, text: str) -> None:
        """Show ``text`` to the run's followers now, provisional, as the next piece of
        this attempt's output (reference: streaming through the gate). It is not written
        as an entry of the run: what the step returns is its output, and the attempt's
        verdict commits or retracts what was shown. Returns at once (the text is written
        with the next batch); outside a worker (a handler called by a test) it is
        dropped."""
        if not isinstance(text, str):
            raise TypeError(f"partial takes text (str), not {type(text).__name__}")
        writer = partials.current()
        first, self.streamed = not self.streamed, True
        if writer is not None and text:
            writer.add(self, text, restarted=first and (self.deliveries > 1 or self.redelivered))


HandlerResult = Output | Sequence[Output] | None
Handler = Callable[[Message], Awaitable[HandlerResult]]


def outputs_of(result: HandlerResult) -> list[Output]:
    """A handler's result as a list (a list is taken as it is: printery only reads it).

    Raises :class:`~printery.base.errors.OutputContractError` for anything else (a string, a
    dict, a list holding something that is not an :class:`Output`): a handler bug, which
    fails its entry (retried, then dead-lettered), never its worker."""
    if result is None:
        return []
    if isinstance(result, Output):
        return [result]
    if type(result) is list:
        for out in result:
            if type(out) is not Output:
                return _checked(result)
        return result
    return _checked(result)


def _checked(result: object) -> list[Output]:
    """``result`` as a list of outputs, or the error that says what a handler returns."""
    if isinstance(result, (str, bytes, bytearray, Mapping)) or not isinstance(result, Iterable):
        raise OutputContractError(_wrong(result))
    found = list(result)
    for out in found:
        if not isinstance(out, Output):
            raise OutputContractError(_wrong(result, out))
    return found


def _wrong(result: object, item: object = None) -> str:
    said = reprlib.repr(result)
    what = "" if item is None else f", holding {reprlib.repr(item)} ({type(item).__name__})"
    return (f"a handler returns an Output, a list of Output, or None; it returned {said} "
            f"({type(result).__name__}){what}")
