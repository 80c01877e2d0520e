"""`printery demo` is the five-minute tour: it must run end to end and exit 0."""

from __future__ import annotations

import json
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
