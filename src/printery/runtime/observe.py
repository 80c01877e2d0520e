"""Hooks through which the runtime reports what happens, so metrics and logs stay out of
the consume loop's logic. The default observer does nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Observer(Protocol):
    """Called synchronously from the hot path: implementations must be cheap and not raise."""

    def processed(self, worker: str, outcome: str, seconds: float) -> None:
        """``outcome``: ok, duplicate, error, dead_lettered, fenced, skipped."""

    def dead_lettered(self, worker: str, reason_code: str) -> None: ...

    def retried(self, worker: str) -> None: ...

    def cost(self, worker: str, unit: str, amount: float) -> None: ...

    def budget_event(self, worker: str, level: str) -> None:
        """``level``: warning (a soft limit reached) or exceeded (a hard one)."""

    def limit_waited(self, worker: str, limit: str, seconds: Sequence[float]) -> None:
        """Handler calls of a limited step were admitted together, each after its
        ``seconds`` of waiting."""

    def limit_fallback(self, worker: str, limit: str) -> None:
        """A handler call ran the step's fallback: it would have waited past ``limit``'s
        ``max_wait``."""


class NullObserver:
    def processed(self, worker: str, outcome: str, seconds: float) -> None:
        pass

    def dead_lettered(self, worker: str, reason_code: str) -> None:
        pass

    def retried(self, worker: str) -> None:
        pass

    def cost(self, worker: str, unit: str, amount: float) -> None:
        pass

    def budget_event(self, worker: str, level: str) -> None:
        pass

    def limit_waited(self, worker: str, limit: str, seconds: Sequence[float]) -> None:
        pass

    def limit_fallback(self, worker: str, limit: str) -> None:
        pass
