"""A run's cost is what its calls spent (docs/reference.md, Replay and cost):
a dead letter is a copy of the entry that failed, with its producer's ``cost``, and
``dlq replay`` puts that copy back; neither adds to the run's cost. ``RunResult.cost``,
``GET /v1/runs/{id}``, ``printery cost RUN`` and the budget's ``spent`` agree before and
after any number of replays. And ``printery cost`` shows the limits the workers enforce
(recorded in the server at their start), not those of its own import of the app."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import redis

from printery import Client
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys
from support import cost_app
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

TESTS = Path(__file__).resolve().parents[1]
#: The support app beside this checkout's printery (not whichever one is installed).
PYTHONPATH = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
APP = "support.cost_app:pipeline"


def _service(server: ServerProcess, prefix: str, tmp_path: Path,
             env: dict[str, str] | None = None) -> ServiceHandle:
    return spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app", APP],
                 env={"PYTHONPATH": PYTHONPATH, **(env or {})}, cwd=tmp_path)


def _cli(server: ServerProcess, prefix: str, *args: str, tokens: str = "5000") -> str:
    """The operator tool, in an environment of its own (its import's budget: ``tokens``)."""
    done = cli_sync(server.url, prefix, "--app", APP, *args,
                    env={"PYTHONPATH": PYTHONPATH, "COST_APP_TOKENS": tokens})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _failures(r: redis.Redis, prefix: str) -> int:
    return int(r.xlen(f"{prefix}:run:failed"))


async def _figures(client: Client, svc: ServiceHandle, server: ServerProcess, prefix: str,
                   r: redis.Redis, run: str) -> dict[str, Any]:
    """The run's cost in tokens as each reader tells it."""
    result = await client.result(run, timeout=20)
    assert result.status == "failed"
    shown = svc.get(f"/v1/runs/{run}").json()
    summary = json.loads(_cli(server, prefix, "cost", run, "--json"))
    return {
        "RunResult.cost": result.cost.get("tokens"),
        "/v1 cost": shown["cost"].get("tokens"),
        "/v1 budget spent": shown["budget"][0]["spent"],
        "printery cost": summary["total"]["cost"].get("tokens"),
        "printery cost calls": summary["steps"]["ask"]["calls"] * cost_app.CALL_TOKENS,
        "printery cost budget spent": summary["budget"][0]["spent"],
        "budget spent": decode_spent(r.hget(StreamKeys(prefix).budget(run), "tokens")),
    }


async def test_a_dead_letter_and_its_replays_never_add_to_the_cost(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("cost-copies")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = _service(server, prefix, tmp_path)
    one_call = {"RunResult.cost": 100, "/v1 cost": 100, "/v1 budget spent": 100,
                "printery cost": 100, "printery cost calls": 100,
                "printery cost budget spent": 100, "budget spent": 100}
    try:
        async with Client(server.url, stream_prefix=prefix, app=cost_app.pipeline) as client:
            run = await client.submit({"q": "why"})
            assert await _figures(client, svc, server, prefix, r, run) == one_call
            for replays in (1, 2):
                [(letter, fields)] = r.xrange(f"{prefix}:dlq")
                assert fields["reason_code"] == "never_good" and "cost" in fields
                _cli(server, prefix, "dlq", "replay", letter)
                svc.wait_until(lambda n=replays: _failures(r, prefix) == n + 1,
                               what=f"the replayed entry dead-lettered again ({replays})")
                svc.wait_until(lambda: r.xlen(f"{prefix}:dlq") == 1, what="its dead letter")
                assert await _figures(client, svc, server, prefix, r, run) == one_call, replays
    finally:
        assert svc.stop() == 0, svc.log()
        r.close()



async def test_cost_shows_the_limits_the_workers_enforce(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("cost-limits")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = _service(server, prefix, tmp_path, {"COST_APP_TOKENS": "600"})
    try:
        async with Client(server.url, stream_prefix=prefix, app=cost_app.pipeline) as client:
            run = await client.submit({"q": "how much"})
            await client.result(run, timeout=20)
        # The operator tool's own import of the app says 5,000; the workers enforce 600.
        [row] = json.loads(_cli(server, prefix, "cost", run, "--json", tokens="5000"))["budget"]
        assert row == {"step": "", "unit": "tokens", "spent": 100.0, "reserved": 0.0,
                       "limit": 600.0, "soft": 300.0, "status": "ok"}
        shown = svc.get(f"/v1/runs/{run}").json()
        assert shown["budget"] == [row] and shown["budget_limits"] == "workers"
        text = _cli(server, prefix, "cost", run, tokens="5000")
        assert "600" in text and "5000" not in text and "import of the app" not in text
        # Nothing recorded (workers of an older version): the tool's import, and it says so.
        r.delete(StreamKeys(prefix).budget_limits)
        summary = json.loads(_cli(server, prefix, "cost", run, "--json", tokens="5000"))
        assert summary["budget_limits"] == "app" and summary["budget"][0]["limit"] == 5000
        assert "import of the app" in _cli(server, prefix, "cost", run, tokens="5000")
    finally:
        assert svc.stop() == 0, svc.log()
        r.close()
