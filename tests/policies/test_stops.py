"""Stops: an entry of a stopped run is settled at admission, a running call of a run
that stops is cancelled and settled, compensation is never stopped, and the commit of
what is not compensation carries the run's stop check."""

import asyncio
from typing import Any

from tests.support.policy_fakes import Connectivity, batch, entry, ids, outcomes

from printery.policies.stops import SETTLED, Stops
from printery.transport.commit import EntryCommit, StopCheck
from printery.wire.fields import COMPENSATES
from printery.wire.keys import StreamKeys

KEYS = StreamKeys("p")


class Stopped:
    """What the server's stopped set answers: ``zrangebyscore(key, min, max, withscores)``."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float]] = []

    async def zrangebyscore(self, key: str, low: float, high: str, *,
                            withscores: bool) -> list[tuple[str, float]]:
        assert key == KEYS.stopped and withscores
        return [row for row in self.rows if row[1] >= low]


def stops(server: Stopped) -> Stops:
    return Stops(KEYS, server, Connectivity())  # type: ignore[arg-type]


async def test_an_entry_of_a_stopped_run_is_settled_and_compensation_runs() -> None:
    server = Stopped()
    server.rows = [("run-0", 5.0), ("run-2", 6.0)]
    policy = stops(server)
    assert await policy.refresh() == ["run-0", "run-2"]
    assert await policy.refresh() == [], "read on from the last: nothing new"
    items = [entry(0), entry(1), entry(2, extra={COMPENSATES: "run-2"})]
    admitted = batch(items)
    await policy.admit(admitted)
    assert ids(admitted.entries) == ["1-0", "2-0"]
    assert outcomes(admitted.decided) == [("0-0", SETTLED)]
    assert admitted.decided[0].commit.appends == ()


async def test_a_running_call_of_a_run_that_stops_is_cancelled_and_settled() -> None:
    server = Stopped()
    policy = stops(server)
    started, cancelled = asyncio.Event(), []

    async def handler(delivery: Any, message: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(message.correlation_id)
            raise

    call = policy.wrap(handler)
    delivery, message = entry(3)
    running = asyncio.create_task(call(delivery, message))
    await asyncio.wait_for(started.wait(), 5)
    server.rows = [("run-3", 9.0)]
    assert await policy.refresh() == ["run-3"]
    assert await asyncio.wait_for(running, 5) is None, "settled: no outputs, no failure"
    assert cancelled == ["run-3"]


def test_the_commit_of_a_call_checks_its_run_but_not_compensation() -> None:
    policy = stops(Stopped())
    _, message = entry(4)
    commit = EntryCommit("s", "c", "4-0", "k", [object()])  # type: ignore[list-item]
    assert policy.on_commit(message, commit, "ok").stop == StopCheck(
        KEYS.stopped, KEYS.withheld, "run-4")
    _, compensating = entry(5, extra={COMPENSATES: "run-5"})
    assert policy.on_commit(compensating, commit, "ok").stop is None
