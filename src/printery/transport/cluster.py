"""redis-py's asyncio cluster client, as printery needs it on a failover.

Like :mod:`printery.transport.channel`, this module reaches past redis-py's public API,
and names what it reaches for so that moving the client pin means reading it: the
client's ``execute_command``, ``_determine_slot``, ``_determine_nodes`` and
``response_callbacks``, the ``NodesManager`` (its ``__slots__``, ``startup_nodes``,
``nodes_cache``, ``slots_cache``, ``initialize`` and ``update_moved_exception``). Each
is a defect of redis-py 6.4 met in the cluster chaos run (tests/chaos/cluster.py) or
failover test, fixed here rather than worked around in every caller:

* a connection error or CLUSTERDOWN inside a cluster transaction is stored as if it were
  a MOVED redirect; every later command of the client then fails with
  ``AttributeError: ... has no attribute 'host'`` (redis-py issue 3815). Only a real
  MOVED is kept; for the others the next command reads the slot map again itself.
* ``XREADGROUP``/``XREAD`` keys were looked up with a ``COMMAND GETKEYS`` round trip per
  read, on one shared node connection that a slot-map refresh may be closing
  (``'NoneType' object has no attribute 'writelines'``); their keys are read from the
  arguments instead (one round trip less per read, too).
* a cluster that cannot be reached when the slot map is first read raises
  ``RedisClusterException``; it is the connection error it is, as on one server.
* a slot-map refresh replaces every node object and closes the old ones' connections,
  also under a command being sent on one (``'NoneType' object has no attribute
  'writelines'``); that is turned into the connection error it is, which the client's
  retry loop sends again on the new map.
* inside a cluster transaction a read command's ``keys=`` option reaches its reply
  callback, which does not take it (``HGETALL``: a ``TypeError`` after ``EXEC``; redis-py
  issue 3401); the plain client drops it, and so does this one.
* every node a command fails on with a connection error or a timeout is removed from the
  startup nodes, and only a successful read of the slot map fills them again (redis-py
  issue 3693). A failover breaks connections to every node at once (the client's own
  refresh closes them all, under the blocking reads of every partition), so the list
  ends empty and every later command fails for good with ``Redis Cluster cannot be
  connected. Please provide at least one reachable node: None``. Here each read of the
  slot map is tried on the nodes still listed, then on the URL's nodes, then on every
  node the last good map named (the failed ones last, as redis-py 8.1 does): the view is
  rebuilt from the URL whenever every known node is gone. A cluster that cannot be read
  is a connection error, as on one server, on every path that reads the map (commands,
  pipelines and transactions, the commit channel), never a ``RedisClusterException``
  that nothing retries. Reads of the map are one at a time, and a read that waited for
  another one that succeeded is not made again (in a failover every consumer asks at
  once, and concurrent reads replaced each other's node objects). redis-py 8.1 fixes
  both (it keeps a failed node, moving it last, and locks the refresh); the pin stays
  6.4 (pyproject.toml) until 8.1 is measured here.
* a replica promoted in a failover has none of the scripts loaded on its master (the
  server does not replicate ``SCRIPT LOAD``), and redis-py sends ``SCRIPT LOAD`` only to
  the nodes its map calls masters, which a map read during a failover may not name
  (``ResponseError: script could not be loaded`` crashed a worker's lease loop in 2
  of about 30 runs of tests/e2e/test_cluster_failover.py, URL naming one node; the
  supervisor restarted it). An ``EVALSHA`` answered ``NOSCRIPT`` for a script loaded
  through this client is sent again as ``EVAL`` of its source, and ``SCRIPT LOAD`` also
  goes to every node the map routes a slot to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.cluster import get_node_name
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, NoScriptError, RedisClusterException

#: Attempts of a command the cluster client refused or lost its node for, with a backoff
#: capped at half a second: enough to ride out a master failover (node timeout plus
#: election, a few seconds) without the caller seeing it.
RETRIES = 12

_STREAM_READS = ("XREADGROUP", "XREAD")


class _NodesManager(NodesManager):
    """``_seeds``: the URL's nodes; ``_known``: the nodes of the last slot map read;
    ``_reads``: how many reads of the map succeeded, under ``_lock`` (of ``_loop``)."""

    __slots__ = ("_known", "_lock", "_loop", "_reads", "_seeds")

    _seeds: tuple[tuple[str, int], ...]
    _known: tuple[tuple[str, int], ...]
    _lock: asyncio.Lock | None
    _loop: asyncio.AbstractEventLoop | None
    _reads: int

    @classmethod
    def replacing(cls, manager: NodesManager, seeds: Sequence[tuple[str, int]]) -> _NodesManager:
        """This manager in place of redis-py's ``manager`` (its state taken over)."""
        new = cls.__new__(cls)
        for name in NodesManager.__slots__:
            setattr(new, name, getattr(manager, name))
        new._seeds = tuple(seeds)
        new._known = ()
        new._lock = new._loop = None
        new._reads = 0
        return new

    def update_moved_exception(self, exception: Exception) -> None:
        if isinstance(exception, MovedError):
            super().update_moved_exception(exception)  # type: ignore[no-untyped-call]

    async def initialize(self) -> None:
        """Read the slot map; one read at a time, and none when another one succeeded
        while this one waited (a failover has every consumer ask at once)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        reads = self._reads
        async with self._lock:
            if self._reads != reads and self.default_node is not None:
                return  # read while this one waited, and not closed since
            self._reseed()
            try:
                await super().initialize()
            except RedisClusterException as exc:
                # No node answered, or the slots are not all covered (a failover in
                # progress): the cluster is unreachable for now, like a server that is down.
                raise RedisConnectionError(f"cluster unavailable: {exc}") from exc
            self._known = tuple((node.host, int(node.port)) for node in self.nodes_cache.values())
            self._reads += 1

    def _reseed(self) -> None:
        """Append to the startup nodes the URL's nodes and those of the last map read
        that a failed command removed (tried after the nodes still listed)."""
        for host, port in (*self._seeds, *self._known):
            name = get_node_name(host, port)
            if name not in self.startup_nodes:
                self.startup_nodes[name] = ClusterNode(host, port, **self.connection_kwargs)


class _RedisCluster(RedisCluster):
    #: Source of every script loaded through this client, by SHA (see ``execute_command``).
    _sources: dict[str, str]

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """The scripts a failover leaves behind: ``SCRIPT LOAD`` reaches the masters of
        the slot map the client holds, and a replica promoted since has none of them
        (the server does not replicate its script cache). An ``EVALSHA`` of a script
        loaded here that is answered ``NOSCRIPT`` is sent again as ``EVAL`` of its
        source, routed and redirected the same way; the node that runs it caches it."""
        command = _word(args[0]) if args else ""
        if command == "SCRIPT LOAD" and len(args) == 2:
            sha = await super().execute_command(*args, **kwargs)
            self._sources[str(sha)] = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
            return sha
        try:
            return await super().execute_command(*args, **kwargs)
        except NoScriptError:
            source = self._sources.get(str(args[1])) if command == "EVALSHA" and len(args) > 1 else None
            if source is None:
                raise
            return await super().execute_command("EVAL", source, *args[2:], **kwargs)

    async def _determine_nodes(
        self, command: str, *args: Any, node_flag: str | None = None
    ) -> list[ClusterNode]:
        """``SCRIPT LOAD`` goes to every node the slot map routes a slot to, besides those
        it calls masters: the two disagree for a moment after a failover (a node first
        listed as a replica keeps that name), and a script must be where commands go."""
        nodes: list[ClusterNode] = await super()._determine_nodes(command, *args, node_flag=node_flag)
        if _word(command) == "SCRIPT LOAD" and node_flag is None:
            found = {node.name: node for node in nodes}
            for holders in self.nodes_manager.slots_cache.values():
                if holders and holders[0].name not in found:
                    found[holders[0].name] = holders[0]
            nodes = list(found.values())
        return nodes

    async def initialize(self) -> RedisCluster:
        try:
            return await super().initialize()
        except RedisClusterException as exc:
            # No startup node answered, or the slots are not all covered (a failover in
            # progress): the cluster is unreachable for now, like a server that is down.
            raise RedisConnectionError(f"cluster unavailable: {exc}") from exc

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._execute_command(target_node, *args, **kwargs)
        except AttributeError as exc:
            if not _closed_under(exc):
                raise
            # What the client retries: its own retry loop sends it again on the new map.
            raise RedisConnectionError(f"connection closed under the command: {exc}") from exc

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in _STREAM_READS:
            keys = stream_read_keys(command, args)
            if keys:
                slots = {self.keyslot(key) for key in keys}
                if len(slots) == 1:
                    return slots.pop()
        slot: int = await super()._determine_slot(command, *args)
        return slot


def stream_read_keys(command: str, args: Sequence[Any]) -> list[Any] | None:
    """The stream keys of an ``XREADGROUP``/``XREAD`` (``args`` after the command name),
    or None when they are not where the syntax puts them (redis-py then asks the server)."""
    i = 0
    if command.upper() == "XREADGROUP":
        if not args or _word(args[0]) != "GROUP":
            return None
        i = 3
    while i < len(args):
        word = _word(args[i])
        if word in ("COUNT", "BLOCK"):
            i += 2
        elif word == "NOACK":
            i += 1
        elif word == "STREAMS":
            tail = list(args[i + 1 :])
            return tail[: len(tail) // 2] if tail and len(tail) % 2 == 0 else None
        else:
            return None
    return None


def _closed_under(exc: AttributeError) -> bool:
    """Whether ``exc`` is redis-py's connection used after a slot-map refresh closed it
    (its reader or writer is None): raised from inside ``redis.asyncio.connection``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == "redis.asyncio.connection"


def _word(arg: Any) -> str:
    """An option word as text (redis-py writes its own option words as bytes)."""
    return (arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)).upper()


def cluster_client(nodes: Sequence[tuple[str, int]], **settings: Any) -> RedisCluster:
    """The cluster client over the startup ``nodes`` with ``settings`` (the plain client's
    options, TLS and credentials); the fixes of the module's docstring applied."""
    client = _RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RETRIES),
        **settings,
    )
    client.nodes_manager = _NodesManager.replacing(client.nodes_manager, nodes)
    client._sources = {}
    for command, callback in list(client.response_callbacks.items()):
        client.set_response_callback(command, _without_keys(callback))
    return client


def _without_keys(callback: Callable[..., Any]) -> Callable[..., Any]:
    def parse(response: Any, **options: Any) -> Any:
        options.pop("keys", None)
        return callback(response, **options)

    return parse
