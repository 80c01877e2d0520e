"""The layout lives in the server (docs/reference.md, Partitions, issue 31):
``<prefix>:layout`` is written once by the first worker process (the setting; with none, 3
x the master count on a cluster, 1 on one server), read by every later process, ``Client``
and command; a setting that disagrees is refused naming both counts; a worker that finds
partitioned streams and no record records its setting, and with none refuses to guess."""

from __future__ import annotations

import uuid

import pytest

from printery import Client, Output
from printery.base.errors import ConfigError
from printery.pipeline.dag import Pipeline
from printery.servers.process import ServerProcess
from printery.settings.config_load import load_settings
from printery.store.partitions import read_partitions, resolve_keys
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster

WRITER = "printery-workers test"


def _prefix() -> str:
    return f"layout:{uuid.uuid4().hex[:8]}"


def _settings(url: str, prefix: str, partitions: int | None = None):  # type: ignore[no-untyped-def]
    flags: dict[str, object] = {"redis_url": url, "stream_prefix": prefix}
    if partitions is not None:
        flags["partitions"] = str(partitions)
    return load_settings(flags, {})


async def test_one_server_records_one_and_every_later_process_reads_it(server: ServerProcess) -> None:
    prefix = _prefix()
    client = connect(server.url)
    try:
        # A reader before any worker: its setting or the default, nothing written.
        assert await resolve_keys(client, _settings(server.url, prefix)) == StreamKeys(prefix)
        assert await read_partitions(client, prefix) is None
        assert await resolve_keys(client, _settings(server.url, prefix), writer=WRITER) == StreamKeys(prefix)
        assert await client.hgetall(f"{prefix}:layout") == {
            "partitions": "1", "written_by": WRITER, "source": "one server",
            "written_at": (await client.hget(f"{prefix}:layout", "written_at"))}
        with pytest.raises(ConfigError) as refused:
            await resolve_keys(client, _settings(server.url, prefix, 3), writer=WRITER)
        assert "records 1 partitions, this setting gives 3" in str(refused.value)
        assert await read_partitions(client, prefix) == 1  # written once
    finally:
        await client.aclose()


async def test_the_first_setting_is_recorded_and_read_by_clients_and_commands(server: ServerProcess) -> None:
    prefix = _prefix()
    client = connect(server.url)
    try:
        keys = await resolve_keys(client, _settings(server.url, prefix, 4), writer=WRITER)
        assert keys == StreamKeys(prefix, 4)
        # Later processes with no setting, or the same one, find 4.
        assert await resolve_keys(client, _settings(server.url, prefix), writer=WRITER) == keys
        assert await resolve_keys(client, _settings(server.url, prefix, 4)) == keys
        pipeline = Pipeline("p", ingress=["in"])

        @pipeline.step("s", consumes=["in"], produces=["out"])
        async def step(message: object) -> Output:
            return Output("out", {})

        async with Client(server.url, stream_prefix=prefix, app=pipeline) as submitter:
            assert submitter.keys == keys
            run_id = await submitter.submit({"x": 1})
        assert await client.xlen(keys.of(run_id).stream("in")) == 1
    finally:
        await client.aclose()


async def test_partitioned_streams_without_a_record(server: ServerProcess) -> None:
    prefix = _prefix()
    client = connect(server.url)
    try:
        await client.xadd(StreamKeys(prefix, 6, 0).stream("in"), {"data": "{}"})
        with pytest.raises(ConfigError) as refused:
            await resolve_keys(client, _settings(server.url, prefix), event_types=["in"], writer=WRITER)
        assert f"{prefix}:{{p0}}:in" in str(refused.value) and "--partitions N" in str(refused.value)
        assert await read_partitions(client, prefix) is None
        # Migration: the setting they were written with is recorded.
        keys = await resolve_keys(client, _settings(server.url, prefix, 6), event_types=["in"], writer=WRITER)
        assert keys == StreamKeys(prefix, 6) and await read_partitions(client, prefix) == 6
        assert await client.hget(f"{prefix}:layout", "source") == "setting"
    finally:
        await client.aclose()


async def test_a_cluster_records_three_times_its_masters(cluster: ValkeyCluster) -> None:
    prefix = _prefix()
    client = connect(cluster.url)
    try:
        keys = await resolve_keys(client, _settings(cluster.url, prefix), writer=WRITER)
        assert keys == StreamKeys(prefix, 9)
        assert await client.hget(f"{prefix}:layout", "source") == "3 x 3 masters"
        assert await resolve_keys(client, _settings(cluster.url, prefix)) == keys
        with pytest.raises(ConfigError) as refused:
            await resolve_keys(client, _settings(cluster.url, prefix, 6))
        assert "records 9 partitions, this setting gives 6" in str(refused.value)
    finally:
        await client.aclose()
