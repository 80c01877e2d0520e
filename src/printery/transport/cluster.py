"""redis-py's asyncio cluster client, as printery needs it on a failover.

Like :mod:`printery.transport.channel`, this module reaches past redis-py's public API,
and names what it reaches for so that moving the client pin means reading it: the
client's ``_determine_slot`` and ``response_callbacks``, the ``NodesManager`` and its
``update_moved_exception``. Each is a defect of redis-py 6.4 met in the cluster chaos run
(tests/chaos/cluster.py), fixed here rather than worked around in every caller:

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException

#: Attempts of a command the cluster client refused or lost its node for, with a backoff
#: capped at half a second: enough to ride out a master failover (node timeout plus
#: election, a few seconds) without the caller seeing it.
RETRIES = 12

_STREAM_READS = ("XREADGROUP", "XREAD")


class _NodesManager(NodesManager):
    __slots__ = ()

    def update_moved_exception(self, exception: Exception) -> None:
        if isinstance(exception, MovedError):
            super().update_moved_exception(exception)  # type: ignore[no-untyped-call]


class _RedisCluster(RedisCluster):
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
    client.nodes_manager.__class__ = _NodesManager
    for command, callback in list(client.response_callbacks.items()):
        client.set_response_callback(command, _without_keys(callback))
    return client


def _without_keys(callback: Callable[..., Any]) -> Callable[..., Any]:
    def parse(response: Any, **options: Any) -> Any:
        options.pop("keys", None)
        return callback(response, **options)

    return parse
