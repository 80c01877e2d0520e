"""Redis Streams operations printery relies on, each one documented as a contract.

All functions are coroutine-safe (they take a pooled client) and idempotent where it says.
They know streams, groups and entries; nothing about what the entries mean.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import chain
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

Fields = Mapping[str, str]

#: One entry's part of a commit (:func:`commit_args`): its source stream, consumer and
#: entry id ("" for outputs alone), its idempotency key ("" for none), and its outputs as
#: (stream key, once key or "", fields), in order.
CommitCall = tuple[str, str, str, str, Sequence[tuple[str, str, Fields]]]


def _script(name: str) -> str:
    return resources.files("printery.transport").joinpath(name).read_text()


COMMIT_LUA = _script("commit.lua")
#: What a commit transaction sends (by ``EVAL``, see :func:`commit_commands`): the script
#: without its comment lines and indentation, since the server hashes it on every run.
COMMIT_LUA_WIRE = "\n".join(
    line.strip() for line in COMMIT_LUA.splitlines()
    if line.strip() and not line.strip().startswith("--")
)
LEASE_LUA = _script("lease.lua")
REDELIVER_LUA = _script("redeliver.lua")

FENCED = -1
DUPLICATE = 0


@dataclass(frozen=True, slots=True)
class PendingOutput:
    """One entry to append as part of a commit; ``once_key`` makes it write-at-most-once."""

    stream: str
    fields: Fields
    once_key: str = ""


async def ensure_group(client: aioredis.Redis, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` from id 0 (MKSTREAM). Idempotent: an existing group is
    fine, and starting from 0 means entries published before the first start are seen."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class Scripts:
    """The Lua scripts, loaded lazily by SHA and re-loaded after a server restart."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._sha: dict[str, str] = {}

    async def _sha_of(self, source: str) -> str:
        sha = self._sha.get(source)
        if sha is None:
            sha = str(await self.client.script_load(source))
            self._sha[source] = sha
        return sha

    async def call(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._evalsha(await self._sha_of(source), keys, args)
        except NoScriptError:
            self._sha.pop(source, None)
            return await self._evalsha(await self._sha_of(source), keys, args)

    async def _evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await cast(Awaitable[Any], self.client.evalsha(sha, len(keys), *keys, *args))

    async def commit(self, run: CommitRun) -> list[Any]:
        """Run one commit transaction (:func:`commit_commands`) over the pooled client;
        each entry's result, or the exception of an entry that could not commit."""
        pipe = self.client.pipeline(transaction=True)  # adds MULTI and EXEC itself
        for command in commit_commands(run)[1:-1]:
            pipe.execute_command(*command)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        decided = results[-1]
        if isinstance(decided, Exception):
            raise decided
        return commit_results(run, decided)


class DirectChannel:
    """Transactions over a connection of their own, packed in C by hiredis.

    Why not the client: redis-py's asyncio client packs every argument in Python (about
    a microsecond each), takes a pooled connection, checks its health and polls its
    socket per round trip. A batch commit carries some thirty arguments per entry, so on
    the hot path that was the largest single cost. Replies are parsed by the client's own
    parser (hiredis). (Reads stay on the pooled client: see docs/performance.md, "tried
    and dropped".)

    Not coroutine-safe: one caller at a time (the group committer and the record lookup
    each own one). A failed round trip drops the connection (the next call reconnects),
    so a reply can never be read as another call's.
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._conn: AbstractConnection | None = None
        self._timeout: float | None = None

    async def transact_many(self, transactions: Sequence[Sequence[tuple[Any, ...]]]) -> list[Any]:
        """Transactions (each its commands, ``MULTI`` first and ``EXEC`` last) in one write;
        for each, the reply of its last command before ``EXEC``, or the
        :class:`ResponseError` that failed it. Connection errors raise."""
        return [executed if isinstance(executed, Exception) else executed[-1]
                for executed in await self.transactions(transactions)]

    async def transactions(self, transactions: Sequence[Sequence[tuple[Any, ...]]]) -> list[Any]:
        """As :meth:`transact_many`, with every reply of each transaction (what ``EXEC``
        returned)."""
        conn = await self._connection()
        packed = b"".join(self._pack(command) for commands in transactions for command in commands)
        await conn.send_packed_command(packed, check_health=False)
        replies: list[Any] = []
        async with self._deadline():
            for commands in transactions:
                await self._skip(conn, len(commands) - 1)  # +OK, then +QUEUED per command
                try:
                    executed = await conn.read_response()
                except ResponseError as exc:  # EXECABORT: nothing of it ran
                    replies.append(exc)
                    continue
                if not isinstance(executed, list) or len(executed) != len(commands) - 2:
                    replies.append(ResponseError(f"transaction not executed: {executed!r}"))
                else:
                    replies.append(executed)
        return replies

    async def _skip(self, conn: AbstractConnection, count: int) -> None:
        """Consume ``count`` replies unread (a queued command's error shows again as
        EXECABORT). Replies already received are taken from the hiredis reader directly:
        through ``read_response`` each costs about a microsecond, and a transaction
        carries one per output."""
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

    async def close(self) -> None:
        """Close the connection (it is the channel's own, made with the pool's settings
        but never in the pool: a call cancelled mid-reply cannot hand anyone a
        connection with a reply still unread)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)

    async def _connection(self) -> AbstractConnection:
        if self._conn is None:
            # The pool's settings, less the socket timeout: with one, redis-py wraps every
            # write in ``asyncio.wait_for`` (a task per write on Python 3.11); reads keep
            # the timeout, applied in :meth:`_read`.
            pool: Any = self.client.connection_pool
            settings = dict(pool.connection_kwargs)
            self._timeout = settings.get("socket_timeout")
            settings["socket_timeout"] = None
            self._conn = cast(AbstractConnection, pool.connection_class(**settings))
        return self._conn

    def _deadline(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The client's socket timeout over all the replies of one round trip (on expiry
        the read is cancelled, which drops the connection as redis-py does, and
        :class:`TimeoutError` is raised). One bound per round trip, not per reply: each
        ``asyncio.timeout`` schedules and cancels a timer, which at one entry per round
        trip cost the relay about a tenth of its time."""
        if self._timeout is None:
            return contextlib.nullcontext()
        return asyncio.timeout(self._timeout)

    def _pack(self, command: tuple[Any, ...]) -> bytes:
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


def record_set(index_key: str, generation: int) -> str:
    """The set that holds a generation's idempotency records (named as commit.lua names it)."""
    return f"{index_key}:r{generation}"


class RecordLookup:
    """Which idempotency keys have a record, read before the handlers run so that a
    duplicate is not handled again (the commit script checks again, atomically).

    Plain ``SMISMEMBER`` in a transaction rather than a script: a script's arguments and
    replies are converted to Lua and back, which cost the server twice as much per key.
    The current generation is remembered; the transaction reads it too, and a lookup made
    against a generation that rotated since is repeated. One lookup at a time.
    """

    def __init__(self, channel: DirectChannel, index_key: str) -> None:
        self.channel = channel
        self.index_key = index_key
        self._generation: int | None = None
        self._lock = asyncio.Lock()

    async def recorded(self, idempotency_keys: Sequence[str]) -> list[bool]:
        """For each key, whether it has a record (in the current or previous generation)."""
        async with self._lock:
            for _ in range(3):
                guess = self._generation
                commands: list[tuple[Any, ...]] = [("MULTI",), ("HMGET", self.index_key, "gen")]
                for generation in (guess, (guess or 0) - 1):
                    if generation is not None and generation >= 1:
                        commands.append(
                            ("SMISMEMBER", record_set(self.index_key, generation), *idempotency_keys))
                commands.append(("EXEC",))
                (executed,) = await self.channel.transactions([commands])
                if isinstance(executed, Exception):
                    raise executed
                (current,), *found = executed
                current = None if current is None else int(current)
                if current == guess:
                    return [any(column[i] for column in found)
                            for i in range(len(idempotency_keys))]
                self._generation = current
                if current is None:
                    return [False] * len(idempotency_keys)
        raise ResponseError(f"idempotency generation of {self.index_key} keeps rotating")


def commit_args(
    *,
    stream: str,
    consumer: str,
    entry_id: str,
    idempotency_key: str | None,
    outputs: Iterable[PendingOutput],
) -> CommitCall:
    """One entry's part of a commit run (see :func:`commit_run`). ``idempotency_key``
    None: no record (dead letters, emits); an empty ``entry_id``: outputs alone, not
    caused by an entry (no ack, no fence)."""
    return commit_args_of(
        stream, consumer, entry_id, idempotency_key,
        [(out.stream, out.once_key, out.fields) for out in outputs],
    )


def commit_args_of(
    stream: str,
    consumer: str,
    entry_id: str,
    idempotency_key: str | None,
    outputs: Sequence[tuple[str, str, Fields]],
) -> CommitCall:
    """:func:`commit_args` from ``(stream, once key, fields)`` triples: the hot path's
    form, which builds no intermediate objects per output."""
    if not entry_id:
        stream = consumer = ""
    return stream, consumer, entry_id, idempotency_key or "", outputs


@dataclass(frozen=True, slots=True)
class CommitRun:
    """The script's keys and arguments for a run of entries (see commit.lua), the outputs
    to append before it (stream key, fields) in order, and each entry's output count."""

    keys: list[str]
    args: list[Any]
    appends: list[tuple[str, Fields]]
    output_counts: list[int]


def commit_run(
    index_key: str, group: str, ttl_ms: int, calls: Sequence[CommitCall]
) -> CommitRun:
    """One commit run over entries (each a :func:`commit_args` call) of ``group``, whose
    idempotency records live under ``index_key`` (``StreamKeys.idempotency_index``) for
    at least ``ttl_ms``. Consecutive entries of the same shape (source, consumer, record
    or not, output streams and once keys) form one segment, whose per-entry values go as
    columns: the script then hands them to its commands whole."""
    keys: list[str] = [index_key]
    args: list[Any] = [group, ttl_ms]
    appends: list[tuple[str, Fields]] = []
    counts: list[int] = []
    segment: list[CommitCall] = []
    shape: tuple[Any, ...] = ()
    for call in calls:
        source, consumer, _, marker, outputs = call
        call_shape = (source, consumer, not marker,
                      *[(out, not once) for out, once, _ in outputs])
        if call_shape != shape and segment:
            _add_segment(keys, args, segment, shape)
            segment = []
        shape = call_shape
        segment.append(call)
        counts.append(len(outputs))
        appends += [(out, fields) for out, _, fields in outputs]
    if segment:
        _add_segment(keys, args, segment, shape)
    return CommitRun(keys, args, appends, counts)


def _add_segment(
    keys: list[str], args: list[Any], segment: list[CommitCall], shape: tuple[Any, ...]
) -> None:
    source, consumer, unmarked, *outputs = shape
    if source:
        # A key is passed only when there is one: never the empty name, which an ACL user
        # confined to its prefix may not touch.
        if source not in keys[1:]:
            keys.append(source)
        position = keys.index(source, 1) + 1
    else:
        position = 0
    args += (position, consumer, len(segment), "0" if unmarked else "1", len(outputs))
    for out, no_once in outputs:
        args += (out, "0" if no_once else "1")
    if source:
        args += [call[2] for call in segment]
    if not unmarked:
        args += [call[3] for call in segment]
    for slot, (_, no_once) in enumerate(outputs):
        if not no_once:
            args += [call[4][slot][1] for call in segment]


def commit_results(run: CommitRun, reply: Any) -> list[Any]:
    """Each entry's result from the script's reply: the entry count when every entry
    committed with all its outputs (each then ``1 +`` its output count), else a list."""
    if isinstance(reply, int):
        if reply != len(run.output_counts):
            raise ResponseError(f"commit decided {reply} entries of {len(run.output_counts)}")
        return [1 + count for count in run.output_counts]
    return cast(list[Any], reply)


def commit_commands(run: CommitRun) -> list[tuple[Any, ...]]:
    """The commands of one commit transaction: ``MULTI``, a plain ``XADD`` per output, the
    commit script (which keeps or withdraws each entry's outputs and acks), ``EXEC``.

    Why not write the outputs from the script: every argument of a script is allocated
    again as a Lua string and again when the script calls ``XADD``, and a run carries
    some twenty per output; that made the script cost the server about four times what
    the ``XADD`` does. ``EVAL`` rather than ``EVALSHA``: a script the server forgot would
    fail inside ``EXEC`` after the ``XADD``s ran (hashing the source costs the server
    well under a microsecond per entry)."""
    keys, args = run.keys, run.args
    commands: list[tuple[Any, ...]] = [("MULTI",)]
    for stream, fields in run.appends:
        commands.append(("XADD", stream, "*", *chain.from_iterable(fields.items())))
    commands.append(("EVAL", COMMIT_LUA_WIRE, len(keys), *keys, *args))
    commands.append(("EXEC",))
    return commands


async def delivery_counts(
    client: aioredis.Redis, stream: str, group: str, ids: Sequence[str]
) -> dict[str, int]:
    """How many times Redis has delivered each pending id (the authoritative count)."""
    if not ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    counts: dict[str, int] = {}
    for entry_id, rows in zip(ids, await pipe.execute(), strict=True):
        if rows:
            counts[entry_id] = int(rows[0]["times_delivered"])
    return counts
