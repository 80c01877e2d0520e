"""Every Lua script printery runs, and the one way they are loaded and run.

Each script is a ``.lua`` file of this package's folder, read once by :func:`script`
(what the wheel ships is what runs; nothing is written inline in Python). One run of a
script goes through :class:`Scripts` (by SHA over the pooled client, loaded again after a
server restart, and on a cluster sent as ``EVAL`` when a promoted replica answers
``NOSCRIPT``: :mod:`printery.transport.cluster`); many at once through
:meth:`~printery.transport.channel.DirectChannel.scripts`, the same protocol on a channel
of its own. A script inside a ``MULTI`` is either loaded by its channel's connection
before anything else (``DirectChannel(preload=)``: the commit) or sent as ``EVAL`` of
:attr:`Script.source` (:meth:`Script.command`): a transaction cannot load what it lacks
halfway through.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["Script", "Scripts", "script"]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its file's name and text, and the SHA the server knows it by."""

    name: str
    source: str
    sha: str

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The ``EVAL`` of this script, for a transaction (see the module's docstring)."""
        return ("EVAL", self.source, len(keys), *keys, *args)


@functools.cache
def script(name: str) -> Script:
    """The script in ``<name>.lua`` of this folder, read once per process."""
    source = resources.files("printery.transport").joinpath(f"{name}.lua").read_text()
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


class Scripts:
    """Runs scripts over ``client`` by SHA, loading each the first time and again after
    the server forgot it (a restart, a failover)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._loaded: set[str] = set()

    async def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        for _ in range(2):
            if script.sha not in self._loaded:
                await self.client.script_load(script.source)
                self._loaded.add(script.sha)
            try:
                return await cast(
                    Awaitable[Any], self.client.evalsha(script.sha, len(keys), *keys, *args))
            except NoScriptError:
                self._loaded.discard(script.sha)
        raise ResponseError(f"script {script.name}.lua could not be loaded")
