"""Budgets across real service processes (docs/reference.md, Budgets): the run's spent is
exactly the cost of the calls whose outputs committed, through a kill -9; the soft warning
is written once; no handler runs once the hard limit is reached; a ``review`` budget waits
for a person, whose approval raises the limit and runs the held entry, and whose rejection
ends the run with ``budget:exceeded``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import redis

from printery import Client
from printery.inbox.reviews import approve, reject
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys
from support import budget_app
from support.operator_cli import cli
from support.service import ServiceHandle, spawn

TESTS = Path(__file__).resolve().parents[1]
#: The support apps beside this checkout's printery (not whichever one is installed).
PYTHONPATH = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)


def _service(server: ServerProcess, prefix: str, app: str, tmp_path: Path) -> ServiceHandle:
    config = tmp_path / "printery.toml"
    config.write_text("[transport]\nvisibility_timeout = 1.0\n")
    return spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--config", str(config),
                  "--app", f"support.budget_app:{app}"],
                 env={"BUDGET_APP_REDIS": server.url, "PYTHONPATH": PYTHONPATH}, cwd=tmp_path)


def _submit(r: redis.Redis, prefix: str, run: str, numbers: range) -> None:
    for n in numbers:
        r.xadd(f"{prefix}:job", {"data": json.dumps({"n": n}), "run_id": run,
                                 "idempotency_key": f"job:{run}:{n}"})


def _settled(r: redis.Redis, prefix: str) -> bool:
    """Every job entry delivered to ``work`` and acknowledged."""
    (group,) = r.xinfo_groups(f"{prefix}:job")
    return bool(group["pending"] == 0 and group["last-delivered-id"]
                == r.xinfo_stream(f"{prefix}:job")["last-generated-id"])


def _spent(r: redis.Redis, prefix: str, run: str) -> float:
    return decode_spent(r.hget(StreamKeys(prefix).budget(run), "usd"))


def _entries(r: redis.Redis, prefix: str, event_type: str) -> list[dict[str, Any]]:
    return [fields for _, fields in r.xrange(f"{prefix}:{event_type}")]


def test_spent_is_exact_through_a_kill_and_nothing_runs_past_the_limit(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix, run = unique_prefix("budget"), "run-1"
    r = redis.Redis.from_url(server.url, decode_responses=True)
    first = _service(server, prefix, "stopping", tmp_path)
    second = _service(server, prefix, "stopping", tmp_path)
    try:
        _submit(r, prefix, run, range(8))
        first.wait_until(lambda: r.xlen(f"{prefix}:calls") >= 4, what="calls in flight")
        first.stop(signal.SIGKILL)  # kill -9 mid-run: its calls in flight never commit
        second.wait_until(lambda: _settled(r, prefix), timeout=30, what="jobs settled")
        done = _entries(r, prefix, "done")
        assert sorted(json.loads(f["data"])["n"] for f in done) == list(range(8))
        costs = sum(json.loads(f["cost"])["usd"] for f in done)
        assert _spent(r, prefix, run) == costs == 8
        for n in (8, 9):  # one at a time up to the limit (10)
            _submit(r, prefix, run, range(n, n + 1))
            second.wait_until(lambda: _settled(r, prefix), timeout=30, what="job settled")
        assert _spent(r, prefix, run) == 10
        calls = r.xlen(f"{prefix}:calls")
        _submit(r, prefix, run, range(10, 14))
        second.wait_until(lambda: _settled(r, prefix), timeout=30, what="jobs settled")
        assert r.xlen(f"{prefix}:calls") == calls, "no handler runs once the limit is reached"
        done = _entries(r, prefix, "done")
        assert len(done) == 10 and _spent(r, prefix, run) == 10
        (exceeded,) = _entries(r, prefix, "budget:exceeded")
        assert json.loads(exceeded["data"]) == {"status": "budget_exceeded", "unit": "usd",
                                                "limit": 10, "spent": 10}
        assert exceeded["run_id"] == run
        (warning,) = _entries(r, prefix, "budget:warning")
        assert json.loads(warning["data"])["spent"] == 5 and warning["run_id"] == run
        metrics = second.get("/metrics").text
        assert 'printery_budget_events_total{level="exceeded"} 1.0' in metrics
    finally:
        first.kill()
        assert second.stop() == 0, second.log()


async def test_review_approval_raises_the_limit_and_rejection_ends_the_run(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, run = unique_prefix("budget-review"), "run-2"
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = _service(server, prefix, "reviewed", tmp_path)
    pipeline = budget_app.reviewed
    try:
        async with Client(server.url, stream_prefix=prefix, app=pipeline) as client:
            for n in range(3):  # one at a time: the limit (2) is reached exactly
                _submit(r, prefix, run, range(n, n + 1))
                svc.wait_until(lambda: _settled(r, prefix), timeout=30, what="job settled")
            assert _spent(r, prefix, run) == 2 and r.xlen(f"{prefix}:calls") == 2
            (held,) = r.xrange(f"{prefix}:review")
            review_id, fields = held
            assert fields["kind"] == "budget_exceeded" and fields["step"] == "work"
            assert json.loads(fields["data"]) == {"n": 2}

            await approve(client.redis, client.keys, pipeline, review_id, by="ops")
            svc.wait_until(lambda: r.xlen(f"{prefix}:calls") == 3, what="held entry ran")
            svc.wait_until(lambda: _spent(r, prefix, run) == 3, what="held entry committed")
            _submit(r, prefix, run, range(3, 4))  # the limit is now 4: this one runs
            svc.wait_until(lambda: _spent(r, prefix, run) == 4, what="next entry committed")
            _submit(r, prefix, run, range(4, 5))
            svc.wait_until(lambda: r.xlen(f"{prefix}:review") == 1, what="held again")
            (review_id, _), = r.xrange(f"{prefix}:review")
            await reject(client.redis, client.keys, pipeline, review_id, by="ops", note="enough")
            result = await client.result(run, timeout=20)
        assert result.status == "budget_exceeded"
        assert result.data["unit"] == "usd" and result.data["limit"] == 4
        assert sorted(json.loads(f["data"])["n"] for f in _entries(r, prefix, "done")) == [0, 1, 2, 3]
        assert r.xlen(f"{prefix}:calls") == 4
        monkeypatch.setenv("PYTHONPATH", PYTHONPATH)  # for the operator command's --app
        app = ["--app", "support.budget_app:reviewed"]
        code, out, err = await cli(server.url, prefix, *app, "cost", run, "--json")
        assert code == 0, err
        # The limit raised once (2 + 2): the warning threshold is soft x the raised limit.
        assert json.loads(out)["budget"] == [{"step": "", "unit": "usd", "spent": 4.0,
                                              "reserved": 0.0, "limit": 4.0, "soft": 3.2,
                                              "status": "exceeded"}]
        assert json.loads(out)["budget_limits"] == "workers"
        code, out, err = await cli(server.url, prefix, *app, "cost", run)
        assert code == 0, err
        assert "exceeded" in out and "warn_at" in out and "reserved" in out
    finally:
        assert svc.stop() == 0, svc.log()
