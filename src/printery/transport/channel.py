"""The wire channel: with :mod:`printery.transport.cluster`, the only code that touches
redis-py's internals.

Why a channel of our own: redis-py's asyncio client packs every argument in Python
(about a microsecond each), takes a pooled connection, checks its health and polls its
socket per round trip. A commit carries some twenty arguments per entry, so on the hot
path that was the largest single cost. :class:`DirectChannel` packs in C (hiredis) and
writes on a connection of its own; replies are parsed by the client's own parser.

Everything here that reaches past redis-py's public API is named in one place, so that
moving the client pin means reading this module only: ``connection_pool``'s
``connection_kwargs`` and ``connection_class``, a connection's ``send_packed_command``,
``read_response``, ``encoder``, ``_parser._reader`` (hiredis's reader, skipped through
for replies we do not need) and ``_reader``/``_writer`` (its asyncio streams, asked whether
the server closed it), and ``NOT_ENOUGH_DATA``; on a cluster, a ``ClusterNode``'s
``connection_kwargs`` and ``connection_class`` and the client's ``nodes_manager``
(``get_node_from_slot``, ``initialize``).

On a cluster (docs/reference.md, Partitions) each command or transaction goes to the
master holding the slot of its first key, on a connection of the channel's own per node;
callers keep the keys of one transaction in one slot (the partition's hash tag). A refusal
that means "not here, not now" (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) ran nothing: the slot
map is read again and those are sent again, a few times; then they raise as a connection
error, which every caller already waits out and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from printery.transport.scripts import Script

try:
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - only the hiredis parser has the reader we skip with
    _NOT_ENOUGH_DATA = object()

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
_hiredis_reader: type | None
try:
    from hiredis import Reader as _hiredis_reader
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency; this keeps a bare install working
    _hiredis_pack = None
    _hiredis_reader = None

#: One command: its name and arguments.
Command = tuple[Any, ...]

#: Replies of a cluster node meaning the command did not run there now.
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)
#: Rounds of "read the slot map again and resend" before a redirect raises.
_REDIRECT_ROUNDS = 4
#: Seconds between checks whether a master has a replica (``WAIT`` after submits).
_REPLICA_CHECK = 10.0


class DirectChannel:
    """Transactions over a connection of its own, packed in C by hiredis.

    Not coroutine-safe: one caller at a time (the committer and the record lookup each
    own one). A failed round trip drops the connection (the next call reconnects), so a
    reply can never be read as another call's. Connection errors raise as the client's
    own (``ConnectionError``, ``TimeoutError``).
    """

    def __init__(self, client: aioredis.Redis, *, preload: Sequence[Script] = ()) -> None:
        self.client = client
        cluster: object = client
        self._cluster = cluster if isinstance(cluster, RedisCluster) else None
        self._conns: dict[str, AbstractConnection] = {}
        #: Scripts every connection loads (``SCRIPT LOAD``, in its first write) before it
        #: sends anything else, so that a transaction can run them by SHA.
        self._preload = [("SCRIPT", "LOAD", script.source) for script in preload]
        #: Node names ("" on one server) whose connection has not loaded them yet.
        self._unloaded: set[str] = set()
        self._timeout: float | None = None
        #: Rounds sent with ``WAIT`` that no replica confirmed in time (see :meth:`commands`).
        self.unreplicated = 0
        #: Node name ("" on one server) -> (when asked, its connected replicas).
        self._replicas: dict[str, tuple[float, int]] = {}

    async def transactions(self, transactions: Sequence[Sequence[Command]]) -> list[Any]:
        """Send transactions (each its commands, ``MULTI`` first and ``EXEC`` last) in one
        write; for each, what ``EXEC`` returned, or the :class:`ResponseError` that failed
        it (``EXECABORT``: nothing of it ran; on a cluster, the redirect that did)."""
        if self._cluster is None:
            return await self._transactions_on(None, transactions)
        return await self._routed(transactions, self._transactions_on, _transaction_key)

    async def commands(self, commands: Sequence[Command], *, replicated: float = 0.0,
                       blocking: float = 0.0) -> list[Any]:
        """Send commands (no transaction) in one write; each one's reply, or the
        :class:`ResponseError` it answered with. ``replicated`` > 0: each node whose
        writes have a replica is also sent ``WAIT 1`` with that many seconds, on the same
        connection, so the replies come once a replica has the writes (or the time is up:
        :attr:`unreplicated` counts those rounds). ``blocking`` (without ``replicated``):
        the seconds a command may block on the server (``BLOCK``), added to the wait for
        the replies."""
        if replicated <= 0:
            plain = functools.partial(self._commands_on, blocking=blocking)
            if self._cluster is None:
                return await plain(None, commands)
            return await self._routed(commands, plain, _command_key)

        async def send(node: ClusterNode | None, batch: Sequence[Command]) -> list[Any]:
            if not await self._has_replica(node):
                return await self._commands_on(node, batch)
            wait = ("WAIT", 1, max(1, int(replicated * 1000)))
            *replies, acked = await self._commands_on(node, [*batch, wait])
            if not isinstance(acked, int) or acked < 1:
                self.unreplicated += 1
            return replies

        if self._cluster is None:
            return await send(None, commands)
        return await self._routed(commands, send, _command_key)

    async def _has_replica(self, node: ClusterNode | None) -> bool:
        """Whether ``node`` (None: the one server) has a replica to wait for (one in sync:
        ``online``), from its ``INFO replication``, asked again every :data:`_REPLICA_CHECK` seconds (the slot
        map lists a replica only once every node sees it in sync, and is not read again
        when one joins)."""
        name = node.name if node is not None else ""
        checked, replicas = self._replicas.get(name, (float("-inf"), 0))
        now = time.monotonic()
        if now >= checked + _REPLICA_CHECK:
            client: Any = self.client
            try:
                info = await (client.info("replication") if node is None
                              else client.info("replication", target_nodes=node))
            except ResponseError:  # an ACL without INFO: nothing known to wait for
                info = {}
            # Replicas still in their first sync cannot confirm anything yet.
            replicas = sum(1 for key, value in info.items() if key.startswith("slave")
                           and isinstance(value, dict) and value.get("state") == "online")
            self._replicas[name] = (now, replicas)
        return replicas > 0

    def forget_scripts(self) -> None:
        """The server forgot its scripts (``SCRIPT FLUSH``; a restart or a failover comes
        with a new connection anyway): every connection loads them again first thing."""
        self._unloaded.update(self._conns)

    async def _transactions_on(
        self, node: ClusterNode | None, transactions: Sequence[Sequence[Command]]
    ) -> list[Any]:
        conn = await self._connection(node)
        loads = self._loads(node)
        packed = b"".join(self._pack(conn, command) for commands in (loads, *transactions)
                          for command in commands)
        try:
            await conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            async with self._deadline():
                await self._loaded(conn, node, len(loads))
                for commands in transactions:
                    # +OK, then +QUEUED per command (or the refusal of one)
                    refused = await self._skip(conn, len(commands) - 1)
                    try:
                        executed = await conn.read_response()
                    except ResponseError as exc:
                        replies.append(refused if isinstance(refused, _REDIRECTS) else exc)
                        continue
                    if not isinstance(executed, list) or len(executed) != len(commands) - 2:
                        replies.append(ResponseError(f"transaction not executed: {executed!r}"))
                    else:
                        replies.append(executed)
            return replies
        except BaseException:
            # Cancelled or failed mid-reply: the rest of the replies would be read as the
            # next call's. Drop the connection.
            await self._drop(node)
            raise

    async def _commands_on(self, node: ClusterNode | None, commands: Sequence[Command],
                           blocking: float = 0.0) -> list[Any]:
        conn = await self._connection(node)
        loads = self._loads(node)
        packed = b"".join(self._pack(conn, command) for command in (*loads, *commands))
        try:
            await conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            async with self._deadline(blocking):
                await self._loaded(conn, node, len(loads))
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            return replies
        except BaseException:
            await self._drop(node)  # the unread replies would be read as the next call's
            raise

    async def scripts(self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
                      *, replicated: float = 0.0) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` of ``calls``, by its SHA, in one
        write; each run's reply or error (``replicated``: as :meth:`commands`). A server
        that does not know the script (a restart) gets it loaded and the calls again: a
        call refused with NOSCRIPT did not run, so sending it again is safe."""
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
        replies = await self.commands(commands, replicated=replicated)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            await self.client.script_load(script.source)
            replies = await self.commands(commands, replicated=replicated)
        return replies

    async def close(self) -> None:
        """Close the connections (made with the pool's settings but never in the pool: a
        call cancelled mid-reply cannot hand anyone a connection with a reply unread)."""
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.disconnect(nowait=True)

    async def _drop(self, node: ClusterNode | None) -> None:
        conn = self._conns.pop(node.name if node is not None else "", None)
        if conn is not None:
            await conn.disconnect(nowait=True)

    async def _routed(
        self, items: Sequence[Any],
        send: Callable[[ClusterNode, Sequence[Any]], Awaitable[list[Any]]],
        key_of: Callable[[Any], str | None],
    ) -> list[Any]:
        """Send each item to the master of its key's slot (one write per node, the nodes
        at once); items refused with a redirect go again after the slot map is read again.
        A node that fails the round trip fails the call (callers retry; what the others
        answered is dropped with it) after the map is read again for the retry."""
        replies: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        for _ in range(_REDIRECT_ROUNDS):
            groups: dict[str, tuple[ClusterNode, list[int]]] = {}
            for i in todo:
                node = await self._node(key_of(items[i]))
                groups.setdefault(node.name, (node, []))[1].append(i)
            answers = await asyncio.gather(
                *(send(node, [items[i] for i in indexes]) for node, indexes in groups.values()),
                return_exceptions=True)
            failed = next((a for a in answers if isinstance(a, BaseException)), None)
            if failed is not None:
                await self._refresh()
                raise failed
            todo = []
            for (_, indexes), answer in zip(groups.values(), answers, strict=True):
                for i, reply in zip(indexes, cast(list[Any], answer), strict=True):
                    replies[i] = reply
                    if isinstance(reply, _REDIRECTS):
                        todo.append(i)
            if not todo:
                return replies
            await self._refresh()
            await asyncio.sleep(0.05)
        raise RedisConnectionError(f"cluster kept redirecting: {replies[todo[0]]}")

    async def _node(self, key: str | None) -> ClusterNode:
        cluster = cast(RedisCluster, self._cluster)
        await cluster.initialize()  # a no-op once the slot map is read
        if key is None:
            return cluster.get_default_node()
        return cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key))

    async def _refresh(self) -> None:
        """Read the slot map again (after a failover the replica holds the slots). A
        cluster that cannot answer is a connection error: callers wait and retry."""
        cluster = cast(RedisCluster, self._cluster)
        try:
            await cluster.nodes_manager.initialize()
        except RedisClusterException as exc:
            raise RedisConnectionError(f"cluster slot map unavailable: {exc}") from exc

    def _loads(self, node: ClusterNode | None) -> list[Command]:
        """The ``SCRIPT LOAD``s a write to ``node`` starts with (none once loaded)."""
        return self._preload if (node.name if node is not None else "") in self._unloaded else []

    async def _loaded(self, conn: AbstractConnection, node: ClusterNode | None, count: int) -> None:
        """Read the replies of ``count`` ``SCRIPT LOAD``s; a refused one raises (an ACL
        without ``script|load``: docs/security.md), and the write fails with it."""
        if not count:
            return
        refused = await self._skip(conn, count)
        if refused is not None:
            raise refused
        self._unloaded.discard(node.name if node is not None else "")

    async def _skip(self, conn: AbstractConnection, count: int) -> ResponseError | None:
        """Consume ``count`` replies unread (a queued command's error shows again as
        EXECABORT); the first error among them. Replies already received are taken from
        the hiredis reader directly: through ``read_response`` each costs about a
        microsecond."""
        parser = getattr(conn, "_parser", None)
        reader: Any = getattr(parser, "_reader", None)
        if _hiredis_reader is None or not isinstance(reader, _hiredis_reader):
            reader = None
        first: ResponseError | None = None
        while count:
            count -= 1
            if reader is not None:
                reply = reader.gets()
                if reply is not _NOT_ENOUGH_DATA:
                    if first is None and isinstance(reply, ResponseError):
                        first = reply
                    continue
            try:
                await conn.read_response()
            except ResponseError as exc:
                first = first or exc
        return first

    async def _connection(self, node: ClusterNode | None) -> AbstractConnection:
        name = node.name if node is not None else ""
        conn = self._conns.get(name)
        if conn is not None and _closed_by_server(conn):
            # The server went away since the last round trip (a restart, a failover): the
            # pool checks a connection before handing it out, so does the channel, else
            # the first round trip after a restart fails a caller that did nothing wrong.
            await self._drop(node)
            conn = None
        if conn is None:
            # The pool's settings, less the socket timeout: with one, redis-py wraps every
            # write in ``asyncio.wait_for`` (a task per write on Python 3.11); the replies
            # of a round trip are bounded by it instead (:meth:`_deadline`).
            pool: Any = node if node is not None else self.client.connection_pool
            settings = dict(pool.connection_kwargs)
            self._timeout = settings.get("socket_timeout")
            settings["socket_timeout"] = None
            conn = self._conns[name] = cast(AbstractConnection, pool.connection_class(**settings))
            if self._preload:
                self._unloaded.add(name)
        return conn

    def _deadline(self, blocking: float = 0.0) -> contextlib.AbstractAsyncContextManager[Any]:
        """The client's socket timeout over all the replies of one round trip (plus what a
        blocking command may wait): one bound per round trip, not per reply."""
        if self._timeout is None:
            return contextlib.nullcontext()
        return _Deadline(self._timeout + blocking)

    @staticmethod
    def _pack(conn: AbstractConnection, command: Command) -> bytes:
        if _hiredis_pack is not None:
            try:
                return _hiredis_pack(command)
            except UnicodeEncodeError:
                # hiredis encodes text as strict UTF-8; text that is not (binary fields
                # read with ``encoding_errors``) is encoded as the client would encode it.
                encode = conn.encoder.encode
                return _hiredis_pack(tuple(encode(arg) for arg in command))  # type: ignore[no-untyped-call]
        return b"".join(conn.pack_command(*command))


def _closed_by_server(conn: AbstractConnection) -> bool:
    """Whether the server ended ``conn`` while it sat idle between round trips (its end of
    file or a reset came in): nothing sent on it could reach a server. Attribute reads only,
    no round trip: the channel is on the hot path."""
    reader: Any = getattr(conn, "_reader", None)
    writer: Any = getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return False  # not connected yet (or dropped): redis-py connects it on the next send
    return bool(reader.at_eof() or reader.exception() is not None or writer.is_closing())


class _Deadline:
    """Bounds one round trip like ``asyncio.timeout``, but without a timer of its own:
    one check per event loop and second (:class:`_Overdue`) cancels the task of a round
    trip past its deadline, which then raises :class:`TimeoutError`. A timer scheduled
    and cancelled per round trip cost a tenth of a worker's CPU at one entry per round
    trip; the deadline is the socket timeout (seconds), so a second's slack is nothing."""

    __slots__ = ("at", "expired", "overdue", "task")

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self.task: asyncio.Task[Any] | None = None
        self.overdue: _Overdue | None = None

    async def __aenter__(self) -> None:
        self.task = asyncio.current_task()
        self.overdue = _Overdue.of(asyncio.get_running_loop())
        self.overdue.waiting.add(self)

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.overdue is not None:
            self.overdue.waiting.discard(self)
        if self.expired and exc_type is asyncio.CancelledError and self.task is not None \
                and self.task.uncancel() == 0:
            raise TimeoutError("no reply from the server within the socket timeout")


class _Overdue:
    """The round trips of one event loop in flight, looked at once a second while any is."""

    _loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Overdue] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: set[_Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Overdue:
        overdue = cls._loops.get(loop)
        if overdue is None:
            overdue = cls._loops[loop] = cls(loop)
        if overdue._timer is None:
            overdue._timer = loop.call_later(1.0, overdue._check)
        return overdue

    def _check(self) -> None:
        now = time.monotonic()
        for deadline in list(self.waiting):
            if now >= deadline.at and not deadline.expired and deadline.task is not None:
                deadline.expired = True
                deadline.task.cancel()
        self._timer = self.loop.call_later(1.0, self._check) if self.waiting else None


def _command_key(command: Command) -> str | None:
    """The key a command is routed by on a cluster: a script's first key, else the first
    argument (every command the channel sends names its key first)."""
    name = str(command[0]).upper()
    if name in ("EVAL", "EVALSHA"):
        return str(command[3]) if int(command[2]) > 0 else None
    if name in ("XREADGROUP", "XREAD"):
        return str(command[[str(arg).upper() for arg in command].index("STREAMS") + 1])
    if name in ("MULTI", "EXEC") or len(command) < 2:
        return None
    return str(command[1])


def _transaction_key(commands: Sequence[Command]) -> str | None:
    return next((key for key in map(_command_key, commands) if key is not None), None)
