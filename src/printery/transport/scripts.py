"""Every Lua script printery runs, and the one way they are loaded and run.

Each script is an entry point, a ``.lua`` file of ``transport/lua/``, assembled once by
:func:`script` from its own lines and the shared includes of ``transport/lua/includes/``
it names (a line ``--@include name`` is replaced by ``includes/name.lua``, each include
once per script, an include's own includes first): the ownership fence, the server's
clock, the argument readers, the records, outputs, budgets and run index are each
written once (docs/engine.md, The Lua library). What the wheel ships is what runs;
nothing is written inline in Python. One run of a
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
import re
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["INCLUDE", "Script", "Scripts", "assemble", "script"]

#: An include directive: the whole line, ``--@include <name>``.
INCLUDE = re.compile(r"^--@include ([a-z_]+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its file's name and text, and the SHA the server knows it by."""

    name: str
    source: str
    sha: str

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The ``EVAL`` of this script, for a transaction (see the module's docstring)."""
        return ("EVAL", self.source, len(keys), *keys, *args)


def _library() -> Any:
    return resources.files("printery.transport").joinpath("lua")


def assemble(text: str, seen: set[str] | None = None) -> str:
    """``text`` with each ``--@include`` line replaced by that include's text (its own
    includes resolved first; one already assembled into this script is left out)."""
    seen = set() if seen is None else seen

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return f"-- (include {name}: above)"
        seen.add(name)
        body = _library().joinpath("includes", f"{name}.lua").read_text()
        return f"-- include {name}\n{assemble(body, seen).rstrip()}\n-- end of include {name}"

    return INCLUDE.sub(include, text)


@functools.cache
def script(name: str) -> Script:
    """The entry point ``lua/<name>.lua``, with its includes, assembled once per process."""
    source = assemble(_library().joinpath(f"{name}.lua").read_text())
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
