"""Fakes for the policies' unit tests (tests/policies): a batch of real deliveries and
messages with no server behind them, a lookup round trip that records what it was sent,
and the decisions of a fake failure model. No policy test needs a server: what a policy
asks of one is what its fake records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from printery.policies.base import Batch, Entry
from printery.runtime.accounting import Decided
from printery.runtime.consumer import Consumer, ConsumerSettings, Delivery, InFlight
from printery.runtime.handler import Message, Output
from printery.transport.commit import Append, EntryCommit
from printery.wire.envelope import Envelope

STREAM = "printery:stream:task"


def entry(n: int, *, deliveries: int = 1, data: Any = None, producer: str = "external",
          extra: dict[str, str] | None = None, run: str | None = None,
          consumer: Consumer | None = None) -> Entry:
    """The ``n``-th entry of a batch: a real delivery held by a real consumer."""
    consumer = consumer or Consumer("step-0", ConsumerSettings(), InFlight(4))
    entry_id = f"{n}-0"
    delivery = consumer.hold(STREAM, entry_id, {"type": "task"}, deliveries)
    assert delivery is not None
    envelope = Envelope("task", {"n": n} if data is None else data, f"e{n}", run or f"run-{n}",
                        f"task:{n}", producer=producer, extra=extra or {})
    message = Message(envelope=envelope, stream=STREAM, entry_id=entry_id, deliveries=deliveries,
                      worker="step", consumer=consumer.name, fields={"type": "task"})
    return delivery, message


def entries(count: int, **kwargs: Any) -> list[Entry]:
    consumer = Consumer("step-0", ConsumerSettings(), InFlight(4))
    return [entry(n, consumer=consumer, **kwargs) for n in range(count)]


@dataclass
class LookUps:
    """The batch's lookup round trip: ``recorded`` keys have a record; ``replies``
    answers each read command. ``sent`` keeps every round trip made (keys, reads)."""

    recorded: set[str] = field(default_factory=set)
    replies: dict[str, Any] = field(default_factory=dict)
    sent: list[tuple[list[str], list[Any]]] = field(default_factory=list)

    async def __call__(self, keys: Sequence[str], reads: Sequence[Any]) -> tuple[list[bool], list[Any]]:
        self.sent.append((list(keys), list(reads)))
        return [key in self.recorded for key in keys], [self.replies[read[0]] for read in reads]


def written(delivery: Delivery, message: Message, outputs: Sequence[Output], outcome: str) -> Decided:
    """A decision that writes ``outputs`` (their types as the commit's appends)."""
    commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id,
                         message.envelope.idempotency_key,
                         [Append(out.type, {"data": str(out.data), **out.extra})
                          for out in outputs])
    return Decided(delivery, commit, outcome, message)


def batch(items: list[Entry], *, look_up: LookUps | None = None, readers: Iterable[Any] = (),
          none_over: bool = False) -> Batch:
    return Batch(items, [], look_up=look_up or LookUps(), written=written,
                 readers=tuple(readers), none_over=none_over)


class Failures:
    """The failure model's decisions, recorded: a dead letter's reason code is its
    decision's ``reason_code``."""

    def __init__(self) -> None:
        self.letters: list[tuple[str, str]] = []

    def dead_letter(self, delivery: Delivery, fields: dict[str, str], reason_code: str,
                    error: str, **_: Any) -> Decided:
        self.letters.append((delivery.entry_id, reason_code))
        commit = EntryCommit(delivery.stream, delivery.consumer.name, delivery.entry_id, "", ())
        return Decided(delivery, commit, "dead_lettered", reason_code=reason_code, error=error)

    async def over_delivered(self, delivery: Delivery, fields: dict[str, str]) -> Decided:
        return self.dead_letter(delivery, fields, "max_deliveries_exceeded", "over")


class Connectivity:
    """An outage policy that never waits: each call made once."""

    def __init__(self, stopped: bool = False) -> None:
        self._stopped = stopped

    async def retrying(self, call: Any) -> Any:
        return await call()

    def stopped(self) -> bool:
        return self._stopped


def ids(items: Iterable[Entry]) -> list[str]:
    return [delivery.entry_id for delivery, _ in items]


def outcomes(decided: Iterable[Decided]) -> list[tuple[str, str]]:
    return [(item.delivery.entry_id, item.outcome) for item in decided]
