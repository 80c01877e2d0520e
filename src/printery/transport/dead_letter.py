"""The one way an entry is dead-lettered (reference: failures): its ``dlq`` entry, the
``run:failed`` outcome that ends its run, the ack and the run index's writes, in one
script run (``dead_letter.lua``), fenced on the entry still being held.

A script rather than the commit transaction: the run's outcome names the dlq entry's id,
which exists only once its ``XADD`` ran. Dead letters are rare, so a round trip of their
own costs the hot path nothing. A retry after a lost reply finds the entry acked and
writes nothing twice (the fence)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from printery.transport.channel import Command
from printery.transport.scripts import Scripts, script

__all__ = ["DEAD_LETTER_LUA", "DeadLetterWrite", "write_dead_letter"]

DEAD_LETTER_LUA = script("dead_letter")


@dataclass(frozen=True, slots=True)
class DeadLetterWrite:
    """Everything one dead letter writes. ``consumer`` "" takes the entry from whoever
    holds it (an operator's ``printery pending dlq``). ``outcome`` "" ends no run (the
    entry names none); else the run's ``run:failed`` stream, ``outcome_fields`` its
    entry (its ``data`` is ``data_before`` + the dlq id + ``data_after``), ``run_info``
    the run's index hash (a run ended with another status gets no outcome) and
    ``index`` the index's writes for it. ``last_error`` the key of the entry's last
    error record, removed with it ("" none). ``entry_id`` "" dead-letters what no entry
    holds (a join a sweep decided: no fence, no ack); ``once`` a key that makes it
    written at most once (kept ``once_ttl_ms``), "" none. ``ends_run`` False writes
    ``outcome_fields`` to ``outcome`` as a plain entry (a skipped Map item's result for its
    collector): no run ends, the index is not touched. ``reservation`` the entry's field
    in its run's reservations hash ``reserved`` (a step's ``estimate=``), removed with it
    ("" none): a failed entry's estimate stops counting against its run's budget at once."""

    source: str
    group: str
    consumer: str
    entry_id: str
    dlq: str
    letter: Mapping[str, str]
    outcome: str = ""
    outcome_fields: Mapping[str, str] = field(default_factory=dict)
    data_before: str = ""
    data_after: str = ""
    run_info: str = ""
    index: Sequence[Command] = ()
    last_error: str = ""
    once: str = ""
    once_ttl_ms: int = 0
    ends_run: bool = True
    reserved: str = ""
    reservation: str = ""

    def script_keys(self) -> list[str]:
        keys = [self.source, self.dlq]
        if self.outcome:
            keys += [self.outcome, self.run_info]
        return keys

    def script_args(self) -> list[Any]:
        letter = list(chain.from_iterable(self.letter.items()))
        outcome = list(chain.from_iterable(self.outcome_fields.items())) if self.outcome else []
        index: list[Any] = []
        if self.outcome:
            for command in self.index:
                index += (len(command), *command)
        return [self.group, self.consumer, self.entry_id, len(letter), len(outcome),
                self.data_before, self.data_after, len(index), self.last_error,
                self.once, self.once_ttl_ms, "1" if self.ends_run else "0",
                self.reserved, self.reservation, *letter, *outcome, *index]


async def write_dead_letter(scripts: Scripts, write: DeadLetterWrite) -> str | None:
    """Dead-letter one entry; the dlq entry's id, or None when the entry is no longer
    held as ``write`` says (acked meanwhile, or another consumer's now)."""
    reply = await scripts.call(DEAD_LETTER_LUA, write.script_keys(), write.script_args())
    if reply == -1 or reply is None:
        return None
    return reply.decode() if isinstance(reply, bytes) else str(reply)
