"""Connections to the server: one pooled asyncio client per process, settings chosen for
streams (blocking reads need their own connections; timeouts exceed the block time).

A ``redis+cluster://`` or ``rediss+cluster://`` URL (docs/reference.md, Partitions) gives
redis-py's cluster client instead (:mod:`printery.transport.cluster`): it follows
MOVED/ASK and refreshes its slot map after a failover. It has the command methods of the
plain client, so the rest of printery takes either as :class:`redis.asyncio.Redis`; the
few places that must know (one slot per command, the wire channel, SCAN per master) ask
:func:`printery.transport.streams.one_slot`.
"""

from __future__ import annotations

from typing import Any, TypeAlias, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection, parse_url

from printery.transport.cluster import cluster_client

#: The client every module above the transport takes (plain or cluster, see above): named
#: here so that only ``transport/`` and ``store/`` import redis-py.
Redis: TypeAlias = aioredis.Redis

#: The client library and its version, as reports name it.
CLIENT_LIBRARY = f"redis-py {redis.__version__}"

#: Cluster scheme -> the scheme of one node.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str]:
    """The startup nodes of a cluster URL and the URL of its first node (its scheme,
    credentials, path and query: what every node is reached with). ``ValueError`` says
    what is wrong with the URL."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a cluster URL (redis+cluster:// or rediss+cluster://): {parts.scheme}://")
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for address in hosts.split(","):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster node {address.strip()!r} is not HOST:PORT")
        nodes.append((host.strip("[]"), int(port)))
    if parts.path not in ("", "/", "/0"):
        raise ValueError("a cluster has one database: the path may only be /0")
    first = f"{CLUSTER_SCHEMES[parts.scheme]}://{auth + '@' if auth else ''}{hosts.split(',')[0].strip()}"
    return nodes, first + (f"?{parts.query}" if parts.query else "")


def connect(url: str, *, max_connections: int = 256, block_ms: int = 1000) -> aioredis.Redis:
    """A pooled client for ``url`` (``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://``, ``rediss+cluster://``).

    Replies are decoded to ``str`` (hiredis does it in C). The socket timeout is kept
    above the blocking-read time so a quiet stream is not mistaken for a dead server; no
    connection is made until the first command.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "max_connections": max_connections,
        "socket_timeout": block_ms / 1000 + 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
        "encoding_errors": "surrogateescape",
    }
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return _connect_cluster(url, options)
    options["retry_on_timeout"] = False
    if scheme != "unix":
        # TCP only: redis-py's unix-socket connection refuses the keyword (a TypeError
        # at the first command), and a local socket has no idle peer to detect.
        options["socket_keepalive"] = True
    client: aioredis.Redis = aioredis.Redis.from_url(url, **options)
    return client


def connect_bare(url: str) -> aioredis.Redis:
    """A client with redis-py's own defaults (bytes replies, no socket timeouts, nothing
    checked between commands): what a relay hand-written on redis-py uses, so that the
    bench measures its ceilings as one is measured (each of those settings costs a little
    per command: the timeout a context around every read, the decoding every field)."""
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        return _connect_cluster(url, {"decode_responses": False})
    client: aioredis.Redis = aioredis.Redis.from_url(url)
    return client


def _connect_cluster(url: str, options: dict[str, Any]) -> aioredis.Redis:
    """The cluster client over the URL's nodes, with the URL's credentials and TLS
    options applied to every node (``max_connections`` is per node)."""
    nodes, first = cluster_nodes(url)
    settings: dict[str, Any] = dict(parse_url(first))
    for name in ("host", "port", "db", "path"):
        settings.pop(name, None)
    if settings.pop("connection_class", None) is SSLConnection:
        settings["ssl"] = True
    client = cluster_client(nodes, socket_keepalive=True, **{**settings, **options})
    # Same command methods as the plain client (see the module's docstring).
    return cast(aioredis.Redis, client)
