"""The chaos soak (``make chaos``): the in-suite chaos run, longer and bigger.

    python -m tests.chaos.soak --duration 600 --deployments 20000
    python -m tests.chaos.soak --cluster --duration 300 --deployments 5000

Prints the figures (deployments, kills, restarts, duplicates found, lost) and exits 1
when any guarantee was broken.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from tests.chaos.cluster import run_cluster_chaos
from tests.chaos.driver import Figures, run_chaos


async def _run(args: argparse.Namespace, workdir: Path) -> Figures:
    """The chaos run; SIGTERM (a CI timeout, `kill`) cancels it like Ctrl-C, so its
    clean-up stops the services and the server instead of leaving them running."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if args.cluster:
        return await run_cluster_chaos(
            workdir, deployments=args.deployments, duration=args.duration, seed=args.seed,
            kill_every=args.kill_every, processes=args.processes, partitions=args.partitions,
            log=lambda text: print(text, flush=True),
        )
    return await run_chaos(
        workdir, deployments=args.deployments, duration=args.duration, seed=args.seed,
        kill_every=args.kill_every, processes=args.processes,
        log=lambda text: print(text, flush=True),
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak")
    parser.add_argument("--duration", type=float, default=600.0,
                        help="seconds of chaos (kills, a server restart, a connection cut)")
    parser.add_argument("--deployments", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--cluster", action="store_true",
                        help="on a 3-master Valkey Cluster: kill -9 of a master instead of "
                             "the server restart and the connection cut")
    parser.add_argument("--partitions", type=int, default=3, help="with --cluster")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="printery-chaos-"))
    print(f"chaos soak: {args.deployments} deployments, {args.processes} processes, "
          f"{args.duration:.0f}s of chaos; logs in {workdir}", flush=True)
    try:
        figures = asyncio.run(_run(args, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: services and server stopped", flush=True)
        return 130
    print(figures.line(), flush=True)
    print("OK" if figures.ok else "GUARANTEE BROKEN", flush=True)
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
