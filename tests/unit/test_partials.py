"""What a follower is given of a run's partials (printery.runs.partials): the attempts in
progress for a new follower, what it missed for a reconnect, one verdict per draft, and
the merge with the entries by millisecond."""

from __future__ import annotations

from typing import Any

from printery.runs.partials import POSITION, Drafts, Partial, ShownSoFar, Verdict, merged

NO = [{"code": "not_yet", "field": "", "message": ""}]


def stream() -> list[Partial | Verdict]:
    """Attempt 1 written and retracted, attempt 2 being written (ids by millisecond)."""
    return [Partial("r", "draft", 1, "a", "10-0"), Partial("r", "draft", 1, "b", "11-0"),
            Verdict("r", "draft", 1, False, NO, "12-0"), Partial("r", "draft", 2, "c", "14-0")]


def texts(items: list[Any]) -> list[Any]:
    return [i.text if isinstance(i, Partial) else ("verdict", i.attempt) for i in items]


def test_a_new_follower_gets_the_attempt_in_progress_from_its_start() -> None:
    assert texts(ShownSoFar("r", "k", stream()).head(None, None)) == ["c"]
    # Once the run has ended: nothing.
    assert ShownSoFar("r", "k", stream()).head(None, 20) == []


def test_a_reconnect_gets_everything_after_its_last_partial_or_verdict() -> None:
    shown = ShownSoFar("r", "k", stream())
    assert texts(shown.head({POSITION: "11-0", "request": "9-0"}, None)) == [("verdict", 1), "c"]
    # Given no partial yet: what came after its last entry, and the attempt in progress
    # (attempt 1's verdict closes a draft it was not given: passed over).
    assert texts(ShownSoFar("r", "k", stream()).head({"request": "11-5"}, None)) == ["c"]
    assert texts(ShownSoFar("r", "k", stream()).head({"request": "9-0"}, None)) == [
        "a", "b", ("verdict", 1), "c"]
    # Never past the outcome.
    assert texts(ShownSoFar("r", "k", stream()).head({POSITION: "11-0"}, 13)) == [
        ("verdict", 1)]


def test_a_verdict_that_closes_no_draft_given_is_passed_over() -> None:
    shown = ShownSoFar("r", "k", [])
    mark = Verdict("r", "draft", 1, False, NO, "20-0")  # a restart after a retraction
    given = shown.passed_on([Partial("r", "draft", 1, "a", "19-0"),
                             Verdict("r", "draft", 1, False, NO, "19-5"), mark,
                             Partial("r", "draft", 1, "b", "21-0"),
                             Verdict("r", "draft", 1, True, [], "22-0")])
    assert texts(given) == ["a", ("verdict", 1), "b", ("verdict", 1)]
    # The items of a Map keep drafts apart: item 1's verdict does not close item 0's.
    items = [Partial("r", "each", 1, "x", "30-0", item=0),
             Verdict("r", "each", 1, True, [], "31-0", item=1)]
    assert shown.passed_on(items) == items[:1]


def test_merged_puts_a_partial_before_an_entry_of_its_millisecond() -> None:
    entries = [{"id": "10-0", "stream": "request"}, {"id": "12-0", "stream": "answer"}]
    verdict = Verdict("r", "draft", 1, True, [], "12-0")
    out = merged(entries, [Partial("r", "draft", 1, "a", "11-0"), verdict])
    assert [o["stream"] if isinstance(o, dict) else type(o).__name__ for o in out] == [
        "request", "Partial", "Verdict", "answer"]


def test_drafts_close_each_attempt_and_start_a_new_one_after_a_retraction() -> None:
    drafts = Drafts()
    for item in [*stream(), Partial("r", "draft", 2, "d", "15-0"),
                 Verdict("r", "draft", 2, True, [], "16-0")]:
        drafts.add(item)
    assert [(d.attempt, d.text, d.state) for d in drafts.drafts] == [
        (1, "ab", "retracted"), (2, "cd", "committed")]
