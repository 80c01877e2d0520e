"""Step 5 of the entry pipeline (:mod:`printery.runtime.consume`): what an entry's
decision was, and what is counted, observed and logged once its commit says what
happened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from printery.base.errors import describe
from printery.base.worker import WorkerStats
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Message
from printery.runtime.observe import Observer
from printery.transport.commit import DUPLICATE, FENCED, EntryCommit
from printery.transport.dead_letter import DeadLetterWrite

__all__ = ["Accounting", "Decided"]

log = structlog.get_logger("printery.worker")


@dataclass(slots=True)
class Decided:
    """An entry's commit, and what to account for once it is done."""

    delivery: Delivery
    commit: EntryCommit
    # ok, duplicate, dead_lettered, skipped (a replay's copy for other steps), routed (to
    # its run's partition, docs/reference.md, Partitions),
    # budget_exceeded (held: its run is at a hard limit)
    outcome: str
    message: Message | None = None
    reason_code: str = ""
    error: str = ""
    traceback: str = ""
    span: Any = None  # its span while tracing is on (runtime.spans), ended once committed
    #: A dead letter's writes (written by a script of their own, not the commit).
    letter: DeadLetterWrite | None = None


class Accounting:
    """One step's accounting of its entries."""

    def __init__(self, worker: str, observer: Observer, stats: WorkerStats) -> None:
        self.worker = worker
        self.observer = observer
        self.stats = stats

    def account(self, item: Decided, result: Any, seconds: float) -> None:
        """Metrics, counters and log lines of one entry, once its commit's ``result``
        is known (``seconds`` after its batch began)."""
        entry_id = item.delivery.entry_id
        if isinstance(result, Exception):  # this entry cannot commit: it stays pending
            self.stats.errors += 1
            self.stats.last_error = describe(result)
            log.error("commit failed", worker=self.worker, entry_id=entry_id, error=describe(result))
            return
        if item.outcome == "ok" and result > DUPLICATE:  # committed: the usual case, first
            self.stats.processed += 1
            self.observer.processed(self.worker, "ok", seconds)
            assert item.message is not None
            for unit, amount in item.message.costs.items():
                self.observer.cost(self.worker, unit, amount)
            if item.commit.budget is not None and result > 1 + len(item.commit.appends):
                for _ in range(result - 1 - len(item.commit.appends)):  # warnings written
                    self.observer.budget_event(self.worker, "warning")
            return
        if result == FENCED:
            log.warning("entry was reclaimed by another consumer; not committing",
                        worker=self.worker, entry_id=entry_id)
            self.observer.processed(self.worker, "fenced", seconds)
        elif item.outcome == "dead_lettered":
            self.observer.dead_lettered(self.worker, item.reason_code)
            self.observer.processed(self.worker, "dead_lettered", seconds)
            log.error("entry dead-lettered", worker=self.worker, entry_id=entry_id,
                      reason_code=item.reason_code, error=item.error[:500],
                      traceback=item.traceback or None)
        elif item.outcome in ("skipped", "routed", "settled"):
            self.observer.processed(self.worker, item.outcome, seconds)
        elif item.outcome == "duplicate" or result == DUPLICATE:
            self.observer.processed(self.worker, "duplicate", seconds)
        elif item.outcome == "budget_exceeded":
            self.observer.processed(self.worker, "budget_exceeded", seconds)
            if result > 1:  # its output was written (a stop's is written once per run)
                self.observer.budget_event(self.worker, "exceeded")
