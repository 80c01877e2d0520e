"""Cluster URLs (docs/reference.md, Partitions): their node lists, what a bad one is told,
and where a stream read's keys are (routed without asking the server)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from printery.base.errors import ConfigError
from printery.servers.process import free_port
from printery.settings.config import Settings
from printery.settings.config_load import load_settings
from printery.transport.cluster import stream_read_keys
from printery.transport.connection import cluster_nodes, connect


def test_cluster_url_nodes_and_the_url_every_node_is_reached_with() -> None:
    nodes, first = cluster_nodes("rediss+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001/0?ssl_cert_reqs=none")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert first == "rediss://u:pw@10.0.0.1:7000?ssl_cert_reqs=none"
    assert cluster_nodes("redis+cluster://[::1]:7000")[0] == [("::1", 7000)]


@pytest.mark.parametrize(("url", "why"), [
    ("redis+cluster://", "'' is not HOST:PORT"),
    ("redis+cluster://a:1,b", "'b' is not HOST:PORT"),
    ("redis+cluster://a:99999", "'a:99999' is not HOST:PORT"),
    ("redis+cluster://a:1/2", "one database"),
])
def test_a_bad_cluster_url_is_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises((ConfigError, ValueError)) as refused:
        Settings(redis_url=url)
    assert "redis+cluster://HOST:PORT[,HOST:PORT...]" in str(refused.value)
    assert why in str(refused.value)


def test_a_cluster_url_is_accepted_and_redacted() -> None:
    settings = Settings(redis_url="redis+cluster://:secret@127.0.0.1:7000,127.0.0.1:7001")
    assert settings.redacted_redis_url == "redis+cluster://:***@127.0.0.1:7000,127.0.0.1:7001"
    assert "secret" in settings.secrets({})


def test_stream_read_keys_from_the_arguments() -> None:
    args = ("GROUP", "g", "c", "COUNT", 10, "BLOCK", 1000, "STREAMS", "a", "b", ">", ">")
    assert stream_read_keys("XREADGROUP", args) == ["a", "b"]
    assert stream_read_keys("XREAD", ("COUNT", 5, "STREAMS", "k", "0-0")) == ["k"]
    # as redis-py's xreadgroup() writes them: option words in bytes
    as_sent = (b"GROUP", "g", "c", b"COUNT", "10", b"BLOCK", "5", b"STREAMS", "s", ">")
    assert stream_read_keys("XREADGROUP", as_sent) == ["s"]
    assert stream_read_keys("XREADGROUP", ("GROUP", "g", "c", "NOACK", "STREAMS", "k", ">")) == ["k"]
    assert stream_read_keys("XREAD", ("STREAMS", "a", "b", "0")) is None  # odd: ask the server
    assert stream_read_keys("XREAD", ("WHATEVER", "STREAMS", "a", "0")) is None


def test_one_partition_on_a_cluster_is_refused_naming_the_setting() -> None:
    """One partition keeps the unpartitioned keys, without a hash tag: CROSSSLOT on a
    cluster. No setting is the recorded layout, read from the server (issue 31)."""
    with pytest.raises(ConfigError) as refused:
        load_settings({"redis_url": "redis+cluster://127.0.0.1:7000"}, {"PRINTERY_PARTITIONS": "1"})
    assert "transport.partitions" in str(refused.value) and "2 or more on a cluster" in str(refused.value)
    env = {"PRINTERY_PARTITIONS": "3"}
    assert load_settings({"redis_url": "redis+cluster://127.0.0.1:7000"}, env).transport.partitions == 3
    assert load_settings({"redis_url": "redis+cluster://127.0.0.1:7000"}, {}).transport.partitions is None
    assert load_settings({"redis_url": "redis://127.0.0.1:7000"}, {}).transport.partitions is None


async def test_an_unreachable_cluster_is_a_connection_error() -> None:
    """What every caller already waits out and retries (a server that is down), not
    redis-py's RedisClusterException."""
    client = connect(f"redis+cluster://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(RedisConnectionError, match="cluster unavailable"):
            await client.ping()
    finally:
        await client.aclose()
