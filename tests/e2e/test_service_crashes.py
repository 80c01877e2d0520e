"""Failures in the consume path as users hit them, under ``printery-workers --app``
(docs/reference.md, Failures; Running workers): a handler that raises ``WorkerCrashed``
crashes its worker on purpose (never lost in a background task), one that raises any other
``BaseException`` fails its entry only, and a handler's ordinary error keeps its traceback
in the log and in its ``dlq`` entry."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import redis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import ServiceHandle, spawn

# Only the public API, as the README shows. `fatal` crashes its worker on purpose
# (WorkerCrashed: its client is beyond repair); `exits` calls sys.exit, a BaseException
# that is not an Exception, which fails its entry only; `steady` is a second worker of
# the same process that must go on regardless; `buggy` has an ordinary bug (a KeyError).
APP = textwrap.dedent(
    """
    import sys

    from printery import Message, Output, Pipeline, WorkerCrashed


    class Fatal(WorkerCrashed):
        pass


    pipeline = Pipeline("fatal", ingress=["job", "work", "bug", "exit"])


    @pipeline.step("fatal", consumes=["job"])
    async def fatal(msg: Message) -> None:
        raise Fatal("the handler gave up the ghost")


    @pipeline.step("exits", consumes=["exit"])
    async def exits(msg: Message) -> None:
        sys.exit("argparse inside a library")


    @pipeline.step("steady", consumes=["work"], produces=["done"])
    async def steady(msg: Message) -> Output:
        return Output("done", msg.data)


    @pipeline.step("buggy", consumes=["bug"])
    async def buggy(msg: Message) -> None:
        return msg.data["missing_key"]
    """
)


def _app(tmp_path: Path) -> Path:
    (tmp_path / "fatalapp.py").write_text(APP)
    return tmp_path


def test_worker_crashed_crashes_the_worker_which_is_restarted_then_failed(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("fatal")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", prefix, "--app", "fatalapp:pipeline",
         "--supervised", "--max-restarts", "2", "--backoff", "50"],
        cwd=_app(tmp_path),
    )
    try:
        r.xadd(f"{prefix}:job", {"data": "{}"})
        seen: set[int] = set()

        def failed() -> bool:
            worker = svc.json("/status")["workers"]["fatal"]
            seen.add(int(worker["restarts"]))
            return bool(worker["state"] == "failed")

        svc.wait_until(failed, timeout=30, what="fatal worker failed")
        status = svc.json("/status")["workers"]
        assert status["fatal"]["restarts"] == 2 and max(seen) == 2
        assert "Fatal" in (status["fatal"]["last_error"] or "")
        ready = svc.get("/readyz")
        assert ready.status_code == 503
        assert "worker fatal is not healthy" in ready.json()["reasons"]
        assert "ALERT worker failed" in svc.log()
        assert 'printery_worker_restarts_total{worker="fatal"} 2.0' in svc.get("/metrics").text
        # The other workers go on.
        assert status["steady"]["state"] == "running"
        r.xadd(f"{prefix}:work", {"data": '{"n": 1}'})
        svc.wait_until(lambda: r.xlen(f"{prefix}:done") == 1, what="steady still works")
        # The entry is not lost: still pending, never acknowledged.
        assert r.xpending(f"{prefix}:job", "fatal")["pending"] == 1
        assert svc.proc.poll() is None
    finally:
        assert svc.stop() == 0
        r.close()


@pytest.mark.parametrize("mode", [
    [],  # standalone
    ["--supervised", "--max-restarts", "1", "--backoff", "50", "--exit-on-failure"],
], ids=["standalone", "exit-on-failure"])
def test_worker_crashed_ends_the_process_with_1(
    server: ServerProcess, tmp_path: Path, mode: list[str]
) -> None:
    prefix = unique_prefix("fatal-exit")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        r.xadd(f"{prefix}:job", {"data": "{}"})
        svc = spawn(
            ["--redis-url", server.url, "--stream-prefix", prefix, "--app", "fatalapp:pipeline",
             *mode],
            cwd=_app(tmp_path), wait=False,
        )
        assert svc.wait(timeout=30) == 1
        assert "worker failed: exiting 1: fatal" in svc.log()
        assert r.xpending(f"{prefix}:job", "fatal")["pending"] == 1, "the entry is kept"
    finally:
        r.close()


def test_a_handler_error_keeps_its_traceback_in_the_log_and_the_dlq_entry(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("trace")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    (tmp_path / "p.toml").write_text("[transport]\nmax_deliveries = 2\n")
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", prefix, "--app", "fatalapp:pipeline",
         "--config", str(tmp_path / "p.toml")],
        cwd=_app(tmp_path),
    )
    try:
        r.xadd(f"{prefix}:bug", {"data": '{"n": 7}'})
        svc.wait_until(lambda: r.xlen(f"{prefix}:dlq") == 1, timeout=30, what="dead letter")
        ((_, entry),) = r.xrange(f"{prefix}:dlq")
        # sys.exit in a handler fails its entry only: retried, dead-lettered, the process
        # and its workers go on.
        r.xadd(f"{prefix}:exit", {"data": '{"n": 8}'})
        svc.wait_until(lambda: r.xlen(f"{prefix}:dlq") == 2, timeout=30, what="dead letter")
        ((_, exited),) = r.xrange(f"{prefix}:dlq", "(" + r.xrange(f"{prefix}:dlq")[0][0])
        assert exited["error"] == "SystemExit: argparse inside a library"
        assert exited["worker"] == "exits" and exited["deliveries"] == "2"
        assert svc.json("/status")["workers"]["exits"]["state"] == "running"
        assert entry["error"] == "KeyError: 'missing_key'"
        assert entry["reason_code"] == "max_deliveries_exceeded"
        assert "fatalapp.py" in entry["traceback"] and ", line " in entry["traceback"]
        assert entry["traceback"].rstrip().endswith("KeyError: 'missing_key'")
        assert len(entry["traceback"]) <= 4100
        failures = [json.loads(line) for line in svc.log().splitlines()
                    if line.startswith("{") and '"handler failed"' in line]
        failures = [f for f in failures if f["worker"] == "buggy"]
        assert len(failures) == 2, "each failed delivery is logged"
        assert all(f["level"] == "error" for f in failures)
        assert all("fatalapp.py" in f["exception"] for f in failures)
    finally:
        assert svc.stop() == 0
        r.close()


STUBBORN_APP = textwrap.dedent(
    """
    import asyncio

    from printery import Message, Output, Pipeline

    pipeline = Pipeline("stubborn", ingress=["job"])


    @pipeline.step("stubborn", consumes=["job"], produces=["done"], timeout=0.5)
    async def stubborn(msg: Message) -> Output:
        if msg.data.get("stubborn"):
            print("stubborn call started", flush=True)
            while True:  # swallows every cancellation, as a careless retry loop does
                try:
                    await asyncio.sleep(3600)
                except BaseException:
                    continue
        return Output("done", msg.data)
    """
)


def _stubborn(server: ServerProcess, tmp_path: Path, shutdown_timeout: str) -> tuple[
    ServiceHandle, redis.Redis, str
]:
    """The stubborn app served (its call given up on 0.5 s after its timeout, not 5 s),
    a client of its server and the prefix; its first entry is stubborn."""
    prefix = unique_prefix("stubborn")
    (tmp_path / "stubbornapp.py").write_text(STUBBORN_APP)
    config = tmp_path / "stubborn.toml"
    config.write_text("[transport]\nabandon_after = 0.5\n")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app",
                 "stubbornapp:pipeline", "--shutdown-timeout", shutdown_timeout,
                 "--config", str(config)], cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    r.xadd(f"{prefix}:job", {"data": json.dumps({"stubborn": True})})
    return svc, r, prefix


def test_a_process_whose_handler_swallows_its_cancellation_still_exits(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Before (found by a hostile run): SIGTERM logged "service stopped", then the process
    ran on for ever (closing the event loop waits for every task, and the stubborn call
    never ends). Now the call is given up on at its timeout, the step goes on, and the
    process exits after its stop."""
    svc, r, prefix = _stubborn(server, tmp_path, "1")
    try:
        svc.wait_until(lambda: "abandoned" in svc.log(), timeout=30, what="the call given up on")
        r.xadd(f"{prefix}:job", {"data": json.dumps({"plain": 1})})
        svc.wait_until(lambda: r.xlen(f"{prefix}:done") == 1, what="the next entry handled")
        assert svc.stop(timeout=40) == 0
        assert "exiting without the tasks left behind" in svc.log()
    finally:
        svc.kill()
        r.close()


def test_a_stop_during_such_a_call_does_not_wait_out_the_drain(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Before (found by a hostile run): a SIGTERM before the call was given up on waited
    the whole --shutdown-timeout. Now the drain stops waiting once it is given up on
    (0.5 s after its timeout here), far within the 60 s drain asked for."""
    svc, r, _ = _stubborn(server, tmp_path, "60")
    try:
        svc.wait_until(lambda: "stubborn call started" in svc.log(), what="the call started")
        assert svc.stop(timeout=40) == 0
        assert "abandoned" in svc.log()
    finally:
        svc.kill()
        r.close()
