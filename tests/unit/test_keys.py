"""The partitioned key scheme (docs/reference.md, Partitions): one partition keeps the
unpartitioned keys, and every key of a run in a partition shares that partition's hash
tag."""

from __future__ import annotations

import binascii
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from printery.base.errors import ConfigError
from printery.settings.config_load import load_settings
from printery.wire.keys import PartitionError, StreamKeys, partition_of


def test_one_partition_keeps_the_keys_of_section_2() -> None:
    keys = StreamKeys("pfx")
    for view in (keys, keys.at(0), keys.of("dep-1"), *keys.each()):
        assert view.stream("deployment:started") == "pfx:deployment:started"
        assert view.dlq == "pfx:dlq"
        assert view.idempotency_index("validator") == "pfx:idem:validator"
        assert view.join("aggregator", "dep-1") == "pfx:join:aggregator:dep-1"
        assert view.budget("dep-1") == "pfx:spent:dep-1"
        assert view.blob("abc") == "pfx:blob:abc"
    assert keys.event_type("pfx:deployment:started") == "deployment:started"


def test_partition_is_crc32_of_the_correlation_id() -> None:
    # The documented function: any language's IEEE CRC-32 gives the same partition.
    for run in ("dep-1", "dep-2", "ünïcode", ""):
        assert partition_of(run, 7) == binascii.crc32(run.encode()) % 7
    assert partition_of("anything", 1) == 0
    assert zlib.crc32(b"dep-1") % 3 == 1  # pinned: a change would move every run


def test_every_key_of_a_run_shares_its_partitions_hash_tag() -> None:
    keys = StreamKeys("pfx", 3)
    run = keys.of("dep-1")
    tag = "{p1}"
    for key in (run.stream("a"), run.dlq, run.review, run.review_decided,
                run.idempotency_index("w"), run.once("k"), run.join("w", "dep-1"),
                run.join_deadlines("w"), run.submitted("k"), run.run_start("dep-1"),
                run.budget("dep-1"), run.blob("d")):
        assert key.startswith("pfx:" + tag + ":"), key
    # Keys no commit touches stay unpartitioned, one per deployment.
    assert run.process("x") == keys.process("x") == "pfx:process:x"
    assert run.limit("l") == "pfx:{limit}:l" and run.pipeline == "pfx:pipeline"
    assert keys.locate("pfx:{p2}:deployment:started") == (2, "deployment:started")
    assert [k.stream("s") for k in keys.each()] == ["pfx:{p0}:s", "pfx:{p1}:s", "pfx:{p2}:s"]


def test_runs_that_hash_apart_land_apart() -> None:
    keys = StreamKeys("pfx", 3)
    runs = [f"dep-{i}" for i in range(30)]
    assert {partition_of(run, 3) for run in runs} == {0, 1, 2}
    a, b = next((x, y) for x in runs for y in runs if partition_of(x, 3) != partition_of(y, 3))
    assert keys.of(a).stream("s") != keys.of(b).stream("s")


def test_the_whole_keyspace_refuses_to_guess_a_partition() -> None:
    keys = StreamKeys("pfx", 3)
    with pytest.raises(PartitionError, match="name one"):
        keys.stream("s")
    with pytest.raises(PartitionError):
        keys.locate("pfx:{p3}:s")  # no partition 3 of 3
    with pytest.raises(ValueError):
        StreamKeys("pfx", 0)


def test_partitions_from_file_env_and_flag() -> None:
    assert load_settings({}, {}).keys == StreamKeys("printery")
    assert load_settings({"partitions": "3"}, {}).keys == StreamKeys("printery", 3)
    assert load_settings({}, {"PRINTERY_PARTITIONS": "5"}).transport.partitions == 5
    with pytest.raises(ConfigError, match=r"transport.partitions \(--partitions\): '0'"):
        load_settings({"partitions": "0"}, {})
    with pytest.raises(ConfigError, match=r"PRINTERY_PARTITIONS.*<= 1024"):
        load_settings({}, {"PRINTERY_PARTITIONS": "5000"})


def test_env_partitions_merge_with_the_config_files_transport_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "printery.toml"
    path.write_text("[transport]\nmax_deliveries = 9\npartitions = 2\n")
    settings = load_settings({"config": str(path)}, {"PRINTERY_PARTITIONS": "4"})
    assert (settings.transport.max_deliveries, settings.transport.partitions) == (9, 4)
    assert load_settings({"config": str(path)}, {}).transport.partitions == 2


def test_one_read_names_every_partition_on_a_server_and_one_slot_on_a_cluster() -> None:
    from printery.runtime.lanes import Lanes

    def lane(keys: StreamKeys) -> Any:
        return SimpleNamespace(streams=[keys.stream("a"), keys.stream("b")])

    lanes = Lanes(StreamKeys("pfx", 3), lane)
    assert lanes.read_sets(False) == [[f"pfx:{{p{k}}}:{t}" for k in range(3) for t in "ab"]]
    assert lanes.read_sets(True) == [[f"pfx:{{p{k}}}:a", f"pfx:{{p{k}}}:b"] for k in range(3)]
    assert lanes.of_stream("pfx:{p2}:b") is lanes.lanes[2]
    assert lanes.of_run("dep-1") is lanes.lanes[partition_of("dep-1", 3)]
    single = Lanes(StreamKeys("pfx"), lane)
    assert single.read_sets(True) == [["pfx:a", "pfx:b"]]
