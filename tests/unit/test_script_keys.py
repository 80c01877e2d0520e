"""Every key a script touches is one it was given (KEYS), and every key format has one
owner, :mod:`printery.wire.keys`: no Lua file builds a key, and the formats that used to live
in Lua or elsewhere in Python (record sets, budget field names, the warning's
idempotency key, the reservation encoding) are built there alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from printery.transport.commit import (
    Append,
    BudgetCharge,
    ChargePlan,
    DeadLetterWrite,
    EntryCommit,
    IndexEnd,
    IndexWrites,
    commit_run,
)
from printery.wire import keys

SRC = Path(__file__).parents[2] / "src" / "printery"
LUA = sorted((SRC / "transport" / "lua").rglob("*.lua"))
#: Scripts that still derive a key from one they were given (a known debt, to shrink).
DERIVING = {"forget.lua"}


def _code(path: Path) -> str:
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


@pytest.mark.parametrize("path", LUA, ids=lambda p: p.name)
def test_no_lua_file_builds_a_key(path: Path) -> None:
    code = _code(path)
    assert not re.search(r"KEYS\[[^\]]*\]\s*\.\.", code), "a key built on a declared one"
    assert not re.search(r"redis\.p?call\('[A-Z]+',\s*[^,)]*\.\.", code), "a key built inline"
    if path.name not in DERIVING:
        assert not re.search(r"ARGV\[[^\]]*\]\s*\.\.\s*\w+\s*$", code, re.MULTILINE), \
            "a key built from an argument"


def test_only_known_scripts_derive_keys() -> None:
    deriving = {p.name for p in LUA if re.search(r"ARGV\[\d+\] \.\. run", _code(p))}
    assert deriving <= DERIVING


#: Formats with one owner: keys.py. Lua and the rest of the Python never spell them.
FORMATS = [r"[\"']raise:", r"[\"']warned:", r"[\"']budget:warning:", r":r['\"{]", r"'%S\+'"]


@pytest.mark.parametrize("pattern", FORMATS)
def test_each_format_is_spelled_in_keys_py_alone(pattern: str) -> None:
    spelled = [p.relative_to(SRC).as_posix()
               for p in [*SRC.rglob("*.py"), *LUA] if p.name != "keys.py"
               and re.search(pattern, _code(p) if p.suffix == ".lua" else p.read_text())]
    assert spelled == [] or (pattern == r"'%S\+'" and spelled == ["transport/lua/reserve.lua"]), spelled


def test_the_formats() -> None:
    index = "p:idem:w"
    assert keys.record_sets(index) == ("p:idem:w:r0", "p:idem:w:r1", "p:idem:w:r2")
    assert keys.record_set(index, 4) == keys.record_sets(index)[4 % keys.RECORD_RING]
    assert keys.warned_field("usd") == "warned:usd" and keys.raise_field("usd") == "raise:usd"
    before, after = keys.budget_warning_key_parts("usd")
    assert before + "r1" + after == keys.budget_warning_key("r1", "usd") == "budget:warning:r1:usd"
    value = keys.reservation_value(1234, {"usd": "5", "step:s:usd": "7"})
    assert value == "1234 usd 5 step:s:usd 7"
    assert keys.parse_reservation(value) == (1234.0, {"usd": "5", "step:s:usd": "7"})
    assert keys.parse_reservation("nonsense") == (0.0, {})


def test_a_commit_declares_every_key_it_touches() -> None:
    """Every key of a run of every kind (outputs, once keys, outcomes' run infos, budget
    hashes, reservations, warning stream, over set, dead letter's keys, run index) is in
    its KEYS, and none appears among its values."""
    k = keys.StreamKeys("p")
    plan = ChargePlan(k.budget_prefix, ("usd",), (1.0,), ("{",), "cid", k.stream("budget:warning"),
                      {"data": ""}, (2.0,), k.budgets_over, (), k.reserved_prefix)
    letter = DeadLetterWrite(k.stream("in"), "w", "c", "2-0", k.dlq, {"type": "in"},
                             outcome=k.stream("run:failed"), outcome_fields={"data": ""},
                             run_info=k.run_info("r2"), last_error=k.last_error("w", "in", "2-0"),
                             once=k.once("l"), once_ttl_ms=5, reserved=k.reserved("r2"),
                             reservation="key2",
                             index=IndexWrites(1, k.run_index(), k.run_index("running"),
                                               ("r2",), k.cost_minute(0), 60, (("usd", "1.0"),),
                                               k.run_statuses,
                                               (IndexEnd(k.run_info("r2"), k.run_index("failed"),
                                                         "r2", "failed", False),)))
    entries = [
        EntryCommit(k.stream("in"), "c", "1-0", "key1",
                    [Append(k.stream("out"), {"data": "1"}, k.once("o"))],
                    BudgetCharge(plan, "r1", ("5",))),
        EntryCommit(k.stream("in"), "c", "2-0", "", (), letter=letter),
    ]
    run = commit_run(k.idempotency_index("w"), "w", 1000, entries)
    touched = {k.idempotency_index("w"), *keys.record_sets(k.idempotency_index("w")),
               k.stream("in"), k.stream("out"), k.once("o"), k.budget("r1"), k.reserved("r1"),
               k.stream("budget:warning"), k.budgets_over, k.dlq, k.stream("run:failed"),
               k.run_info("r2"), k.last_error("w", "in", "2-0"), k.once("l"), k.reserved("r2"),
               k.run_index(), k.run_index("running"), k.cost_minute(0), k.run_statuses,
               k.run_index("failed")}
    assert set(run.keys) == touched
    assert not touched & {str(value) for value in run.args}, "a key among the values"
