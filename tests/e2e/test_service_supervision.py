"""A user's own pipeline under ``printery-workers --app``: a crashing worker is restarted
in supervised mode, ``failed`` after ``--max-restarts``, and ends the process with exit
1 in standalone mode (docs/reference.md, Commands; Running workers)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import spawn

# Written the way the README tells users to: only the public API. A handler exception
# would only retry its entry; a companion that raises crashes the worker itself.
CRASHING_APP = textwrap.dedent(
    """
    import asyncio

    from printery import Message, Pipeline, Step

    pipeline = Pipeline("crashy", ingress=["job"])


    async def handle(msg: Message) -> None:
        return None


    async def crash(worker: object) -> None:
        await asyncio.sleep(0.3)
        raise RuntimeError("companion boom")


    pipeline.add(
        Step(name="crasher", consumes=("job",), produces=(), handler=handle, companions=[crash])
    )
    """
)


def _app(tmp_path: Path) -> Path:
    (tmp_path / "crashapp.py").write_text(CRASHING_APP)
    return tmp_path


def test_supervised_restarts_then_failed(server: ServerProcess, tmp_path: Path) -> None:
    cwd = _app(tmp_path)
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("sup"),
         "--app", "crashapp:pipeline", "--supervised", "--max-restarts", "2", "--backoff", "50"],
        cwd=cwd,
    )
    try:
        seen: set[int] = set()

        def failed() -> bool:
            worker = svc.json("/status")["workers"]["crasher"]
            seen.add(int(worker["restarts"]))
            return bool(worker["state"] == "failed")

        svc.wait_until(failed, timeout=20, what="crasher failed")
        worker = svc.json("/status")["workers"]["crasher"]
        assert worker["restarts"] == 2
        assert "companion boom" in (worker["last_error"] or "")
        assert max(seen) == 2
        assert svc.get("/readyz").status_code == 503
        assert svc.proc.poll() is None  # supervised: the process goes on
        metrics = svc.get("/metrics").text
        assert 'printery_worker_restarts_total{worker="crasher"} 2.0' in metrics
        assert "ALERT worker failed" in svc.log()
    finally:
        assert svc.stop() == 0


def test_standalone_crash_exits_1(server: ServerProcess, tmp_path: Path) -> None:
    cwd = _app(tmp_path)
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("solo"),
         "--app", "crashapp:pipeline"],
        cwd=cwd, wait=False,
    )
    assert svc.wait(timeout=20) == 1
    assert "crasher" in svc.log() and "worker failed" in svc.log()


def test_exit_on_failure_in_supervised_mode(server: ServerProcess, tmp_path: Path) -> None:
    cwd = _app(tmp_path)
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("eof"),
         "--app", "crashapp:pipeline", "--supervised", "--max-restarts", "1", "--backoff", "50",
         "--exit-on-failure"],
        cwd=cwd, wait=False,
    )
    assert svc.wait(timeout=20) == 1


SLOW_APP = textwrap.dedent(
    """
    import asyncio

    from printery import Message, Pipeline

    pipeline = Pipeline("slow", ingress=["job"])


    @pipeline.step("sleeper", consumes=["job"])
    async def sleeper(msg: Message) -> None:
        await asyncio.sleep(60)
    """
)


def test_second_sigint_exits_at_once(server: ServerProcess, tmp_path: Path) -> None:
    import signal
    import time

    import redis

    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    prefix = unique_prefix("int2")
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", prefix, "--app", "slowapp:pipeline",
         "--shutdown-timeout", "30"],
        cwd=tmp_path,
    )
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        r.xadd(f"{prefix}:job", {"data": "{}"})
        svc.wait_until(
            lambda: svc.json("/status")["workers"]["sleeper"]["pending"] >= 1
            or r.xpending(f"{prefix}:job", "sleeper")["pending"] >= 1,
            what="entry in flight",
        )
        svc.proc.send_signal(signal.SIGINT)
        svc.wait_until(lambda: "shutdown requested" in svc.log(), what="drain started")
        started = time.monotonic()
        code = svc.stop(signal.SIGINT, timeout=10)
        assert code == 130
        assert time.monotonic() - started < 5
        # Nothing lost: the entry is still pending, for redelivery.
        assert r.xpending(f"{prefix}:job", "sleeper")["pending"] == 1
    finally:
        r.close()
        svc.kill()
