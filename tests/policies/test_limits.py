"""Limits: one request for the batch, a wait before the slot, the claim given back."""

from typing import Any

import pytest
from tests.support.policy_fakes import Connectivity, Failures, batch, entries, ids

from printery.base.errors import PipelineError
from printery.policies.chain import Chain
from printery.policies.limits import FallsBackFailed, Limits


class Ticket:
    def __init__(self, n: int) -> None:
        self.n = n
        self.admitted = False


class Gate:
    """Admits the batch's even entries at once, the others when they wait; entry 3's
    key function fails."""

    worker = "step"

    def __init__(self, gives_up: bool = False) -> None:
        self.gives_up = gives_up
        self.requests: list[list[int]] = []
        self.waited: list[int] = []
        self.released: list[tuple[int, dict[str, float]]] = []

    def tickets(self, count: int, messages: Any) -> tuple[list[Ticket], dict[int, Exception]]:
        claims, failed = [], {}
        for n, message in enumerate(messages):
            if message.entry_id == "3-0":
                failed[n] = PipelineError("key raised")
            else:
                claims.append(Ticket(int(message.entry_id[0])))
        return claims, failed

    async def try_admit(self, tickets: list[Ticket]) -> None:
        self.requests.append([t.n for t in tickets])
        for ticket in tickets:
            ticket.admitted = ticket.n % 2 == 0

    async def admit(self, ticket: Ticket, message: Any) -> None:
        self.waited.append(ticket.n)
        self.may_give_up = message is not None
        ticket.admitted = True

    def release(self, ticket: Ticket, costs: dict[str, float]) -> None:
        ticket.admitted = False
        self.released.append((ticket.n, dict(costs)))


def limits() -> tuple[Limits, Gate, Failures]:
    gate, failures = Gate(), Failures()
    return Limits(gate, failures, Connectivity()), gate, failures  # type: ignore[arg-type]


async def test_the_batch_asks_once_and_a_failing_key_dead_letters_its_entry() -> None:
    policy, gate, failures = limits()
    admitted = batch(entries(4))
    await policy.admit(admitted)
    assert gate.requests == [[0, 1, 2]]
    assert failures.letters == [("3-0", "invalid_limit_key")]
    assert ids(admitted.entries) == ["0-0", "1-0", "2-0"]


async def test_only_an_entry_not_admitted_waits_and_each_call_gives_its_claim_back() -> None:
    policy, gate, _ = limits()
    admitted = batch(entries(2))
    await policy.admit(admitted)
    (d0, m0), (d1, m1) = admitted.entries
    await policy.attempt(d0, m0)
    await policy.attempt(d1, m1)
    assert gate.waited == [1]

    async def handler(message: Any) -> None:
        message.report_cost("tokens", 7)
        raise ValueError("the call failed")

    call = Chain([policy], handler).wrapped
    assert call is not None
    with pytest.raises(ValueError):
        await call(d1, m1)
    assert gate.released == [(1, {"tokens": 7})]


async def test_an_abandoned_call_gives_its_claim_back_once() -> None:
    policy, gate, _ = limits()
    admitted = batch(entries(1))
    await policy.admit(admitted)
    (delivery, message), = admitted.entries
    delivery.abandoned = True
    policy.abandoned(delivery)

    async def handler(message: Any) -> None:
        return None

    call = Chain([policy], handler).wrapped
    assert call is not None
    await call(delivery, message)  # it ends later: nothing more is given back
    assert gate.released == [(0, {})]


async def test_nothing_is_claimed_once_the_worker_stops() -> None:
    gate, failures = Gate(), Failures()
    policy = Limits(gate, failures, Connectivity(stopped=True))  # type: ignore[arg-type]
    await policy.admit(batch(entries(2)))
    assert gate.requests == []


async def test_falls_back_is_asked_and_what_it_raises_fails_the_call_not_the_batch() -> None:
    gate, failures = Gate(gives_up=True), Failures()

    def falls_back(message: Any) -> bool:
        if message.entry_id == "3-0":
            raise KeyError("fallback")
        return message.entry_id == "1-0"

    policy = Limits(gate, failures, Connectivity(), falls_back)  # type: ignore[arg-type]
    admitted = batch(entries(2))
    await policy.admit(admitted)
    (_, _), (d1, m1) = admitted.entries
    await policy.attempt(d1, m1)
    assert gate.may_give_up  # the gate was given the message: it may give up for it
    (d3, m3), = entries(1)
    m3.entry_id = "3-0"
    policy.tickets[d3] = Ticket(3)
    with pytest.raises(FallsBackFailed, match="falls_back raised KeyError"):
        await policy.attempt(d3, m3)
