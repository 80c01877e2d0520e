"""The engine room stays readable: the entry pipeline small, no runtime or policy module
over 350 lines, nothing under ``noqa: C901``, and one unit-test file per policy
(docs/engine.md, The chain of policies)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "printery"
TESTS = Path(__file__).resolve().parents[1] / "policies"
ROOMS = [SRC / "runtime", SRC / "policies"]
#: Modules of policies/ that are the chain's machinery, not a policy.
MACHINERY = {"__init__", "base", "chain", "order"}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_entry_pipeline_is_at_most_300_lines() -> None:
    assert lines(SRC / "runtime" / "consume.py") <= 300


def test_no_module_of_the_runtime_or_the_policies_is_over_350_lines() -> None:
    over = {str(p.relative_to(SRC)): lines(p) for room in ROOMS for p in room.glob("*.py")
            if lines(p) > 350}
    assert over == {}


def test_nothing_in_the_engine_room_hides_its_complexity() -> None:
    hidden = [str(p.relative_to(SRC)) for room in ROOMS for p in room.glob("*.py")
              if "noqa: C901" in p.read_text()]
    assert hidden == []


def test_each_policy_has_its_own_unit_test_file() -> None:
    policies = {p.stem for p in (SRC / "policies").glob("*.py")} - MACHINERY
    assert policies, "no policy found"
    tested = {p.stem.removeprefix("test_") for p in TESTS.glob("test_*.py")}
    assert policies - tested == set()
