"""A run's event stream, its order and its status over real HTTP (docs/reference.md, The
API: /v1; Failures): the ``/v1`` API and the console served in-process on 127.0.0.1 over
the session's Valkey, with the run's entries written into the streams by the test, at the
ids it chooses (entries of several streams in one millisecond, as one commit writes
them)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from printery.pipeline.dag import Pipeline
from printery.runs.apps import load_app
from printery.runs.facade import Runs
from printery.runtime.run_index import RunIndex
from printery.servers.process import ServerProcess
from printery.service.access import Access, ConsoleAuth
from printery.service.api import build_api
from printery.service.console.routes import add_console
from printery.service.console.views import Views
from printery.service.http import HttpServer
from printery.wire.keys import DLQ, RUN_FAILED, StreamKeys

LIMIT = 65536


class Provider:
    """What ``/status`` and friends answer: not under test here."""

    async def status(self) -> dict[str, Any]:
        return {}

    async def readiness(self) -> tuple[bool, list[str]]:
        return True, []

    def metrics(self) -> bytes:
        return b""


@dataclass
class Served:
    http: httpx.AsyncClient
    redis: aioredis.Redis
    runs: Runs
    keys: StreamKeys
    pipeline: Pipeline

    async def add(self, event_type: str, run: str, data: Any, entry_id: str = "*", *,
                  producer: str = "test", **more: str) -> str:
        """Write one complete entry of ``run`` as a step would, at ``entry_id``."""
        fields = self.runs.codec.new_fields(event_type, data, correlation_id=run,
                                            producer=producer, more=more or None)
        return str(await self.redis.xadd(self.keys.of(run).stream(event_type), fields,
                                         id=entry_id))

    async def commit(self, run: str, ms: int, *outputs: tuple[str, Any, dict[str, str]]) -> None:
        """Several entries of ``run`` written at once, all at ``<ms>-0``: one commit."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for event_type, data, more in outputs:
                fields = self.runs.codec.new_fields(event_type, data, correlation_id=run,
                                                    producer=more.pop("producer", "test"),
                                                    more=more or None)
                pipe.xadd(self.keys.of(run).stream(event_type), fields, id=f"{ms}-0")
            await pipe.execute()


@pytest.fixture
async def served(server: ServerProcess, prefix: str) -> AsyncIterator[Served]:
    settings, pipeline = load_app(None, {"redis_url": server.url, "stream_prefix": prefix}, {})
    conn = aioredis.Redis.from_url(server.url, decode_responses=True)
    runs = Runs(conn, settings.keys, pipeline, payload_limit=LIMIT, producer="printery-api")
    access = Access(token=None, public=False)
    http_server = HttpServer(
        Provider(), api=build_api(runs, access, body_limit=LIMIT),
        console=lambda app: add_console(
            app, Views(runs), ConsoleAuth(access, conn, settings.keys,
                                          session_ttl=settings.console.session_ttl),
            body_limit=LIMIT))
    port = await http_server.start("127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield Served(http, conn, runs, settings.keys, pipeline)
    await http_server.stop()
    await runs.close()
    await conn.aclose()


@dataclass
class Event:
    id: str
    data: dict[str, Any]


class EventStream:
    """One ``GET /v1/runs/{id}/events``, read an event at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()
        self.retry: int | None = None

    async def next(self) -> Event | None:
        """The next event, None once the server closed the stream."""
        fields: dict[str, str] = {}
        async for line in self.lines:
            if not line:
                if "data" in fields:
                    return Event(fields.get("id", ""), json.loads(fields["data"]))
                fields = {}
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            if name == "retry":
                self.retry = int(fields[name])
        return None

    async def rest(self) -> list[Event]:
        found = []
        while (event := await self.next()) is not None:
            found.append(event)
        return found


def events(served: Served, run: str, last_event_id: str | None = None) -> Any:
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    return served.http.stream("GET", f"/v1/runs/{run}/events", headers=headers)


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_reconnect_resumes_after_exactly_the_last_event(served: Served) -> None:
    """Entries of one commit share their id across streams: each event's ``id:`` is
    still unique, and a reconnect with ``Last-Event-ID`` mid-run skips nothing and
    repeats nothing, also of the entries of that commit; after the outcome was sent a
    reconnect is 204, which stops an EventSource."""
    run, t = "dep-resume", now_ms()
    await served.add("deployment:started", run, {"deployment_id": run}, f"{t}-0")
    await served.commit(run, t + 1, ("deployment:validated", {"deployment_id": run}, {}))
    await served.commit(run, t + 2, ("dependencies:checked", {"ok": True}, {}),
                        ("health:checked", {"ok": True}, {}))
    async with events(served, run) as response:
        assert response.status_code == 200
        stream = EventStream(response)
        first = [await stream.next() for _ in range(3)]  # the commit's first entry only
        assert stream.retry is not None and stream.retry > 0
    assert all(e is not None for e in first)
    got = [e for e in first if e is not None]
    assert [e.data["stream"] for e in got[:2]] == ["deployment:started", "deployment:validated"]
    assert got[2].data["id"] == f"{t + 2}-0"
    assert got[2].id.startswith(f"{got[2].data['stream']}/{t + 2}-0")

    async with events(served, run, got[-1].id) as response:
        assert response.status_code == 200
        stream = EventStream(response)
        other = await stream.next()  # the commit's other entry, not skipped
        assert other is not None and other.data["id"] == f"{t + 2}-0"
        # The run goes on while the stream is open: the outcome and what follows it.
        await served.commit(run, t + 3, ("deployment:finished", {"status": "succeeded"}, {}),
                            ("notification:sent", {"sent": True}, {}))
        rest = [other, *await stream.rest()]
    pair = ["dependencies:checked", "health:checked"]
    if got[2].data["stream"] != pair[0]:
        pair.reverse()
    assert [e.data["stream"] for e in got + rest] == [
        "deployment:started", "deployment:validated", *pair, "deployment:finished"]
    every = got + rest
    assert len({e.id for e in every}) == len(every)  # unique within the run

    async with events(served, run, rest[-1].id) as response:
        assert response.status_code == 204  # the outcome was sent: stop reconnecting
    # From a mid-run id again: exactly what follows it, the same ids.
    async with events(served, run, got[1].id) as response:
        again = await EventStream(response).rest()
    assert [(e.id, e.data["id"]) for e in again] == [(e.id, e.data["id"]) for e in every[2:]]
    # Without an id: the whole run from its first entry, the same events.
    async with events(served, run) as response:
        whole = await EventStream(response).rest()
    assert [e.id for e in whole] == [e.id for e in every]


async def test_an_id_this_server_did_not_write_starts_from_the_first(served: Served) -> None:
    run, t = "dep-foreign-id", now_ms()
    await served.add("deployment:started", run, {"deployment_id": run}, f"{t}-0")
    await served.commit(run, t + 1, ("deployment:finished", {"status": "succeeded"}, {}))
    for foreign in ("garbage", f"{t + 1}-0", "deployment:finished/not-an-id"):
        async with events(served, run, foreign) as response:
            assert response.status_code == 200
            found = await EventStream(response).rest()
        assert [e.data["stream"] for e in found] == ["deployment:started",
                                                     "deployment:finished"], foreign


async def test_entries_of_one_millisecond_come_in_causal_order(served: Served) -> None:
    """A whole run in one millisecond, every entry at the same id: the order follows the
    pipeline's graph (``notification:sent`` after the ``deployment:finished`` it
    answers), the same in ``GET /v1/runs/{id}``, the event stream (history and live),
    ``result`` and ``watch``."""
    expected = ["deployment:started", "deployment:validated", "dependencies:checked",
                "health:checked", "deployment:finished", "notification:sent"]
    # Written in the reverse order, in one transaction.
    outputs = [(t, {"deployment_id": "x"} if t == "deployment:started" else
                {"status": "succeeded"} if t == "deployment:finished" else {}, {})
               for t in reversed(expected)]
    run = "dep-one-ms"
    await served.commit(run, now_ms(), *outputs)
    body = (await served.http.get(f"/v1/runs/{run}")).json()
    assert [e["stream"] for e in body["entries"]] == expected
    assert body["status"] == "succeeded"
    async with events(served, run) as response:
        found = await EventStream(response).rest()
    assert [e.data["stream"] for e in found] == expected[:-1]  # ends after the outcome
    result = await served.runs.reader.result(run, timeout=10)
    assert result.status == "succeeded"
    assert [e["stream"] for e in result.entries] == expected[:-1]

    # Live: the stream is open before the commit.
    live = "dep-one-ms-live"
    await served.add("deployment:started", live, {"deployment_id": live})
    async with events(served, live) as response:
        stream = EventStream(response)
        assert (await stream.next()) is not None
        await served.commit(live, now_ms() + 1, *outputs[:-1])
        rest = await stream.rest()
    assert [e.data["stream"] for e in rest] == expected[1:-1]
    watched = [e["stream"] async for e in served.runs.reader.follow(live)]
    assert watched == expected[:-1]


async def test_unknown_run_is_404_for_its_events_too(served: Served) -> None:
    for path in ("/v1/runs/dep-nobody", "/v1/runs/dep-nobody/events"):
        answer = await served.http.get(path)
        assert answer.status_code == 404, path
        assert answer.headers["content-type"].startswith("application/json")
        body = answer.json()
        assert set(body) == {"error", "detail"} and body["error"] == "unknown_run", path
    for path in ("/v1/nothing-here", "/v1/reviews/1-0/approve"):  # no route; GET where POST is
        body = (await served.http.get(path)).json()
        assert set(body) == {"error", "detail"}, path


async def test_a_run_ended_by_run_failed_is_failed_until_a_replay_ends_it_again(
    served: Served,
) -> None:
    """The dead-letter transaction writes ``dlq`` and ``run:failed`` (docs/reference.md,
    Failures): the run is ``failed`` in ``/v1/runs/{id}``, the event stream, ``result``,
    the console's run page and runs list. A replay of the dead letter goes on: the next
    outcome is the run's status, and the event stream continues up to it."""
    pipeline, keys = served.pipeline, served.keys
    run, _ = await served.runs.submit({"service": "billing-api", "version": "1.0.0",
                                       "environment": "development", "requested_by": "alice"},
                                      run_id="dep-fails")
    t = now_ms() + 1
    await served.commit(run, t, ("deployment:validated", {"deployment_id": run},
                                 {"producer": "validator"}))
    # The runtime's dead-letter transaction: the dlq entry, run:failed, the run index.
    failed = {"status": "failed", "step": "health-monitor", "reason_code": "timeout",
              "error": "timed out", "dlq_id": f"{t + 1}-0"}
    await served.commit(run, t + 1, (DLQ, {"deployment_id": run},
                                     {"worker": "health-monitor", "reason_code": "timeout",
                                      "producer": "validator"}),
                        (RUN_FAILED, failed, {"producer": "health-monitor"}))
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    mark = index.mark(keys.stream("deployment:validated"), run,
                      [(keys.stream(RUN_FAILED), {"data": json.dumps(failed)})])
    assert mark is not None
    async with served.redis.pipeline(transaction=True) as pipe:
        for command in index.writes([mark]):
            pipe.execute_command(*command)
        await pipe.execute()

    body = (await served.http.get(f"/v1/runs/{run}")).json()
    assert body["status"] == "failed"
    steps = {s["step"]: s["status"] for s in body["steps"]}
    assert steps["health-monitor"] == "failed"
    async with events(served, run) as response:
        streamed = await EventStream(response).rest()
    assert [e.data["stream"] for e in streamed][-2:] == [DLQ, RUN_FAILED]
    assert (await served.runs.reader.result(run, timeout=10)).status == "failed"
    page = (await served.http.get(f"/runs/{run}")).text
    assert 'id="run-status">failed<' in page
    listed = (await served.http.get("/runs?status=failed")).text
    assert f'href="/runs/{run}"' in listed and 'class="status failed">failed<' in listed
    async with events(served, run, streamed[-1].id) as response:
        assert response.status_code == 204

    # `dlq replay`: the entry runs again and the run ends with its next outcome; until
    # then it stays failed (its outcome was sent: a reconnect is still 204).
    await served.commit(run, t + 2, ("health:checked", {"ok": True},
                                     {"producer": "health-monitor"}))
    await served.commit(run, t + 3, ("dependencies:checked", {"ok": True},
                                     {"producer": "dependency-checker"}))
    assert (await served.http.get(f"/v1/runs/{run}")).json()["status"] == "failed"
    async with events(served, run, streamed[-1].id) as response:
        assert response.status_code == 204
    await served.commit(run, t + 4, ("deployment:finished", {"status": "succeeded"},
                                     {"producer": "aggregator"}))
    async with events(served, run, streamed[-1].id) as response:
        assert response.status_code == 200  # the run went on after the outcome sent
        went_on = await EventStream(response).rest()
    assert [e.data["stream"] for e in went_on] == ["health:checked", "dependencies:checked",
                                                   "deployment:finished"]
    assert (await served.http.get(f"/v1/runs/{run}")).json()["status"] == "succeeded"
    result = await served.runs.reader.result(run, timeout=10)
    assert result.status == "succeeded" and result.entries[-1]["stream"] == "deployment:finished"
    assert RUN_FAILED in [e["stream"] for e in result.entries]
    assert 'id="run-status">succeeded<' in (await served.http.get(f"/runs/{run}")).text
