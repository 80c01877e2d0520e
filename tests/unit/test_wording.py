"""What the operator reads (issue 39): cost amounts without float noise and without an
exponent for a million tokens, and a dead letter in ``trace`` said as one (who
dead-lettered it and why), not as ``dlq`` by the failed entry's producer."""

from __future__ import annotations

from printery.base._util import amount, amounts
from printery.cli.ops_trace import _outcome, _producer, _short


def test_an_amount_is_read_as_a_person_writes_it() -> None:
    assert amount(0.00007 + 0.00007) == "0.00014"  # 0.00014000000000000001 before
    assert amount(0.1 + 0.2) == "0.3"
    assert amount(1_234_567) == "1234567" and amount(1e6) == "1000000"  # not 1e+06
    assert amount(1234567.891) == "1234567.89"
    assert amount(2.5) == "2.5" and amount(100.0) == "100" and amount(0) == "0"
    assert amount("n/a") == "n/a"
    assert amounts({"usd": 0.00007 + 0.00007, "tokens": 1200}) == "usd=0.00014,tokens=1200"
    assert amounts({"usd": 0.1 + 0.2}, joiner=", ", between=" ") == "usd 0.3"
    assert amounts(None) == ""


def test_trace_shows_a_calls_cost_to_six_digits() -> None:
    assert _short({"usd": 0.00007 + 0.00007, "tokens": 140}) == "usd=0.00014,tokens=140"


def test_trace_says_a_dead_letter_is_one_and_who_wrote_it() -> None:
    letter = {"stream": "dlq", "type": "chunks:item", "producer": "chunks",
              "worker": "chunks:each", "reason_code": "max_deliveries_exceeded",
              "item": "2", "items": "5"}
    assert _producer(letter) == "chunks:each"  # the worker, not the failed entry's producer
    assert _outcome(letter) == "dead-lettered by chunks:each: max_deliveries_exceeded item 2/5"
    raw = {"stream": "dlq", "producer": "external", "reason_code": "undecodable"}
    assert _outcome(raw) == "dead-lettered: undecodable" and _producer(raw) == ""
    plain = {"stream": "chunks:item", "producer": "chunks", "reason_code": "x"}
    assert _producer(plain) == "chunks" and _outcome(plain) == "reason_code=x"
