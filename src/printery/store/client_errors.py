"""The client library's errors, under the names the rest of printery catches them by:
code above the store says what it means to catch (the server refused a command, a watched
key changed) without importing redis-py.

``ServerError`` is anything the server answered with or the client raised;
``CommandRefused`` an error reply to one command (a wrong type, NOGROUP, an ACL refusal);
``WatchConflict`` a ``WATCH``-ed key that changed before ``EXEC`` (try the transaction
again). Whether the server is reachable at all is :func:`printery.store.outage.unreachable`.
"""

from __future__ import annotations

from redis.exceptions import RedisError as ServerError
from redis.exceptions import ResponseError as CommandRefused
from redis.exceptions import WatchError as WatchConflict

__all__ = ["CommandRefused", "ServerError", "WatchConflict"]
