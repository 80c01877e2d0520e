"""`printery bench` end to end on a small run: both sides relay every event exactly once
and the document has every field of CONTRACT §9. Timings are reported, never asserted:
they depend on the machine."""

from __future__ import annotations

import pytest

from printery.bench import format_table, run_bench
from printery.errors import ConfigError
from printery.transport.server import ServerProcess

SIDE_FIELDS = {"events_per_s", "p50_ms", "p99_ms", "max_ms", "cpu_s_per_1000", "peak_rss_mb"}


def _check_document(result: dict[str, object], events: int, stages: int) -> None:
    assert {"ceiling", "printery", "ratio", "events", "stages", "verified"} <= set(result)
    assert result["events"] == events and result["stages"] == stages
    assert isinstance(result["ratio"], float) and result["ratio"] > 0
    for side in ("ceiling", "printery"):
        values = result[side]
        assert isinstance(values, dict)
        assert set(values) >= SIDE_FIELDS, side
        assert all(isinstance(values[f], int | float) for f in SIDE_FIELDS)
        assert values["verified"] is True and values["arrived"] == events
    assert result["verified"] is True


async def test_backlog_run_on_embedded_server_is_verified() -> None:
    result = await run_bench(
        events=2000, stages=2, processes=1, payload_bytes=100, redis_url=None,
        rate=None, duration=None,
    )
    _check_document(result, 2000, 2)
    table = format_table(result)
    assert "ceiling" in table and "printery" in table and "exactly once: yes" in table


async def test_rate_run_with_two_processes_on_a_given_server(server: ServerProcess) -> None:
    result = await run_bench(
        events=0, stages=2, processes=2, payload_bytes=1024, redis_url=server.url,
        rate=500, duration=1.0,
    )
    _check_document(result, 500, 2)
    assert result["mode"] == "rate" and "p99_ratio" in result


async def test_impossible_options_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="stages"):
        await run_bench(events=10, stages=0, processes=1, payload_bytes=100, redis_url=None,
                        rate=None, duration=None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "5"], "--duration needs --rate"),
        (["--rate", "0"], "'--rate': 0.0 is not in the range x>0"),
        (["--rate", "100", "--duration", "0"], "'--duration': 0.0 is not in the range x>0"),
        (["--rate", "100", "--events", "10"], "--events and --rate exclude each other"),
        (["--rate", "0.01", "--duration", "1"], "at least one event"),
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
