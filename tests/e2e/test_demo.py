"""`printery demo` is the five-minute tour: it must run end to end and exit 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

PRINTERY = str(Path(sys.executable).parent / "printery")


def test_demo_shows_each_outcome(tmp_path: Path) -> None:
    result = subprocess.run([PRINTERY, "demo", "--json"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in rows] == ["succeeded", "rejected", "blocked", "unhealthy", "succeeded"]
    assert rows[-1]["review"] == "delivery_failed"
    assert not (tmp_path / ".printery").exists(), "the demo leaves the working dir alone"


def test_demo_prints_table_and_trace(tmp_path: Path) -> None:
    result = subprocess.run([PRINTERY, "demo"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for word in ("succeeded", "rejected", "blocked", "unhealthy", "delivery_failed", "trace of",
                 "deployment:finished"):
        assert word in result.stdout, word


README = Path(__file__).resolve().parents[2] / "README.md"
RUN_ID = re.compile(r"dep-[0-9a-f]{11}-[0-9a-f]{10}")


def _shown_in_readme() -> list[str]:
    """The output the README's tour shows for ``printery demo``: the block that starts
    with the outcome table's header."""
    text = README.read_text()
    block = text[text.index("```\nscenario ") + 4:]
    return block[:block.index("\n```\n")].splitlines()


def test_the_readme_shows_what_the_demo_prints(tmp_path: Path) -> None:
    """The tour's block is the demo's output: the outcome table with its separator row
    (the README's lacked it), then the successful run's trace. Run ids, entry ids,
    timings and the sink's port differ from run to run; the rest is the same."""
    result = subprocess.run([PRINTERY, "demo"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    printed, shown = result.stdout.splitlines(), _shown_in_readme()
    table = printed.index("")
    assert [RUN_ID.sub("dep-ID", line) for line in shown[:table]] == [
        RUN_ID.sub("dep-ID", line) for line in printed[:table]]
    assert shown[table] == "" and shown[table + 2].split() == printed[table + 2].split()
    assert RUN_ID.sub("dep-ID", shown[table + 1]) == RUN_ID.sub("dep-ID", printed[table + 1])

    def steps(lines: list[str]) -> list[tuple[str, str]]:  # each entry's stream and producer
        return [(line.split()[3], line.split()[4]) for line in lines]

    assert steps(shown[table + 4:]) == steps(printed[table + 4:])
