"""Which limit holds an entry, and how long entries waited for each (``/status``'s
``limits`` and ``printery_limit_wait_seconds{limit}``), and which ``max_wait`` an entry
gives up at (``printery_limit_fallbacks_total{limit}``): the bookkeeping of one step's
:class:`~printery.runtime.limit_gate.LimitGate`, apart from its admissions."""

from __future__ import annotations

from collections.abc import Sequence

from printery.rules.limits import Limit
from printery.runtime.observe import Observer

#: What held a ticket back (bits): a concurrency slot, a window.
HELD_BY_SLOT, HELD_BY_WINDOW = 1, 2


def limit_labels(limits: Sequence[Limit], worker: str) -> tuple[str, ...]:
    """How ``/status`` and ``printery_limit_wait_seconds{limit}`` name each of a step's
    ``limits``: a string key names its limit (whatever its ``name``: limits with the same
    key are one limit, shared by every step declaring it, and two keys are never one
    series); a key function's limit is its ``name``, else ``<step>:<function name>`` (a
    label per key would be one per tenant). Two limits of one step never share a label:
    a repeated one gets ``#<position>``."""
    labels: list[str] = []
    for n, limit in enumerate(limits, 1):
        if isinstance(limit.key, str):
            label = limit.key
        else:
            label = limit.name or f"{worker}:{getattr(limit.key, '__name__', 'key')}"
        clash = label in labels and not (
            isinstance(limit.key, str) and limits[labels.index(label)].key == limit.key)
        labels.append(f"{label}#{n}" if clash else label)
    return tuple(labels)


class LimitWaits:
    """Per limit of one step (by :func:`limit_labels`): the entries ``waiting`` for it
    now, and the seconds ``waited`` for it in all, observed into ``observer``."""

    def __init__(self, limits: Sequence[Limit], worker: str, observer: Observer) -> None:
        self.worker = worker
        self.observer = observer
        labels = limit_labels(limits, worker)
        #: The same, each once (one key declared twice on a step is one limit).
        self._names = tuple(dict.fromkeys(labels))
        holds = [(HELD_BY_SLOT if limit.concurrency else 0)
                 | (HELD_BY_WINDOW if limit.requests_per_minute or limit.tokens_per_minute else 0)
                 for limit in limits]
        #: The limits an entry waits for, by what holds it: a slot wait is a concurrency
        #: limit's, a window wait a rate limit's (the server says which kind, not which
        #: limit: with two of a kind, an entry waits on both).
        self._held_by = {held: tuple(dict.fromkeys(
            label for label, can in zip(labels, holds, strict=True) if can & held))
            or self._names for held in (HELD_BY_SLOT, HELD_BY_WINDOW)}
        #: The same for a call held back by either or both since it asked.
        self._waited_on = {held: frozenset(label for bit in (HELD_BY_SLOT, HELD_BY_WINDOW)
                                           if held & bit for label in self._held_by[bit])
                           for held in (1, 2, 3)}
        self.waiting = dict.fromkeys(labels, 0)
        self.waited = dict.fromkeys(labels, 0.0)
        #: Per kind of wait: the shortest ``max_wait`` of the limits that can hold an entry
        #: that way, and that limit's label (none: such a wait is waited out).
        self.max_wait: dict[int, tuple[float, str]] = {}
        for held in (HELD_BY_SLOT, HELD_BY_WINDOW):
            bounded = sorted((limit.max_wait, label) for limit, label, can
                             in zip(limits, labels, holds, strict=True)
                             if limit.max_wait is not None and can & held)
            if bounded:
                self.max_wait[held] = bounded[0]

    def count_waiting(self, held: int, change: int) -> None:
        """Count a call waiting (``change`` 1) or no longer (-1) for what ``held`` it."""
        for label in self._held_by[held]:
            self.waiting[label] += change

    def admitted(self, waits: list[float], held: list[int]) -> None:
        """Calls admitted together after ``waits`` seconds each, held back by ``held``."""
        if not any(held):  # nothing held them back: each limit took that long to admit
            total = sum(waits)
            for label in self._names:
                self.waited[label] += total
                self.observer.limit_waited(self.worker, label, waits)
        else:  # a call held back waited for the limits of what held it, not the others
            for label in self._names:
                mine = [w if not h or label in self._waited_on[h] else 0.0
                        for w, h in zip(waits, held, strict=True)]
                self.waited[label] += sum(mine)
                self.observer.limit_waited(self.worker, label, mine)

    def gives_up(self, held: int, waited: float, ahead: float) -> str:
        """The label of the limit whose ``max_wait`` a call held by ``held`` passes, having
        waited ``waited`` seconds with ``ahead`` more known to come ("": none)."""
        bound = self.max_wait.get(held)
        if bound is None or waited + ahead <= bound[0]:
            return ""
        self.observer.limit_fallback(self.worker, bound[1])
        return bound[1]

    def status(self) -> dict[str, dict[str, float]]:
        return {label: {"waiting": self.waiting[label], "waited_s": round(self.waited[label], 3)}
                for label in self.waiting}
