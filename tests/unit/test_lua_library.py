"""The Lua library (docs/engine.md, The Lua library), read from its own files: every
include resolves, no entry point is long, no script runs a command taken from ARGV, and
the ownership fence and the server's clock are each written once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from printery.transport.scripts import INCLUDE, script

LIBRARY = Path(__file__).parents[2] / "src" / "printery" / "transport" / "lua"
ENTRIES = sorted(LIBRARY.glob("*.lua"))
INCLUDES = sorted((LIBRARY / "includes").glob("*.lua"))
#: A call of the server: its first argument must be a command's name, written out.
CALL = re.compile(r"redis\.p?call\(\s*([^,)]*)")


def _code(path: Path) -> str:
    """A file's Lua without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


def test_the_library_has_entry_points_and_includes() -> None:
    assert {p.stem for p in ENTRIES} >= {"commit", "limit", "reserve", "lease"}
    assert {p.stem for p in INCLUDES} >= {
        "args", "fence", "clock", "records", "outputs", "budget", "run_index", "letter"}
    assert not (LIBRARY / "dead_letter.lua").exists(), "a dead letter is a kind of commit"


@pytest.mark.parametrize("path", ENTRIES, ids=lambda p: p.stem)
def test_every_include_resolves_once(path: Path) -> None:
    source = script(path.stem).source
    assert not INCLUDE.search(source), "every --@include was replaced"
    named = INCLUDE.findall(path.read_text())
    for name in named:
        assert (LIBRARY / "includes" / f"{name}.lua").exists(), name
        assert source.count(f"-- include {name}\n") == 1, f"{name} assembled once"


@pytest.mark.parametrize("path", ENTRIES, ids=lambda p: p.stem)
def test_no_entry_point_is_over_150_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 150


@pytest.mark.parametrize("path", ENTRIES + INCLUDES, ids=lambda p: p.name)
def test_no_script_runs_a_command_taken_from_its_arguments(path: Path) -> None:
    """Every call names its command; none unpacks ARGV into a command (the run index is
    written by name: includes/run_index.lua)."""
    for first in CALL.findall(_code(path)):
        assert re.fullmatch(r"'[A-Z]+'", first.strip()), f"{path.name}: redis.call({first}"


def _defined_in(pattern: str) -> list[str]:
    return [p.relative_to(LIBRARY).as_posix() for p in ENTRIES + INCLUDES
            if re.search(pattern, _code(p))]


def test_the_fence_and_the_clock_are_each_written_once() -> None:
    # The clock: the only TIME; the fence: the only single-entry XPENDING.
    assert _defined_in(r"'TIME'") == ["includes/clock.lua"]
    assert _defined_in(r"'XPENDING', \w+, \w+, (\w+), \1, 1\)") == ["includes/fence.lua"]
