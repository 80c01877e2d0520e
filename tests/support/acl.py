"""The ACL rule of docs/security.md for a user confined to one stream prefix: the
integration and service tests both run under it, so the document, the rule and what
printery really sends cannot drift apart."""

from __future__ import annotations

ACL_COMMANDS = (
    "-@all +ping +client|setname +client|setinfo"
    " +xreadgroup +xadd +xack +xautoclaim +xclaim +xpending +xgroup|create +xinfo|groups"
    " +xinfo|consumers +xgroup|delconsumer +xgroup|destroy +xrange +xrevrange +xread +xdel +xlen +xtrim +time +type"
    " +eval +evalsha +script|load +exists +get +set +mget +del"
    " +hset +hsetnx +hgetall +hmget +sadd +smismember +expire +pexpire"
    " +zadd +zrangebyscore +zrem +zrange +zrevrange +zremrangebyscore +zcard +zscore"
    " +hincrbyfloat +hincrby +hget +hdel +hvals +zmscore +smembers"
    " +multi +exec +discard +watch +unwatch"
)


def acl_rule(prefix: str, password: str) -> list[str]:
    """``ACL SETUSER <user>`` arguments: keys under the prefix only (no script is ever
    passed an empty key name), no pub/sub, and the commands above."""
    return ["on", f">{password}", "resetkeys", f"~{prefix}:*", "resetchannels",
            *ACL_COMMANDS.split()]


def acl_denials(log: object, user: str) -> list[object]:
    """The ``ACL LOG`` entries of ``user`` (commands or keys the rule refused)."""
    entries = log if isinstance(log, list) else []
    return [entry for entry in entries if _field(entry, "username") == user]


def _field(entry: object, name: str) -> object:
    if isinstance(entry, dict):
        return entry.get(name)
    if isinstance(entry, list):
        return dict(zip(entry[::2], entry[1::2], strict=False)).get(name)
    return None
