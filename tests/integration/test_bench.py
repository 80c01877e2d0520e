"""`printery bench` end to end on a small run: every side relays every event exactly once
and the document has every field of the bench document (docs/reference.md, Bench), plus
both ceilings' ratios, the prefetch printery ran with and Redis commands per event.
Timings are reported, never asserted: they depend on the machine."""

from __future__ import annotations

from typing import Any

import pytest

from printery import ConsumerSettings
from printery.base.errors import ConfigError
from printery.bench import format_table, run_bench
from printery.servers.process import ServerProcess

SIDE_FIELDS = {"events_per_s", "p50_ms", "p99_ms", "max_ms", "cpu_s_per_1000", "peak_rss_mb"}


def _check_document(
    result: dict[str, Any], events: int, stages: int, sides: tuple[str, ...]
) -> None:
    assert {"ceiling", "printery", "ratio", "events", "stages", "verified"} <= set(result)
    assert {"ceiling_minimal", "ratio_minimal", "prefetch"} <= set(result)
    assert result["events"] == events and result["stages"] == stages
    for side in sides:
        values = result[side]
        assert isinstance(values, dict)
        assert set(values) >= SIDE_FIELDS, side
        assert all(isinstance(values[f], int | float) for f in SIDE_FIELDS)
        assert values["verified"] is True and values["arrived"] == events
    for side, ratio in (("ceiling", "ratio"), ("ceiling_minimal", "ratio_minimal")):
        assert isinstance(result[ratio], float)
        if side in sides:
            assert result[ratio] > 0, ratio
        else:
            assert result[side] == {} and result[ratio] == 0.0
    assert result["verified"] is True


async def test_backlog_run_on_embedded_server_is_verified() -> None:
    """The default: printery with the library's settings against both ceilings, and (on
    the bench's own server) Redis commands per event for every side."""
    result = await run_bench(
        events=2000, stages=2, processes=1, payload_bytes=100, redis_url=None,
        rate=None, duration=None,
    )
    sides = ("ceiling", "ceiling_minimal", "printery")
    _check_document(result, 2000, 2, sides)
    assert result["prefetch"] == ConsumerSettings().prefetch
    assert result["prefetch_default"] is True and result["ceilings"] == "both"
    assert result["printery"]["settings"]["prefetch"] == ConsumerSettings().prefetch
    for side in sides:
        commands = result[side]["commands_per_event"]
        # every stage but the last (the sink, which notes arrivals in batches) writes each
        # event once: an XADD per event per relaying stage, and a few for the notes
        assert commands >= 1, side
        assert 1 <= result[side]["commands"]["xadd"]["per_event"] < 1.1, side
        assert result[side]["server_cpu_s_per_1000"] >= 0
    # the driver's loading and polling are not the relays': a ceiling reads in batches,
    # so it sends little more than its XADDs
    assert result["ceiling_minimal"]["commands_per_event"] < 1.5
    table = format_table(result)
    assert "ceiling (same entries)" in table and "ceiling (minimal" in table
    assert "printery" in table and "exactly once: yes" in table
    assert "same-entry ceiling" in table and "minimal relay" in table
    assert "prefetch adaptive (library default)" in table


async def test_rate_run_with_two_processes_on_a_given_server(server: ServerProcess) -> None:
    """Rate mode on a server the bench did not start (no command counts there), with a
    chosen prefetch and only the minimal ceiling."""
    result = await run_bench(
        events=0, stages=2, processes=2, payload_bytes=1024, redis_url=server.url,
        rate=500, duration=1.0, prefetch=64, ceiling="minimal",
    )
    _check_document(result, 500, 2, ("ceiling_minimal", "printery"))
    assert result["mode"] == "rate" and result["p99_ratio_minimal"] > 0
    assert result["prefetch"] == 64 and result["prefetch_default"] is False
    assert "commands_per_event" not in result["printery"]
    assert "prefetch 64 (--prefetch)" in format_table(result)


async def test_with_limit_runs_printery_again_and_reports_the_overhead(
    server: ServerProcess,
) -> None:
    """``--with-limit``: the same run again with a Limit on every stage, every event
    arriving once, and the overhead reported against the run without."""
    result = await run_bench(
        events=500, stages=2, processes=1, payload_bytes=64, redis_url=server.url,
        rate=None, duration=None, ceiling="same", features=("limit",),
    )
    assert result["verified"] and result["with"] == ["limit"]
    assert result["printery_with"]["arrived"] == 500
    assert result["with_overhead"] == round(
        1 - result["printery_with"]["events_per_s"] / result["printery"]["events_per_s"], 3)
    assert "printery with limit" in format_table(result)
    assert "overhead of limit on every stage" in format_table(result)


@pytest.mark.parametrize(
    ("options", "field"),
    [({"stages": 0}, "stages"), ({"prefetch": 0}, "prefetch"), ({"ceiling": "max"}, "ceiling"),
     ({"rounds": 0}, "rounds")],
)
async def test_impossible_options_are_refused_before_anything_starts(
    options: dict[str, Any], field: str
) -> None:
    arguments: dict[str, Any] = {"events": 10, "stages": 2, "processes": 1,
                                 "payload_bytes": 100, "redis_url": None, "rate": None,
                                 "duration": None, **options}
    with pytest.raises(ConfigError, match=field):
        await run_bench(**arguments)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "5"], "--duration needs --rate"),
        (["--rate", "0"], "'--rate': 0.0 is not in the range x>0"),
        (["--rate", "100", "--duration", "0"], "'--duration': 0.0 is not in the range x>0"),
        (["--rate", "100", "--events", "10"], "--events and --rate exclude each other"),
        (["--rate", "0.01", "--duration", "1"], "at least one event"),
        (["--prefetch", "0"], "'--prefetch': 0 is not in the range x>=1"),
        (["--ceiling", "max"], "'--ceiling'"),
        (["--rounds", "0"], "'--rounds': 0 is not in the range x>=1"),
    ],
)
def test_cli_usage_errors_exit_2_before_anything_starts(args: list[str], message: str) -> None:
    """Options that contradict each other or give no run are usage errors (exit 2) with
    the reason, not a stack trace and not silently ignored."""
    from click.testing import CliRunner

    from printery.cli.ops_bench import bench

    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


async def test_rounds_rotate_the_sides_and_report_medians(server: ServerProcess) -> None:
    """``rounds``: every side runs once a round, no side in the same place twice running;
    each ratio is the median of the rounds' own and each side's figures are one round's."""
    result = await run_bench(
        events=300, stages=1, processes=1, payload_bytes=32, redis_url=server.url,
        rate=None, duration=None, ceiling="same", features=("limit",), rounds=3,
    )
    assert result["verified"] and result["rounds"] == 3
    orders = [r["order"] for r in result["per_round"]]
    assert orders == [["ceiling", "printery", "printery_with"],
                      ["printery", "printery_with", "ceiling"],
                      ["printery_with", "ceiling", "printery"]]
    for key in ("ratio", "with_overhead"):
        values = sorted(r[key] for r in result["per_round"])
        assert result[key] == values[1], key
    for side in ("ceiling", "printery", "printery_with"):
        throughputs = sorted(r["events_per_s"][side] for r in result["per_round"])
        assert result[side]["events_per_s"] == throughputs[1], side
    assert "3 rounds (medians)" in format_table(result)
    assert "overhead by round: " in format_table(result)
