"""Composition fuzz (issue 30): hypothesis draws small pipelines (plain steps, gates,
validation loops with fallbacks and reviews, joins, budgets, limits) and what goes
wrong in each run (raise, hang past the step timeout, ``sys.exit``, output JSON cannot
encode, a validator answering None, garbage entries, replays), runs them against the
real server and checks the invariants of docs/reference.md (Failures, Runs, Budgets, Flow
control) after every example: see ``support/composition.py``.

``make test`` runs 100 examples (derandomized: the same ones every time; they draw every
kind, mode, decision, change and setting the strategies have, as the first 200 did);
``make chaos``
(``pytest --long -m long``) 2,000 random ones, with handlers that also stall the event
loop past the visibility timeout, and 100 with the workers in two processes, one killed
(-9) mid-run. A failure prints the drawn example (and hypothesis the
``@reproduce_failure`` blob). The tests at the end reproduce what the fuzz found."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import structlog
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from printery import (
    RUN_FAILED,
    Aggregator,
    ConsumerSettings,
    Message,
    Output,
    Pipeline,
    ReplayError,
    WorkerManager,
    any_pass,
    replay,
)
from printery.runs.facade import Runs
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.composition import (
    CRASHING,
    STALLING,
    Built,
    Example,
    Figures,
    examples,
    run_example,
    summary,
)
from support.composition_proc import Processes

HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


@pytest.fixture(scope="module", autouse=True)
def quiet_logs() -> Iterator[None]:
    """Every example fails entries on purpose: their error logs (tracebacks rendered
    for each) would take most of the time. Nothing is cached under this configuration,
    and the one before is put back."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                        cache_logger_on_first_use=False)
    yield
    structlog.configure(**before)


def _run(url: str, example: Example, seen: list[Figures]) -> None:
    text = example.describe()
    note(text)
    print(text)  # shown with the failure (pytest prints the captured output)
    seen.append(asyncio.run(run_example(url, example)))


# Each fuzz test runs its hypothesis search inside (``fuzz()``), so that it can report the
# figures of all its examples once the search ends: to the summary printed at the end of
# the session (the ``figures`` section), from the test that drew them.


@pytest.mark.timeout(900)
def test_composed_pipelines_keep_the_invariants(server: ServerProcess,
                                                report_figures: Callable[[str], None]) -> None:
    seen: list[Figures] = []

    @settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=HEALTH,
              print_blob=True)
    @given(example=examples())
    def fuzz(example: Example) -> None:
        _run(server.url, example, seen)

    fuzz()
    report_figures(summary(seen))


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_composed_pipelines_keep_the_invariants_long(server: ServerProcess,
                                                     report_figures: Callable[[str], None]) -> None:
    seen: list[Figures] = []

    @settings(max_examples=2000, deadline=None, suppress_health_check=HEALTH, print_blob=True)
    @given(example=examples(max_runs=4, modes=STALLING))
    def fuzz(example: Example) -> None:
        _run(server.url, example, seen)

    fuzz()
    report_figures(summary(seen))


# -- what the fuzz found (minimal reproductions; the fuzz keeps the strategies) -------------


async def test_a_dead_letter_after_a_join_finished_at_its_deadline_ends_nothing(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("j", ingress=["in"])

    @p.step("slow", consumes=["in"], produces=["in:a"], timeout=0.2)
    async def slow(message: Message) -> Output:
        await asyncio.Event().wait()
        raise AssertionError("cancelled at the step timeout")

    @p.step("fast", consumes=["in"], produces=["in:b"])
    async def fast(message: Message) -> Output:
        return Output("in:b", message.data)

    p.add(Aggregator("join", opens="in", opens_as="opened", branches={"in:a": "a", "in:b": "b"},
                     emits="done", policy=any_pass(passed=lambda branch, data: branch == "a"),
                     deadline=0.3))
    manager = WorkerManager()
    for worker, deps in p.build_workers(client=client, keys=keys, settings=ConsumerSettings(
            block_ms=50, retry_backoff_ms=5, max_deliveries=2)):
        manager.register(worker, deps)
    await manager.start_all()
    runs = Runs(client, keys, p, payload_limit=1 << 20)
    try:
        run, _ = await runs.submit({})
        await wait_for(lambda: client.xlen(keys.stream("done")), timeout=10, message="done")
        await wait_for(lambda: client.xlen(keys.dlq), timeout=10, message="the dead letter")
        ended = await client.xrange(keys.stream(RUN_FAILED))
        assert ended == [], f"the run {run} ended at its deadline, and then failed"
    finally:
        await runs.close()
        await manager.stop_all(2)


async def test_replay_passes_over_an_entry_that_never_decoded(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("x", ingress=["in"])

    @p.step("first", consumes=["in"], produces=["mid"])
    async def first(message: Message) -> Output:
        return Output("mid", message.data)

    @p.step("second", consumes=["mid"], produces=["out"])
    async def second(message: Message) -> Output:
        return Output("out", message.data)

    await client.xadd(keys.stream("mid"), {"correlation_id": "r1", "data": "{not json"})
    await client.xadd(keys.stream("mid"), {"correlation_id": "r1", "data": json.dumps({"n": 1})})
    try:
        result = await replay(client, keys, p, "r1", "second")
    except ReplayError:
        return  # refusing is fine too: with a ReplayError the CLI can report
    assert len(result.entries) == 1


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_composed_pipelines_survive_a_kill_9(server: ServerProcess, tmp_path: Path,
                                             report_figures: Callable[[str], None]) -> None:
    """The same, with the workers in two processes, one of them killed (-9) once the
    streams hold ``kill_at`` entries and replaced; what it held is claimed by the others."""
    seen: list[Figures] = []

    @settings(max_examples=100, deadline=None, suppress_health_check=HEALTH, print_blob=True)
    @given(example=examples(modes=CRASHING), kill_at=st.integers(1, 15))
    def fuzz(example: Example, kill_at: int) -> None:
        text = f"{example.describe()}\nkill -9 at {kill_at} entries"
        note(text)
        print(text)

        def processes(keys: StreamKeys, built: Built) -> Processes:
            return Processes(server.url, keys, built, example.shape, tmp_path / "procs")

        seen.append(asyncio.run(run_example(server.url, example, workers=processes,
                                            kill_at=kill_at)))

    fuzz()
    report_figures(summary(seen))


@pytest.mark.timeout(900)
def test_composed_pipelines_blame_only_the_crasher(server: ServerProcess, tmp_path: Path,
                                                   report_figures: Callable[[str], None]) -> None:
    """Handlers that kill their process (``os._exit``) among healthy ones, the workers in
    two processes replaced as they die: only a crasher's entry is dead-lettered for the
    deaths, every run ends (``make chaos`` draws crashes among every other mode, with a
    kill -9 on top)."""
    seen: list[Figures] = []

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=HEALTH,
              print_blob=True)
    @given(example=examples(max_runs=3, modes=st.sampled_from(["ok", "ok", "crash", "raise"])))
    def fuzz(example: Example) -> None:
        text = example.describe()
        note(text)
        print(text)

        def processes(keys: StreamKeys, built: Built) -> Processes:
            return Processes(server.url, keys, built, example.shape, tmp_path / "procs")

        seen.append(asyncio.run(run_example(server.url, example, workers=processes)))

    fuzz()
    report_figures(summary(seen))


async def test_a_worker_whose_loop_stalled_past_the_visibility_timeout_goes_on(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("t", ingress=["in"])
    calls: list[tuple[int, int]] = []

    @p.step("model", consumes=["in"], produces=["out"], timeout=0.2)
    async def model(message: Message) -> Output:
        calls.append((message.data["n"], message.deliveries))
        if message.data["block"]:
            if message.deliveries == 1:
                time.sleep(1.5)  # noqa: ASYNC251 - a stalled loop, past the visibility
            await asyncio.Event().wait()
        return Output("out", message.data)

    manager = WorkerManager()
    for worker, deps in p.build_workers(client=client, keys=keys, settings=ConsumerSettings(
            block_ms=50, retry_backoff_ms=5, max_deliveries=2, visibility_timeout=1.0,
            claim_interval=0.1)):
        manager.register(worker, deps)
    await manager.start_all()
    runs = Runs(client, keys, p, payload_limit=1 << 20)
    try:
        ended = {}
        for n, block in enumerate((True, False)):  # the second once the first ended
            run, _ = await runs.submit({"n": n, "block": block})
            with contextlib.suppress(TimeoutError):
                ended[block] = (await runs.reader.result(run, timeout=6)).status
        pending = await client.xpending(keys.stream("in"), "model")
        assert ended == {True: "failed", False: "out"}, (ended, calls, pending)
        assert [n for n, _ in calls].count(0) == 2, f"called after its dead letter: {calls}"
    finally:
        await runs.close()
        await manager.stop_all(2)
