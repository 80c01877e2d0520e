"""Failure semantics of the runtime (docs/reference.md, Failures), each a reproduction of
what broke a step before, on a real server: every run ends, one entry never stops a step.

Each test runs a small pipeline in-process (its workers built with the public API) and
checks what a user sees: the dead letter, the run's ``run:failed`` outcome, the result
the client gets, and that the worker is still running and handling other entries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    RUN_FAILED,
    Budget,
    Client,
    ConsumerSettings,
    InvalidInput,
    Limit,
    Loop,
    Message,
    Output,
    Pipeline,
    WorkerCrashed,
    WorkerManager,
    WorkerState,
)
from printery.inbox.dead_letters import replay_dead_letter
from printery.runs.index import RunIndexReader
from printery.testing import wait_for
from printery.wire.keys import StreamKeys


@asynccontextmanager
async def running(client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline,
                  **settings: Any) -> AsyncIterator[WorkerManager]:
    base = {"block_ms": 100, "retry_backoff_ms": 10, "max_deliveries": 2, **settings}
    manager = WorkerManager(supervised=False)
    for worker, deps in pipeline.build_workers(client=client, keys=keys,
                                               settings=ConsumerSettings(**base)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        yield manager
    finally:
        await manager.stop_all(5)


async def dead_letters(client: aioredis.Redis, keys: StreamKeys, n: int) -> list[dict[str, str]]:
    async def enough() -> list[dict[str, str]]:
        rows = [(i, f) for i, f in await client.xrange(keys.dlq)]
        return [{"id": i, **f} for i, f in rows] if len(rows) >= n else []
    return await wait_for(enough, timeout=20, message=f"{n} dead letters")


async def failed_runs(client: aioredis.Redis, keys: StreamKeys) -> list[dict[str, Any]]:
    return [{**f, "data": json.loads(f["data"])}
            for _, f in await client.xrange(keys.stream(RUN_FAILED))]


def states(manager: WorkerManager) -> dict[str, str]:
    return {name: status["state"] for name, status in manager.get_status().items()}


async def test_a_budget_step_survives_a_batch_of_entries_settled_before_any_handler(
    client: aioredis.Redis, prefix: str
) -> None:
    """Before: a batch holding only entries settled before any handler (no `data`, a
    replay's copy for another step) crashed a worker with a budget (`not enough values
    to unpack`) and the entry never reached the dlq. With a limit too."""
    keys = StreamKeys(prefix)
    p = Pipeline("b", ingress=["in"], cost_units=["usd"], budget=Budget(usd=10.0))

    @p.step("work", consumes=["in"], produces=["out"], cost_units=["usd"],
            limits=[Limit("model", concurrency=2)])
    async def work(message: Message) -> Output:
        message.report_cost("usd", 1.0)
        return Output("out", message.data)

    async with running(client, keys, p) as manager:
        await client.xadd(keys.stream("in"), {"correlation_id": "r-nodata", "attempt": "1"})
        await client.xadd(keys.stream("in"), {"data": "{}", "replay_for": "someone-else"})
        (letter,) = await dead_letters(client, keys, 1)
        assert letter["reason_code"] == "undecodable"
        await client.xadd(keys.stream("in"), {"data": json.dumps({"n": 1}),
                                              "correlation_id": "r-good"})
        await wait_for(lambda: client.xlen(keys.stream("out")), timeout=10, message="out")
        assert states(manager) == {"work": "running"}
        assert await client.xpending(keys.stream("in"), "work") == {
            "pending": 0, "min": None, "max": None, "consumers": []}
    (ended,) = await failed_runs(client, keys)
    assert ended["correlation_id"] == "r-nodata"
    assert ended["data"] == {"status": "failed", "step": "work", "reason_code": "undecodable",
                             "error": letter["error"], "dlq_id": letter["id"]}


async def test_an_output_that_cannot_be_encoded_fails_its_entry_only(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before: a handler output orjson cannot encode (a Decimal) crashed the worker, and
    one invoice stopped the step for every invoice. Now that entry is dead-lettered at
    once (`output_not_serializable`), its run ends failed, the others go on."""
    keys = StreamKeys(prefix)
    p = Pipeline("inv", ingress=["invoice"])
    calls: list[str] = []

    @p.step("price", consumes=["invoice"], produces=["priced"])
    async def price(message: Message) -> Output:
        calls.append(message.correlation_id)
        total: Any = Decimal("12.50") if message.data.get("decimal") else 12.5
        return Output("priced", {"total": total})

    async with running(client, keys, p) as manager, \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        bad = await runs.submit({"decimal": True})
        good = await runs.submit({"decimal": False})
        failed = await runs.result(bad, timeout=15)
        assert failed.status == "failed"
        assert failed.data["reason_code"] == "output_not_serializable"
        assert "Decimal" in failed.data["error"]
        assert (await runs.result(good, timeout=15)).status == "priced"
        assert states(manager) == {"price": "running"}
    assert calls.count(bad) == 1, "not retried: it would fail the same way"
    (letter,) = await dead_letters(client, keys, 1)
    assert letter["reason_code"] == "output_not_serializable"
    assert failed.data["dlq_id"] == letter["id"]


async def test_sys_exit_in_a_handler_fails_that_entry_only(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before: `sys.exit()` in a handler (argparse inside a library) took the step down
    for good, and a healthy slow entry of the same worker was dead-lettered with it.
    Now it is an entry failure: retried, then dead-lettered with the error; the slow
    entry finishes; the worker keeps running."""
    keys = StreamKeys(prefix)
    p = Pipeline("x", ingress=["in"])
    slow_started = asyncio.Event()

    @p.step("step", consumes=["in"], produces=["out"], concurrency=2)
    async def step(message: Message) -> Output:
        if message.data["kind"] == "exit":
            await slow_started.wait()
            sys.exit(2)
        if message.data["kind"] == "interrupt":
            raise KeyboardInterrupt
        slow_started.set()
        await asyncio.sleep(0.5)
        return Output("out", message.data)

    async with running(client, keys, p, max_deliveries=3) as manager, \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        slow = await runs.submit({"kind": "slow"})
        exits = await runs.submit({"kind": "exit"})
        interrupt = await runs.submit({"kind": "interrupt"})
        assert (await runs.result(slow, timeout=15)).status == "out"
        for run, error in ((exits, "SystemExit: 2"), (interrupt, "KeyboardInterrupt")):
            result = await runs.result(run, timeout=15)
            assert result.status == "failed"
            assert result.data["error"] == error
            assert result.data["reason_code"] == "max_deliveries_exceeded"
        assert states(manager) == {"step": "running"}
        assert manager.get_status()["step"]["restarts"] == 0
    letters = await dead_letters(client, keys, 2)
    assert {letter["deliveries"] for letter in letters} == {"3"}
    assert all("Traceback" in letter["traceback"] for letter in letters)


async def test_worker_crashed_is_the_one_deliberate_crash(
    client: aioredis.Redis, prefix: str
) -> None:
    """`WorkerCrashed` raised by user code crashes its worker on purpose: the entry is
    handed back unacknowledged (still pending), not dead-lettered."""
    keys = StreamKeys(prefix)
    p = Pipeline("c", ingress=["in"])

    @p.step("step", consumes=["in"], produces=["out"])
    async def step(message: Message) -> Output:
        raise WorkerCrashed("the client this step holds is beyond repair")

    async with running(client, keys, p) as manager:
        await client.xadd(keys.stream("in"), {"data": "{}", "correlation_id": "r1"})
        async def failed() -> bool:
            return states(manager)["step"] == WorkerState.FAILED.value

        await wait_for(failed, timeout=10, message="worker failed")
        pending = await client.xpending(keys.stream("in"), "step")
        assert pending["pending"] == 1
        assert await client.xlen(keys.dlq) == 0


async def test_a_hung_handler_is_cancelled_at_the_step_timeout(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before: no step timeout; a hung model call held its entry for ever. Now the call
    is cancelled at `timeout`, retried, then dead-lettered with `timeout`; the run ends
    failed and the worker handles the next entry."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])
    cancelled = 0

    @p.step("model", consumes=["in"], produces=["out"], timeout=0.3)
    async def model(message: Message) -> Output:
        nonlocal cancelled
        if message.data.get("hang"):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled += 1
                raise
        return Output("out", message.data)

    async with running(client, keys, p) as manager, \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        hung = await runs.submit({"hang": True})
        fine = await runs.submit({"hang": False})
        result = await runs.result(hung, timeout=15)
        assert result.status == "failed"
        assert result.data["reason_code"] == "timeout"
        assert "timeout of 0.3 s" in result.data["error"]
        assert (await runs.result(fine, timeout=15)).status == "out"
        assert states(manager) == {"model": "running"}
    assert cancelled == 2  # max_deliveries 2: both calls cancelled


async def test_a_handler_that_swallows_its_cancellation_still_times_out(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])

    @p.step("stubborn", consumes=["in"], produces=["out"], timeout=0.2)
    async def stubborn(message: Message) -> Output:
        with contextlib.suppress(asyncio.CancelledError):  # a library that swallows it
            await asyncio.Event().wait()
        return Output("out", {"late": True})

    async with running(client, keys, p, max_deliveries=1) as manager, \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        run = await runs.submit({})
        result = await runs.result(run, timeout=15)
        assert result.status == "failed" and result.data["reason_code"] == "timeout"
        assert states(manager) == {"stubborn": "running"}
    assert await client.xlen(keys.stream("out")) == 0


async def test_a_call_that_never_ends_after_its_cancellation_is_given_up_on(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): a handler that swallowed every cancellation held
    its step's one running place for ever, its entry was claimed back again and again
    (deliveries past max_deliveries) and never dead-lettered, and its run and every run
    after it never ended. Now the call is given up on a while after its cancellation:
    the entry is redelivered, then dead-lettered with `timeout`, and the step goes on."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])
    let_go = asyncio.Event()  # the test's own way to end the stubborn calls at its end
    calls = 0

    @p.step("stubborn", consumes=["in"], produces=["out"], timeout=0.3)
    async def stubborn(message: Message) -> Output:
        nonlocal calls
        if message.data.get("stubborn"):
            calls += 1
            while not let_go.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.05)
        return Output("out", message.data)

    try:
        async with running(client, keys, p, visibility_timeout=1.0, abandon_after=0.3) as manager, \
                Client(redis_url, stream_prefix=prefix, app=p) as runs:
            stuck = await runs.submit({"stubborn": True})
            plain = await runs.submit({"plain": 1})
            result = await runs.result(stuck, timeout=20)
            assert result.status == "failed" and result.data["reason_code"] == "timeout"
            assert "abandoned" in result.data["error"]
            assert (await runs.result(plain, timeout=20)).status == "out"
            [letter] = [f for _, f in await client.xrange(keys.dlq)]
            assert int(letter["deliveries"]) <= 3  # max_deliveries 2 (+1: found over)
            assert calls == 2
            assert states(manager) == {"stubborn": "running"}
            pending = await client.xpending(keys.stream("in"), "stubborn")
            assert pending["pending"] == 0
            after = await runs.submit({"plain": 2})
            assert (await runs.result(after, timeout=20)).status == "out"
            let_go.set()  # the stubborn calls end, so the stop does not wait for them
    finally:
        let_go.set()
    assert await client.xlen(keys.stream("out")) == 2  # the given-up calls committed nothing


async def test_a_blocking_call_past_its_timeout_fails_with_timeout(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): a handler that blocked the event loop past its
    timeout (``time.sleep``) could not be cancelled, and its result was committed. Now
    a call that returns past its timeout fails with `timeout` all the same."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])

    @p.step("blocking", consumes=["in"], produces=["out"], timeout=0.2)
    async def blocking(message: Message) -> Output:
        if message.deliveries == 1:
            time.sleep(0.5)  # noqa: ASYNC251 - the point of the test
        return Output("out", {"delivery": message.deliveries})

    async with running(client, keys, p) as manager, \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        run = await runs.submit({})
        result = await runs.result(run, timeout=15)
        assert result.status == "out" and result.data == {"delivery": 2}
        assert states(manager) == {"blocking": "running"}
    error = await client.get(keys.last_error("blocking", keys.stream("in"), (
        await client.xrange(keys.stream("in")))[0][0]))
    assert error is not None and "without giving the event loop a turn" in error


async def test_nan_is_not_json_it_is_not_written_as_null(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): an output holding NaN was written with ``null`` in
    its place, silently. Now it is not serializable (dead-lettered at once), and a
    submit holding one is refused before anything is written."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])

    @p.step("score", consumes=["in"], produces=["out"])
    async def score(message: Message) -> Output:
        return Output("out", {"score": float("nan") if message.data.get("nan") else 0.5})

    async with running(client, keys, p), \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        bad = await runs.submit({"nan": True})
        result = await runs.result(bad, timeout=15)
        assert result.status == "failed"
        assert result.data["reason_code"] == "output_not_serializable"
        assert "NaN" in result.data["error"]
        assert (await runs.result(await runs.submit({}), timeout=15)).data == {"score": 0.5}
        with pytest.raises(InvalidInput) as refused:
            await runs.submit({"x": [float("inf")]})
        assert [r.field for r in refused.value.reasons] == ["data"]
    assert await client.xlen(keys.stream("out")) == 1


async def test_a_run_id_the_data_names_holds_to_the_rule_of_run_ids(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): ``run_id`` was checked, but the same id named by
    the data's correlation field got in with a tab or 300 characters."""
    p = Pipeline("t", ingress=["in"], correlation_field="job_id")

    @p.step("echo", consumes=["in"], produces=["out"])
    async def echo(message: Message) -> Output:
        return Output("out", message.data)

    async with Client(redis_url, stream_prefix=prefix, app=p) as runs:
        for bad in ("q\tq", "x" * 300):
            with pytest.raises(InvalidInput) as refused:
                await runs.submit({"job_id": bad})
            assert [r.field for r in refused.value.reasons] == ["job_id"]
        assert await runs.submit({"job_id": "job-1"}) == "job-1"
    assert await client.xlen(StreamKeys(prefix).stream("in")) == 1


async def test_a_cost_that_would_pay_back_a_budget_fails_its_call(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): a handler could report -1000 and spend past a
    hard limit after it. Now a negative, NaN or infinite amount raises in the handler."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"], cost_units=["usd"])

    @p.step("pay", consumes=["in"], produces=["out"], cost_units=["usd"])
    async def pay(message: Message) -> Output:
        amount = message.data["amount"]  # NaN and infinity travel as text (not JSON)
        message.report_cost("usd", float(amount) if isinstance(amount, str) else amount)
        return Output("out", {})

    async with running(client, keys, p), \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        for amount in (-1000, float("nan"), float("inf")):
            result = await runs.result(await runs.submit({"amount": amount}
                                                         if amount == -1000 else
                                                         {"amount": str(amount)}), timeout=15)
            assert result.status == "failed", (amount, result)
            assert "not a finite amount of at least 0" in result.data["error"]
        assert (await runs.result(await runs.submit({"amount": 2}), timeout=15)).cost == {
            "usd": 2}


async def test_a_loops_blocking_work_past_its_timeout_is_a_failed_attempt(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """Before (found by a hostile run): a Loop's work that blocked past the loop's
    timeout, but returned within the step's, had its result taken."""
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])
    p.add(Loop("draft", consumes="in", produces="out", max_attempts=1, timeout=0.2,
               work=lambda message: time.sleep(0.4) or "late",
               validate=lambda message: []))

    async with running(client, keys, p), \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        result = await runs.result(await runs.submit({}), timeout=15)
    assert result.status == "exhausted", result
    assert await client.xlen(keys.stream("out")) == 0


async def test_concurrency_bounds_the_handlers_running_at_once(
    client: aioredis.Redis, prefix: str
) -> None:
    """Before: `concurrency=1` sent 8 model requests at once (every prefetched entry ran
    as a task). Now prefetch reads ahead and never runs ahead."""
    keys = StreamKeys(prefix)
    p = Pipeline("c", ingress=["in"])
    running_now = most = 0

    @p.step("model", consumes=["in"], produces=["out"], concurrency=1)
    async def model(message: Message) -> Output:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await asyncio.sleep(0.01)
        running_now -= 1
        return Output("out", message.data)

    for n in range(8):
        await client.xadd(keys.stream("in"), {"data": json.dumps({"n": n})})
    async with running(client, keys, p):
        await wait_for(lambda: _at_least(client, keys.stream("out"), 8), timeout=15,
                       message="8 outputs")
    assert most == 1


async def _at_least(client: aioredis.Redis, key: str, n: int) -> bool:
    return int(await client.xlen(key)) >= n


async def test_the_last_error_survives_a_restart(
    client: aioredis.Redis, prefix: str
) -> None:
    """Before: an entry that failed, then came back after a restart past its deliveries,
    was dead-lettered as `delivered 6 times (limit 5)` with no error. Now the last error
    is kept in the server and its dead letter carries it, and says plainly that the entry
    went past its limit (not "(limit 1)", read as if it were within it)."""
    keys = StreamKeys(prefix)
    p = Pipeline("e", ingress=["in"])

    @p.step("step", consumes=["in"], produces=["out"])
    async def step(message: Message) -> Output:
        raise AttributeError("'NoneType' object has no attribute 'text'")

    await client.xadd(keys.stream("in"), {"data": "{}", "correlation_id": "r-restart"})
    # The first process fails the entry once and stops during the (long) backoff.
    async with running(client, keys, p, max_deliveries=5, retry_backoff_ms=60_000):
        await wait_for(lambda: _any_last_error(client, prefix), timeout=10,
                       message="the error kept")
    # The next one finds it delivered once too often (here: its limit is 1).
    async with running(client, keys, p, max_deliveries=1, visibility_timeout=0.2,
                       claim_interval=0.05):
        (letter,) = await dead_letters(client, keys, 1)
    assert letter["error"].startswith("AttributeError: 'NoneType' object has no attribute")
    said = letter["error"].rpartition(" (delivered ")[2]
    assert said.endswith(" times, over its limit of 1)"), letter["error"]
    assert "Traceback" in letter["traceback"]
    assert not await _any_last_error(client, prefix), "the record goes with the dead letter"
    (ended,) = await failed_runs(client, keys)
    assert ended["correlation_id"] == "r-restart"


async def _any_last_error(client: aioredis.Redis, prefix: str) -> bool:
    return bool([k async for k in client.scan_iter(f"{prefix}:lasterr:*")])


async def test_a_dead_letter_after_the_outcome_ends_nothing(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """A run that already ended (its outcome written) is not ended again by a dead
    letter of an entry written after it (a notifier's failure)."""
    keys = StreamKeys(prefix)
    p = Pipeline("n", ingress=["in"], outcomes=["done"])

    @p.step("finish", consumes=["in"], produces=["done"])
    async def finish(message: Message) -> Output:
        return Output("done", {"status": "succeeded"})

    @p.step("notify", consumes=["done"], produces=["sent"])
    async def notify(message: Message) -> Output:
        raise RuntimeError("webhook down")

    async with running(client, keys, p), \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        run = await runs.submit({})
        assert (await runs.result(run, timeout=10)).status == "succeeded"
        await dead_letters(client, keys, 1)
    assert await failed_runs(client, keys) == []


async def test_a_dead_letter_replayed_continues_its_run(
    client: aioredis.Redis, prefix: str, redis_url: str
) -> None:
    """A run ended `failed` by a dead letter goes on when the dead letter is replayed
    (once its cause is fixed): the run index files it as running again, then under the
    status of its next outcome, and no longer under `failed`."""
    keys = StreamKeys(prefix)
    p = Pipeline("r", ingress=["in"], outcomes=["done"])
    broken = True

    @p.step("step", consumes=["in"], produces=["done"])
    async def step(message: Message) -> Output:
        if broken:
            raise RuntimeError("model down")
        return Output("done", {"status": "succeeded"})

    reads = RunIndexReader(keys)
    async with running(client, keys, p), \
            Client(redis_url, stream_prefix=prefix, app=p) as runs:
        run = await runs.submit({})
        assert (await runs.result(run, timeout=15)).status == "failed"
        assert [r["status"] for r in await reads.find(client, run)] == ["failed"]
        (letter,) = await dead_letters(client, keys, 1)
        broken = False
        replayed = await replay_dead_letter(client, keys, letter["id"], p.correlation_field)
        assert replayed["replayed"]

        async def succeeded() -> bool:
            return [r["status"] for r in await reads.find(client, run)] == ["succeeded"]

        await wait_for(succeeded, timeout=15, message="the run's next outcome")
    failed_page, _ = await reads.page(client, status="failed")
    assert run not in [r["run_id"] for r in failed_page]
