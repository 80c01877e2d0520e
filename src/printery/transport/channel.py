"""The wire channel: the only code that touches redis-py's internals.

Why a channel of our own: redis-py's asyncio client packs every argument in Python
(about a microsecond each), takes a pooled connection, checks its health and polls its
socket per round trip. A commit carries some twenty arguments per entry, so on the hot
path that was the largest single cost. :class:`DirectChannel` packs in C (hiredis) and
writes on a connection of its own; replies are parsed by the client's own parser.

Everything here that reaches past redis-py's public API is named in one place, so that
moving the client pin means reading this module only: ``connection_pool``'s
``connection_kwargs`` and ``connection_class``, a connection's ``send_packed_command``,
``read_response``, ``encoder`` and ``_parser._reader`` (hiredis's reader, skipped through
for replies we do not need), and ``NOT_ENOUGH_DATA``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError

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


@functools.cache
def _sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


class DirectChannel:
    """Transactions over a connection of its own, packed in C by hiredis.

    Not coroutine-safe: one caller at a time (the committer and the record lookup each
    own one). A failed round trip drops the connection (the next call reconnects), so a
    reply can never be read as another call's. Connection errors raise as the client's
    own (``ConnectionError``, ``TimeoutError``).
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._conn: AbstractConnection | None = None
        self._timeout: float | None = None

    async def transactions(self, transactions: Sequence[Sequence[Command]]) -> list[Any]:
        """Send transactions (each its commands, ``MULTI`` first and ``EXEC`` last) in one
        write; for each, what ``EXEC`` returned, or the :class:`ResponseError` that failed
        it (``EXECABORT``: nothing of it ran)."""
        conn = await self._connection()
        packed = b"".join(self._pack(command) for commands in transactions for command in commands)
        try:
            await conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            async with self._deadline():
                for commands in transactions:
                    await self._skip(conn, len(commands) - 1)  # +OK, then +QUEUED per command
                    try:
                        executed = await conn.read_response()
                    except ResponseError as exc:
                        replies.append(exc)
                        continue
                    if not isinstance(executed, list) or len(executed) != len(commands) - 2:
                        replies.append(ResponseError(f"transaction not executed: {executed!r}"))
                    else:
                        replies.append(executed)
            return replies
        except BaseException:
            # Cancelled or failed mid-reply: the rest of the replies would be read as the
            # next call's. Drop the connection.
            await self.close()
            raise

    async def commands(self, commands: Sequence[Command]) -> list[Any]:
        """Send commands (no transaction) in one write; each one's reply, or the
        :class:`ResponseError` it answered with."""
        conn = await self._connection()
        packed = b"".join(self._pack(command) for command in commands)
        try:
            await conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            async with self._deadline():
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            return replies
        except BaseException:
            await self.close()  # the unread replies would be read as the next call's
            raise

    async def scripts(self, source: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run the Lua ``source`` once per ``(keys, args)`` of ``calls``, by its SHA, in one
        write; each run's reply or error. A server that does not know the script (a
        restart) gets it loaded and the calls again: a call refused with NOSCRIPT did not
        run, so sending it again is safe."""
        sha = _sha(source)
        commands = [("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls]
        replies = await self.commands(commands)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            await self.client.script_load(source)
            replies = await self.commands(commands)
        return replies

    async def close(self) -> None:
        """Close the connection (made with the pool's settings but never in the pool: a
        call cancelled mid-reply cannot hand anyone a connection with a reply unread)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)

    async def _skip(self, conn: AbstractConnection, count: int) -> None:
        """Consume ``count`` replies unread (a queued command's error shows again as
        EXECABORT). Replies already received are taken from the hiredis reader directly:
        through ``read_response`` each costs about a microsecond."""
        parser = getattr(conn, "_parser", None)
        reader: Any = getattr(parser, "_reader", None)
        if _hiredis_reader is None or not isinstance(reader, _hiredis_reader):
            reader = None
        while count:
            if reader is not None and reader.gets() is not _NOT_ENOUGH_DATA:
                count -= 1
                continue
            with contextlib.suppress(ResponseError):
                await conn.read_response()
            count -= 1

    async def _connection(self) -> AbstractConnection:
        if self._conn is None:
            # The pool's settings, less the socket timeout: with one, redis-py wraps every
            # write in ``asyncio.wait_for`` (a task per write on Python 3.11); the replies
            # of a round trip are bounded by it instead (:meth:`_deadline`).
            pool: Any = self.client.connection_pool
            settings = dict(pool.connection_kwargs)
            self._timeout = settings.get("socket_timeout")
            settings["socket_timeout"] = None
            self._conn = cast(AbstractConnection, pool.connection_class(**settings))
        return self._conn

    def _deadline(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The client's socket timeout over all the replies of one round trip; one bound
        per round trip, not per reply (each ``asyncio.timeout`` schedules a timer)."""
        if self._timeout is None:
            return contextlib.nullcontext()
        return asyncio.timeout(self._timeout)

    def _pack(self, command: Command) -> bytes:
        assert self._conn is not None
        if _hiredis_pack is not None:
            try:
                return _hiredis_pack(command)
            except UnicodeEncodeError:
                # hiredis encodes text as strict UTF-8; text that is not (binary fields
                # read with ``encoding_errors``) is encoded as the client would encode it.
                encode = self._conn.encoder.encode
                return _hiredis_pack(tuple(encode(arg) for arg in command))  # type: ignore[no-untyped-call]
        return b"".join(self._conn.pack_command(*command))
