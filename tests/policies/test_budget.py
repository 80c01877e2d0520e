"""Budget: a run at a hard limit holds its entries; a call's commit carries its charge."""

from typing import Any

from tests.support.policy_fakes import Connectivity, LookUps, batch, entries, ids, outcomes

from printery.policies.budget import Budget
from printery.rules.budgets import Exceeded
from printery.runtime.handler import Output
from printery.transport.commit import EntryCommit


class Guard:
    """Runs named in ``over`` are at their limit; a charge is the message's costs."""

    def __init__(self, *over: str) -> None:
        self.over_runs = set(over)
        self.read_runs: list[list[str]] = []

    def reads(self, runs: list[str]) -> list[Any]:
        self.read_runs.append(list(runs))
        return [("ZMSCORE", "over", *runs)]

    async def over(self, runs: list[str], replies: list[Any]) -> dict[int, Exceeded]:
        (scores,) = replies
        assert len(scores) == len(runs)
        return {n: Exceeded("usd", "usd", 1.0, 1.5, "stop", "")
                for n, run in enumerate(runs) if run in self.over_runs}

    def held(self, message: Any, exceeded: Exceeded) -> list[Output]:
        return [Output("budget:exceeded", {"run": message.correlation_id})]

    def charge(self, message: Any) -> Any:
        return dict(message.costs) or None


async def test_an_entry_of_a_run_at_its_limit_writes_what_its_budget_says_instead() -> None:
    guard = Guard("run-1")
    policy = Budget(guard, Connectivity())  # type: ignore[arg-type]
    look_up = LookUps(replies={"ZMSCORE": [None, 1.0, None]})
    admitted = batch(entries(3), look_up=look_up, readers=[policy])
    await policy.admit(admitted)
    assert ids(admitted.entries) == ["0-0", "2-0"]
    assert outcomes(admitted.decided) == [("1-0", "budget_exceeded")]
    assert [a.stream for a in admitted.decided[0].commit.appends] == ["budget:exceeded"]
    assert len(look_up.sent) == 1  # its read made the batch's one round trip


async def test_positions_stay_right_when_an_earlier_policy_decided_entries_after_the_read() -> None:
    guard = Guard("run-2")
    policy = Budget(guard, Connectivity())  # type: ignore[arg-type]
    admitted = batch(entries(3), look_up=LookUps(replies={"ZMSCORE": [None, None, 1.0]}),
                     readers=[policy])
    await admitted.look_up([])  # the round trip, made by dedupe
    admitted.keep(admitted.entries[1:])  # dedupe acked the first
    await policy.admit(admitted)
    assert ids(admitted.entries) == ["1-0"]
    assert outcomes(admitted.decided) == [("2-0", "budget_exceeded")]


async def test_a_batch_read_while_no_run_was_over_sends_no_read() -> None:
    guard = Guard("run-0")
    policy = Budget(guard, Connectivity())  # type: ignore[arg-type]
    look_up = LookUps()
    admitted = batch(entries(2), look_up=look_up, readers=[policy], none_over=True)
    await admitted.look_up(["task:0", "task:1"])
    await policy.admit(admitted)
    assert look_up.sent == [(["task:0", "task:1"], [])]
    assert ids(admitted.entries) == ["0-0", "1-0"]
    assert guard.read_runs  # still asked: it renews what its charges write


async def test_only_a_calls_commit_is_charged() -> None:
    policy = Budget(Guard(), Connectivity())  # type: ignore[arg-type]
    (_, message), = entries(1)
    message.report_cost("usd", 0.25)
    commit = EntryCommit("s", "c", "1-0", "k", ())
    assert policy.on_commit(message, commit, "ok").budget == {"usd": 0.25}
    assert policy.on_commit(message, commit, "budget_exceeded").budget is None
