"""Flow control for steps that call rate-limited APIs (docs/reference.md, Flow control):
:class:`Limit`.

A limit is declared on a step (``@pipeline.step(..., limits=[Limit(...)])``) and holds
across every process sharing the server, because its state lives there: see
:mod:`printery.runtime.limit_gate` for how entries wait and
``printery/transport/lua/limit.lua`` for the one atomic decision.

Its namesake in other layers (the same job there): :mod:`printery.policies.limits`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from printery.base._util import marked
from printery.base.errors import PipelineError, WorkerCrashed, describe

__all__ = ["WINDOW_SECONDS", "FallsBack", "Limit", "fallback_of", "mark_fallback"]

#: Whether a step has a fallback to run for this message in place of its handler when a
#: limit's ``max_wait`` runs out (a ``Loop`` has one for a turn that calls ``work``).
#: The functions here take the step's :class:`~printery.Message`, typed ``Any``: a
#: declaration does not depend on the runtime that delivers it (layer 0, below ``runtime``).
FallsBack = Callable[[Any], bool]
_FALLBACK_ATTR = "__printery_falls_back__"

#: The window of ``requests_per_minute`` and ``tokens_per_minute``.
WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``concurrency`` handlers at once, ``requests_per_minute`` handler starts
    and ``tokens_per_minute`` tokens (the ``tokens`` cost handlers report) within any
    60 s window, per key, for every process sharing the server.

    ``key`` is a string, or a function of the :class:`~printery.Message` returning one
    (e.g. a limit per tenant); limits with the same key share their state, whichever
    step declares them. ``printery_limit_wait_seconds`` and ``/status`` name a limit by
    its key; a limit whose key is a function by ``name``, else ``<step>:<function name>``
    (a per-message key would make a label per tenant).

    Tokens are known only once a handler reports them, so a handler starts while the
    tokens of the window are below ``tokens_per_minute``: the window can go over by what
    the handlers running at that moment report (with ``concurrency`` too, at most that
    many calls' worth).

    ``max_wait`` (seconds): an entry that would wait longer than that for this limit
    runs the step's fallback instead (``escalate(..., fallback=...)``, a ``Loop``'s
    ``fallback``), counted in ``printery_limit_fallbacks_total{limit}``; a saturated
    provider sends work elsewhere rather than queueing it for minutes. A step without a
    fallback waits as if no ``max_wait`` were set.
    """

    key: str | Callable[[Any], str]
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrency: int | None = None
    name: str | None = None
    max_wait: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            if not self.key:
                raise PipelineError("Limit: key is empty; name what is limited (e.g. 'openai')")
        elif not callable(self.key):
            raise PipelineError(
                f"Limit: key={self.key!r} is neither a string nor a function of the message")
        given = {"requests_per_minute": self.requests_per_minute,
                 "tokens_per_minute": self.tokens_per_minute, "concurrency": self.concurrency}
        if all(value is None for value in given.values()):
            raise PipelineError(
                f"Limit {self.label!r} limits nothing: give requests_per_minute, "
                "tokens_per_minute or concurrency")
        for what, value in given.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise PipelineError(
                    f"Limit {self.label!r}: {what}={value!r} is not an integer >= 1")
        wait = self.max_wait
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int | float)
                                 or not wait >= 0):
            raise PipelineError(
                f"Limit {self.label!r}: max_wait={wait!r} is not a number of seconds >= 0")

    @property
    def label(self) -> str:
        """The limit's name in its error messages (metrics and ``/status`` name it as
        :func:`printery.runtime.limit_waits.limit_labels` says)."""
        if self.name:
            return self.name
        if isinstance(self.key, str):
            return self.key
        return getattr(self.key, "__name__", "key")

    def key_of(self, message: Any) -> str:
        """The key ``message`` is limited under. Raises :class:`PipelineError` when the key
        function raises (whatever it raises: a ``KeyError`` on a message without the
        field is the usual one) or returns no non-empty string: user code called on an
        entry fails that entry only (``invalid_limit_key``), never its batch or worker.
        :class:`WorkerCrashed` is raised through, as from a handler: it is deliberate."""
        if isinstance(self.key, str):
            return self.key
        try:
            key = self.key(message)
        except WorkerCrashed:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise PipelineError(
                f"Limit {self.label!r}: the key function raised {describe(exc)}") from exc
        if not isinstance(key, str) or not key:
            raise PipelineError(
                f"Limit {self.label!r}: the key function returned {key!r}, not a non-empty string")
        return key


def mark_fallback(handler: object, falls_back: FallsBack | None) -> None:
    """Record on ``handler`` that it has a fallback a ``max_wait`` can run (see
    :attr:`Limit.max_wait`; None: it has none); the step built on it reads it with
    :func:`fallback_of`."""
    if falls_back is not None:
        setattr(handler, _FALLBACK_ATTR, falls_back)


def fallback_of(handler: object) -> FallsBack | None:
    found = marked(handler, _FALLBACK_ATTR)
    return found if callable(found) else None
