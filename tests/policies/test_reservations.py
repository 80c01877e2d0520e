"""Reservations: reserved once for the batch; refused entries held, bad estimates dead."""

from typing import Any

from tests.support.policy_fakes import Connectivity, Failures, batch, entries, ids, outcomes

from printery.base.errors import PipelineError
from printery.policies.reservations import Reserve
from printery.rules.budgets import Exceeded
from printery.runtime.handler import Output


class Guard:
    def held(self, message: Any, exceeded: Exceeded) -> list[Output]:
        return [Output("budget:exceeded", {})]


class Reservations:
    """Entry 1's estimate fails; entry 2's run cannot hold its reservation."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def amounts(self, message: Any) -> tuple[str, ...]:
        if message.entry_id == "1-0":
            raise PipelineError("estimate raised")
        return ("0.5",)

    async def reserve(self, messages: list[Any], amounts: list[Any]) -> dict[int, Exceeded]:
        self.asked.append([m.entry_id for m in messages])
        return {n: Exceeded("usd", "usd", 1, 1, "stop", "")
                for n, m in enumerate(messages) if m.entry_id == "2-0"}


async def test_one_round_trip_reserves_the_batch_and_refusals_are_held() -> None:
    failures, reservations = Failures(), Reservations()
    policy = Reserve(Guard(), reservations, failures, Connectivity())  # type: ignore[arg-type]
    admitted = batch(entries(4))
    await policy.admit(admitted)
    assert reservations.asked == [["0-0", "2-0", "3-0"]]
    assert failures.letters == [("1-0", "invalid_estimate")]
    assert ("2-0", "budget_exceeded") in outcomes(admitted.decided)
    assert ids(admitted.entries) == ["0-0", "3-0"]
