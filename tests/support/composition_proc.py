"""The composition fuzz's workers in OS processes of their own, for its kill -9 variant.

Usage: python -m support.composition_proc URL PREFIX SHAPE_JSON

Builds the pipeline of the drawn :class:`~support.composition.Shape` (JSON of
:func:`shape_json`) as ``support.composition.build`` does, runs its workers under a
standalone manager (short visibility timeout: what a killed process held is claimed
within a second), prints ``ready`` once they read, ``FAILED <worker> <error>`` should
one fail and ``over <what>`` for each handler start a Limit should have held back;
stops on SIGTERM (``stopped``; exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from printery import WorkerManager
from printery.runtime.payloads import PayloadStore
from printery.testing import wait_for
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys
from support.composition import (
    CRASH_ENV,
    CRASH_EXIT,
    INLINE_LIMIT,
    PAYLOAD_LIMIT,
    SETTINGS,
    Built,
    Shape,
    Stage,
    build,
)

TESTS = Path(__file__).resolve().parents[1]
#: A killed process's entries (and Limit slots) are claimed after this many seconds.
VISIBILITY = 0.5
PROC_SETTINGS = replace(SETTINGS, visibility_timeout=VISIBILITY, claim_interval=0.05)


def shape_json(shape: Shape) -> str:
    return json.dumps(dataclasses.asdict(shape))


def shape_of(text: str) -> Shape:
    raw = json.loads(text)
    stages = tuple(Stage(**{**s, "limit": tuple(s["limit"]) if s["limit"] else None})
                   for s in raw["stages"])
    return Shape(stages, tuple(raw["budget"]) if raw["budget"] else None,  # type: ignore[arg-type]
                 raw["partitions"], raw["estimate"])


class Proc:
    """One worker process; its stdout and stderr go to files."""

    def __init__(self, url: str, prefix: str, shape: Shape, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        stamp = time.monotonic_ns()
        self.out_path, self.err_path = logdir / f"{stamp}.out", logdir / f"{stamp}.err"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]), CRASH_ENV: "1"}
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "support.composition_proc", url, prefix,
                 shape_json(shape)], stdout=out, stderr=err, text=True, env=env)
        self.killed = False

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.killed = True
        self.popen.wait(10)


class Processes:
    """The example's workers in ``count`` processes at once (each runs every step: the
    groups share the work); :meth:`kill_one` kills one with SIGKILL and starts another."""

    def __init__(self, url: str, keys: StreamKeys, built: Built, shape: Shape, logdir: Path,
                 count: int = 2) -> None:
        self.url, self.keys, self.shape, self.logdir = url, keys, shape, logdir
        self.count = count
        self.procs: list[Proc] = []
        self.deaths = 0
        self._watch: asyncio.Task[None] | None = None

    async def _spawn(self) -> Proc:
        proc = Proc(self.url, self.keys.prefix, self.shape, self.logdir)
        self.procs.append(proc)

        async def ready() -> bool:
            if proc.popen.poll() == CRASH_EXIT:
                return True  # it ran, and a handler killed it: replaced like any death
            if proc.popen.poll() is not None:
                raise AssertionError(f"worker process exited {proc.popen.returncode}: "
                                     f"{proc.err_path.read_text()[-2000:]}")
            return "ready" in proc.lines()

        await wait_for(ready, timeout=30, interval=0.02, message="a worker process ready")
        return proc

    async def start(self) -> None:
        for _ in range(self.count):
            await self._spawn()
        self._watch = asyncio.create_task(self._restart_the_dead())

    async def _restart_the_dead(self) -> None:
        """What a supervisor does: a process that died (a handler's ``os._exit``) is
        replaced, so the others take its entries and the run goes on."""
        while True:
            await asyncio.sleep(0.05)
            for proc in list(self.procs):
                if not proc.killed and proc.popen.poll() is not None:
                    proc.killed = True  # gone: not stopped at the end, not a failure
                    self.deaths += 1
                    await self._spawn()

    async def kill_one(self) -> str:
        victim = next(p for p in self.procs if not p.killed)
        victim.kill()
        await self._spawn()
        return f"process {victim.popen.pid}"

    def states(self) -> dict[str, Any]:
        return {str(p.popen.pid): "killed" if p.killed else p.popen.poll() for p in self.procs}

    def problems(self) -> list[str]:
        return [f"{p.popen.pid}: {line}" for p in self.procs for line in p.lines()
                if line.startswith(("FAILED", "over"))]

    async def stop(self) -> list[str]:
        """SIGTERM the live ones and wait; what went wrong (exit codes, late reports)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for proc in self.procs:  # a replacement still starting when the watch stopped
            if not proc.killed and "ready" not in proc.lines():
                proc.kill()
        live = [p for p in self.procs if not p.killed and p.popen.poll() is None]
        for proc in live:
            proc.popen.send_signal(signal.SIGTERM)
        problems = []
        for proc in live:
            try:
                code = await asyncio.to_thread(proc.popen.wait, 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = -9
            if code != 0:
                problems.append(f"{proc.popen.pid} exited {code}: "
                                f"{proc.err_path.read_text()[-2000:]}")
        return problems + [line for line in self.problems() if line.split(": ", 1)[1]
                           .startswith("over")]


async def main(url: str, prefix: str, shape: Shape) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    keys = StreamKeys(prefix, partitions=shape.partitions)
    built = build(shape, os.environ.get("FUZZ_MODEL_URL", ""))
    client = connect(url, block_ms=PROC_SETTINGS.block_ms)
    manager = WorkerManager(supervised=False, drain_timeout=2)
    payloads = PayloadStore(client, keys, limit=PAYLOAD_LIMIT, inline_limit=INLINE_LIMIT)
    for worker, deps in built.pipeline.build_workers(client=client, keys=keys,
                                                     settings=PROC_SETTINGS, payloads=payloads):
        manager.register(worker, deps)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await manager.start_all()
    print("ready", flush=True)
    reported: set[str] = set()
    while not stop.is_set():
        for name, status in manager.get_status().items():
            if (status["state"] == "failed" or status["restarts"]) and name not in reported:
                reported.add(name)
                print(f"FAILED {name} {status['state']} {status['last_error']}", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    await manager.stop_all(2)
    await client.aclose()
    for line in built.probe.over:
        print(f"over {line}", flush=True)
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], shape_of(sys.argv[3])))
