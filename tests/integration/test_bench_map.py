"""``printery bench --map N`` (docs/reference.md, Bench): a small run on a given server,
through the CLI and the library; both sides verified, the document's fields there.
Timings are reported, never asserted: they depend on the machine."""

from __future__ import annotations

import json
from typing import Any

from printery.bench.map_cost import format_map, run_map_bench
from support.operator_cli import cli_sync


async def test_map_bench_verifies_both_sides_and_reports_a_ratio(server: Any) -> None:
    result = await run_map_bench(items=60, payload_bytes=64, redis_url=server.url, rounds=2)
    assert result["verified"] is True and result["mode"] == "map"
    for side in ("map", "plain"):
        assert result[side]["items"] == 60 and result[side]["verified"] is True
        assert result[side]["items_per_s"] > 0
    assert result["ratio"] > 0 and len(result["per_round"]) == 2
    table = format_map(result)
    assert "ratio (map / plain items/s)" in table and "verified: true" in table


def test_cli_map_bench_prints_the_document(server: Any) -> None:
    done = cli_sync(None, "ignored", "bench", "--redis-url", server.url, "--map", "40",
                    "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["items"] == 40 and document["verified"] is True
