"""The server's own count of the commands a side sends (``INFO commandstats``)."""

from __future__ import annotations

from typing import Any

from printery.store import Redis


class CommandStats:
    """Calls per command on our own server over the measured window, from ``INFO
    commandstats`` (unknown for a remote server, which others may be using).

    Commands a script or a ``MULTI`` runs count as themselves, besides the ``EVAL``/
    ``EXEC`` that ran them: the server executes them either way. ``usec`` is the server's
    own time in each command (a script's includes that of the commands it runs).
    """

    def __init__(self, client: Redis, *, enabled: bool) -> None:
        self.client = client
        self.enabled = enabled
        self._start: dict[str, tuple[int, float]] = {}

    async def _now(self) -> dict[str, tuple[int, float]]:
        info: Any = await self.client.info("commandstats")
        stats: dict[str, tuple[int, float]] = {}
        for key, value in info.items():
            name = str(key).removeprefix("cmdstat_")
            if isinstance(value, dict) and name != "info":
                stats[name] = (int(value.get("calls", 0)), float(value.get("usec", 0)))
        return stats

    async def start(self) -> None:
        if self.enabled:
            self._start = await self._now()

    async def stop(self, *, driver: dict[str, int]) -> dict[str, tuple[int, float]] | None:
        """Calls and server µs per command since :meth:`start`, less ``driver``'s calls."""
        if not self.enabled:
            return None
        end = await self._now()
        delta: dict[str, tuple[int, float]] = {}
        for name, (calls, usec) in end.items():
            calls0, usec0 = self._start.get(name, (0, 0.0))
            own = max(0, calls - calls0 - driver.get(name, 0))
            if own:
                delta[name] = (own, usec - usec0)
        return delta
