"""The operator command (``printery.cli.operator``) run as a subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys


async def cli(url: str, prefix: str, *args: str) -> tuple[int, str, str]:
    """Run the operator CLI against ``url``/``prefix`` (given as flags, with REDIS_URL and
    STREAM_PREFIX removed from its environment); return its exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX", "PRINTERY_PARTITIONS")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "printery.cli.operator", "--redis-url", url,
        "--stream-prefix", prefix, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def cli_sync(url: str | None, prefix: str, *args: str, stdin: str | None = None,
             env: dict[str, str] | None = None,
             cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`cli` for synchronous tests; ``url`` None leaves ``--redis-url`` out."""
    base = [sys.executable, "-m", "printery.cli.operator"]
    if url is not None:
        base += ["--redis-url", url]
    full_env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX", "PRINTERY_PARTITIONS")}
    full_env.update(env or {})
    return subprocess.run([*base, "--stream-prefix", prefix, *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=full_env, cwd=cwd)
