"""Flow control (docs/reference.md, Flow control): limits held across real processes,
measured where the handlers' calls arrive, at a real HTTP server the test runs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import Limit, PipelineError, StreamWorker
from printery.observe.metrics import Metrics, MetricsObserver
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Message, Output
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from printery.transport.limit_store import WAIT_FOR_SLOT, Ask, Bound, LimitStore, Report
from printery.wire.keys import StreamKeys
from support.spine import publish, running

TESTS = Path(__file__).resolve().parents[1]


class CountingAPI:
    """A real HTTP server counting the requests in flight; ``hold`` keeps the first
    request open until set."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[tuple[float, int]] = []
        self.hold: asyncio.Event | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append((time.monotonic(), int(request.query["n"])))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold is not None and len(self.arrivals) == 1:
                await self.hold.wait()
            elif self.delay:
                await asyncio.sleep(self.delay)
            return web.json_response({"ok": True})
        finally:
            self.in_flight -= 1


@pytest.fixture
async def api() -> AsyncIterator[CountingAPI]:
    counting = CountingAPI()
    app = web.Application()
    app.router.add_get("/call", counting.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    counting.url = f"http://{host}:{port}/call"
    yield counting
    await runner.cleanup()


class Limited:
    """``support.limited_proc`` processes; killed at the end of the test."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.url = url
        self.logdir = logdir
        self.procs: list[tuple[subprocess.Popen[str], Path]] = []

    def spawn(self, prefix: str, api: str, args: tuple[str, ...], window: float | None
              ) -> tuple[subprocess.Popen[str], Path]:
        self.logdir.mkdir(parents=True, exist_ok=True)
        out = self.logdir / f"{len(self.procs)}.out"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
        if window is not None:
            args = (*args, "--window", str(window))
        with out.open("w") as stdout, (self.logdir / f"{len(self.procs)}.err").open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "support.limited_proc", self.url, prefix, api, *args],
                stdout=stdout, stderr=err, text=True, env=env)
        self.procs.append((proc, out))
        return proc, out

    async def start(self, prefix: str, api: str, *args: str, window: float | None = None
                    ) -> subprocess.Popen[str]:
        proc, out = self.spawn(prefix, api, args, window)

        async def ready() -> bool:
            return "ready" in out.read_text().splitlines()

        await wait_for(ready, timeout=15, message="limited process ready")
        return proc

    def kill_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def limited(server: ServerProcess, tmp_path: Path) -> Iterator[Limited]:
    procs = Limited(server.url, tmp_path / "limited")
    yield procs
    procs.kill_all()


async def outputs(client: aioredis.Redis, keys: StreamKeys) -> int:
    return int(await client.xlen(keys.stream("out")))


async def test_concurrency_holds_across_two_processes_of_ten_consumers(
    client: aioredis.Redis, prefix: str, api: CountingAPI, limited: Limited
) -> None:
    keys = StreamKeys(prefix)
    api.delay = 0.05
    for _ in range(2):
        await limited.start(prefix, api.url, "--consumers", "10", "--concurrency", "3")
    await publish(client, keys, "in", 60)
    await wait_for(lambda: _at_least(client, keys, 60), timeout=60, message="60 outputs")
    assert len(api.arrivals) == 60
    # Never more than 3 at once; and the limit, not a lack of work, is what bounded it.
    assert api.max_in_flight == 3


async def _at_least(client: aioredis.Redis, keys: StreamKeys, n: int) -> bool:
    return await outputs(client, keys) >= n


async def test_requests_per_minute_hold_over_a_measured_window(
    client: aioredis.Redis, prefix: str, api: CountingAPI, limited: Limited
) -> None:
    """With the window shortened to 2 s (the contract's 60 s would make this test last
    minutes), 3 requests per window across two processes: no 2 s span sees a 4th start,
    and each window admits again once the oldest start leaves it."""
    keys = StreamKeys(prefix)
    window, rpm = 2.0, 3
    for _ in range(2):
        await limited.start(prefix, api.url, "--consumers", "5", "--rpm", str(rpm),
                            window=window)
    await publish(client, keys, "in", 9)
    await wait_for(lambda: _at_least(client, keys, 9), timeout=30, message="9 outputs")
    starts = sorted(at for at, _ in api.arrivals)
    assert len(starts) == 9
    # A request reaches the server a little after the server admitted it: 0.2 s slack.
    spans = [starts[i + rpm] - starts[i] for i in range(len(starts) - rpm)]
    assert min(spans) > window - 0.2, spans


async def test_waiting_keeps_the_lease_counts_no_delivery_and_shows(
    client: aioredis.Redis, prefix: str
) -> None:
    """A handler holds the one slot; the other entry waits for three visibility timeouts:
    it stays delivered once (its lease renewed, nobody claims it), ``/status`` shows it
    waiting and the wait lands in ``printery_limit_wait_seconds``."""
    keys = StreamKeys(prefix)
    release = asyncio.Event()
    seen: dict[int, int] = {}

    async def handler(msg: Message) -> Output:
        seen[msg.data["n"]] = msg.deliveries
        if not release.is_set():
            await release.wait()
        return Output("out", msg.data)

    metrics = Metrics(process_metrics=False)
    visibility = 0.6
    worker = StreamWorker(
        "w", client=client, keys=keys, consumes=["in"], handler=handler,
        settings=ConsumerSettings(concurrency=2, block_ms=100, visibility_timeout=visibility,
                                  claim_interval=0.05),
        observer=MetricsObserver(metrics), limits=[Limit("api", concurrency=1)],
    )
    async with running(worker) as manager:
        await publish(client, keys, "in", 2)

        async def one_waits() -> bool:
            limits = manager.get_status()["w"].get("limits", {})
            return bool(limits) and limits["api"]["waiting"] == 1 and len(seen) == 1

        await wait_for(one_waits, timeout=10, message="one entry waiting for the limit")
        # The subject is time passing: three visibility timeouts in which a lost lease
        # would let the claim loop take the waiting entry again (a second delivery).
        await asyncio.sleep(3 * visibility)
        pending = await client.xpending_range(keys.stream("in"), "w", min="-", max="+", count=10)
        assert [row["times_delivered"] for row in pending] == [1, 1]
        assert manager.get_status()["w"]["limits"]["api"]["waiting"] == 1
        release.set()
        await wait_for(lambda: _at_least(client, keys, 2), timeout=10, message="2 outputs")
        assert seen == {0: 1, 1: 1}
    text = metrics.render().decode()
    assert 'printery_limit_wait_seconds_count{limit="api"} 2.0' in text
    waited = next(line for line in text.splitlines()
                  if line.startswith('printery_limit_wait_seconds_sum{limit="api"}'))
    assert float(waited.split()[-1]) >= 3 * visibility


async def test_a_killed_process_gives_its_slot_back_within_the_visibility_timeout(
    client: aioredis.Redis, prefix: str, api: CountingAPI, limited: Limited
) -> None:
    keys = StreamKeys(prefix)
    api.hold = asyncio.Event()  # the first call never returns: its process dies holding it
    visibility = 2.0
    victim = await limited.start(prefix, api.url, "--concurrency", "1",
                                 "--visibility", str(visibility))
    await publish(client, keys, "in", 1)
    await wait_for(lambda: _arrived(api, 1), timeout=10, message="the victim's call")
    slots = keys.limit("api") + ":slots"
    (holder, expiry), = await client.zrange(slots, 0, -1, withscores=True)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    seconds, micros = await client.time()
    # The slot lapses with the lease the dead process last renewed, by the server's clock.
    assert expiry <= seconds * 1000 + micros / 1000 + visibility * 1000
    await limited.start(prefix, api.url, "--concurrency", "1", "--visibility", str(visibility))
    await publish(client, keys, "in", 1, start=1)
    await wait_for(lambda: _at_least(client, keys, 2), timeout=30, message="both outputs")
    assert sorted(n for _, n in api.arrivals) == [0, 0, 1]
    assert holder not in await client.zrange(slots, 0, -1)
    api.hold.set()


async def test_a_killed_processs_slot_is_given_back_once_its_death_is_known(
    client: aioredis.Redis, prefix: str, api: CountingAPI, limited: Limited
) -> None:
    """A process of this host killed (SIGKILL) holding the one slot, under a visibility
    timeout of 120 s: the next process takes its entry at once (its pid is gone) and,
    waiting for the slot, finds the dead process's gate holding it and gives it back;
    both entries are done long before the dead slot's lease would lapse."""
    keys = StreamKeys(prefix)
    api.hold = asyncio.Event()  # the first call never returns: its process dies holding it
    visibility = 120.0
    victim = await limited.start(prefix, api.url, "--concurrency", "1",
                                 "--visibility", str(visibility))
    await publish(client, keys, "in", 1)
    await wait_for(lambda: _arrived(api, 1), timeout=10, message="the victim's call")
    slots = keys.limit("api") + ":slots"
    (holder,) = await client.zrange(slots, 0, -1)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    await limited.start(prefix, api.url, "--concurrency", "1", "--visibility", str(visibility))
    await publish(client, keys, "in", 1, start=1)
    # A quarter of the visibility timeout: the lease of the dead slot runs for all of it.
    await wait_for(lambda: _at_least(client, keys, 2), timeout=visibility / 4,
                   message="both outputs, before the dead process's slot lapsed")
    assert sorted(n for _, n in api.arrivals) == [0, 0, 1]
    assert holder not in await client.zrange(slots, 0, -1)
    api.hold.set()


async def _arrived(api: CountingAPI, n: int) -> bool:
    return len(api.arrivals) >= n


def test_a_limit_refuses_what_limits_nothing_or_is_not_a_number() -> None:
    with pytest.raises(PipelineError, match="limits nothing"):
        Limit("api")
    with pytest.raises(PipelineError, match="concurrency=0"):
        Limit("api", concurrency=0)
    with pytest.raises(PipelineError, match=r"requests_per_minute=2\.5"):
        Limit("api", requests_per_minute=2.5)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="neither a string nor a function"):
        Limit(42)  # type: ignore[arg-type]


async def test_a_gates_report_gives_back_what_a_lost_reply_admitted(
    client: aioredis.Redis, prefix: str
) -> None:
    """The server keeps one count per gate, and a gate's report is the truth: slots that a
    request admitted but whose reply never arrived (so the gate never used them) come
    back with the gate's next request, instead of staying taken until the lease lapses."""
    store = LimitStore(client, window_ms=60_000, lease_ms=60_000)
    bound = Bound(StreamKeys(prefix).limit("api"), 3, 0, 0)
    try:
        assert await store.apply("a", [], [Ask(5, [bound])]) == [(3, WAIT_FOR_SLOT)]
        assert await store.apply("b", [], [Ask(1, [bound])]) == [(0, WAIT_FOR_SLOT)]
        # Gate a's reply was lost: it holds nothing, and says so with its next request.
        assert await store.apply("a", [Report(bound.base, 0, 0.0)], []) == []
        assert await store.apply("b", [], [Ask(2, [bound])]) == [(2, 0)]
        assert await client.hgetall(bound.base + ":held") == {"b": "2"}
    finally:
        await store.close()


async def test_a_release_rides_with_the_next_admission_or_goes_alone_soon_after(
    client: aioredis.Redis, prefix: str
) -> None:
    """A busy gate sends one request per batch: a slot given back is reported with the
    next admission when one comes soon (with ``concurrency=1`` the next call is admitted
    by that same request), and on its own a moment later when none comes."""
    from printery.runtime.limit_gate import LimitGate
    from printery.runtime.observe import NullObserver

    keys = StreamKeys(prefix)
    store = LimitStore(client, window_ms=60_000, lease_ms=60_000)
    sent: list[int] = []
    apply = store.apply

    async def counted(gate: str, reports: list[Report], asks: list[Ask],
                      departed: list[tuple[str, str]]) -> list[tuple[int, int]]:
        sent.append(len(asks))
        return await apply(gate, reports, asks, departed)

    store.apply = counted  # type: ignore[method-assign]
    gate = LimitGate(store, keys, [Limit("api", concurrency=1)], worker="w",
                     observer=NullObserver())
    held = keys.limit("api") + ":held"
    try:
        (first,), _ = gate.tickets(1, ())
        await gate.try_admit([first])
        assert first.admitted and sent == [1]
        gate.release(first, {})
        for _ in range(3):  # turns of the loop, as a batch's commit gives it
            await asyncio.sleep(0)
        assert sent == [1]  # not sent on its own yet
        (second,), _ = gate.tickets(1, ())
        await gate.try_admit([second])
        assert second.admitted and sent == [1, 1]  # the release went with this admission
        gate.release(second, {})
        await wait_for(lambda: _held_by(client, held, 0), timeout=5.0,
                       message="the last release reported on its own")
        assert sent == [1, 1, 0]
    finally:
        await gate.close()


async def test_a_batch_cancelled_while_its_admission_is_on_the_wire_holds_nothing(
    client: aioredis.Redis, prefix: str
) -> None:
    """A batch drained (cancelled) while its one request is on the wire: the reply still
    admits its tickets, and the gate gives those slots back at once instead of holding
    them until it closes (nobody is left to release them)."""
    from printery.runtime.limit_gate import LimitGate
    from printery.runtime.observe import NullObserver

    keys = StreamKeys(prefix)
    store = LimitStore(client, window_ms=60_000, lease_ms=60_000)
    on_the_wire, answer, replied = asyncio.Event(), asyncio.Event(), asyncio.Event()
    replies: list[list[tuple[int, int]]] = []
    apply = store.apply

    async def held_back(gate: str, reports: list[Report], asks: list[Ask],
                        departed: list[tuple[str, str]]) -> list[tuple[int, int]]:
        if not asks:
            return await apply(gate, reports, asks, departed)
        on_the_wire.set()
        await answer.wait()
        replies.append(await apply(gate, reports, asks, departed))
        replied.set()
        return replies[-1]

    store.apply = held_back  # type: ignore[method-assign]
    gate = LimitGate(store, keys, [Limit("api", concurrency=3)], worker="w",
                     observer=NullObserver())
    held = keys.limit("api") + ":held"
    try:
        tickets, _ = gate.tickets(2, ())
        batch = asyncio.create_task(gate.try_admit(tickets))
        await asyncio.wait_for(on_the_wire.wait(), timeout=5.0)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        answer.set()  # the reply admits both after all
        await asyncio.wait_for(replied.wait(), timeout=5.0)
        assert replies == [[(2, 0)]]
        await wait_for(lambda: _held_by(client, held, 0), timeout=5.0,
                       message="the abandoned tickets' slots given back")
        assert not any(ticket.admitted for ticket in tickets)
    finally:
        await gate.close()


async def _held_by(client: aioredis.Redis, key: str, slots: int) -> bool:
    return sum(int(v) for v in (await client.hgetall(key)).values()) == slots
