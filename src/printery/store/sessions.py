"""Console sessions kept in the server: one key per session, alive for the session's
max age.

A key per open session rather than a list of revoked ones: logging out deletes one key,
an expired session's key goes by itself (its TTL), nothing grows, and every process
serving the console (the parent of ``--processes``, two replicas behind a balancer)
sees a logout at once, which a memory of its own could not. The key holds nothing
secret: the cookie that names it is signed by the service (:mod:`printery.service.access`),
so a session id nobody signed never reaches this module.
"""

from __future__ import annotations

import math

from printery.transport.connection import Redis
from printery.wire.keys import StreamKeys

__all__ = ["end_session", "open_session", "session_open"]


async def open_session(client: Redis, keys: StreamKeys, session_id: str, ttl: float) -> None:
    """Record ``session_id`` as open for ``ttl`` seconds."""
    await client.set(keys.console_session(session_id), "1",
                     px=max(1, math.ceil(ttl * 1000)))


async def session_open(client: Redis, keys: StreamKeys, session_id: str) -> bool:
    """Whether ``session_id`` is open: neither logged out nor past its max age."""
    return bool(await client.exists(keys.console_session(session_id)))


async def end_session(client: Redis, keys: StreamKeys, session_id: str) -> None:
    """Close ``session_id`` for every process (logging out)."""
    await client.delete(keys.console_session(session_id))
