"""A relay service in its own OS process, for multi-process, lease and crash-loop tests.

Usage: python -m support.relay_proc URL PREFIX [--delay S] [--visibility S] [--prefetch N]
       [--parallel N] [--max-deliveries N] [--drain S]

The handler sleeps ``--delay`` seconds, then relays ``data`` to ``out`` tagged with the
pid (field ``by``). An entry whose data has ``"crash": true`` kills the whole process
with ``os._exit(1)`` (no cleanup, no commit, nothing written). Each handler start is
reported on stdout as ``start <n>``; "ready" once the worker reads; it stops gracefully
on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from printery import ConsumerSettings, StreamWorker
from printery.runtime.handler import Message, Output
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for_sync
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys

TESTS = Path(__file__).resolve().parents[1]


class Proc:
    """A relay child whose stdout and stderr go to files the test reads."""

    def __init__(self, url: str, prefix: str, logdir: Path, *args: str) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.monotonic_ns()}"
        self.out_path = logdir / f"{stamp}.out"
        self.err_path = logdir / f"{stamp}.err"
        # The tests' own folder before what the caller's PYTHONPATH names (a worktree's src).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "support.relay_proc", url, prefix, *args],
                stdout=out, stderr=err, text=True, env=env,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def starts(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines() if line.startswith("start ")]

    def ready(self) -> bool:
        return "ready" in self.lines()

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, should the test have stopped it) and reap."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
        self.popen.wait(10)


class Relays:
    """The relay processes one test starts against one server; all are killed at its end."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.url = url
        self.logdir = logdir
        self.started: list[Proc] = []

    def start(self, prefix: str, *args: str, ready: bool = True) -> Proc:
        """Start a relay with ``args``; with ``ready``, wait until its worker reads."""
        proc = Proc(self.url, prefix, self.logdir, *args)
        self.started.append(proc)
        if ready:
            wait_for_sync(proc.ready, timeout=15, message=f"relay {proc.pid} ready")
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--visibility", type=float, default=2.0)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=0)
    parser.add_argument("--max-deliveries", type=int, default=5)
    parser.add_argument("--drain", type=float, default=10.0)
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    client = connect(args.url, block_ms=100)
    pid = str(os.getpid())

    async def handler(msg: Message) -> Output:
        data = msg.data if isinstance(msg.data, dict) else {}
        print(f"start {data.get('n')}", flush=True)
        if data.get("crash"):
            os._exit(1)
        if args.delay:
            await asyncio.sleep(args.delay)
        return Output("out", msg.data, extra={"by": pid})

    worker = StreamWorker(
        "w", client=client, keys=StreamKeys(args.prefix), consumes=["in"], handler=handler,
        settings=ConsumerSettings(
            block_ms=100, visibility_timeout=args.visibility, prefetch=args.prefetch,
            parallel=args.parallel or None, claim_interval=0.1,
            # Every prefetched entry's handler may run at once (what the lease tests
            # need); the one consumer reads them.
            in_flight=args.prefetch,
            max_deliveries=args.max_deliveries, retry_backoff_ms=20,
        ),
    )
    manager = WorkerManager(drain_timeout=args.drain)
    manager.register(worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await manager.start_all()
    print("ready", flush=True)
    await stop.wait()
    await manager.stop_all()
    await client.aclose()
    print("stopped", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    asyncio.run(main())
