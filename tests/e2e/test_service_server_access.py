"""How ``printery-workers`` and ``printery`` reach the server (issue 14 items 3 and 10): a
unix socket works; credentials or an ACL the server refuses at start exit 2 with one line
naming the setting; an unreachable server is waited for, one log line per attempt, with
``/healthz`` up and ``/readyz`` 503 saying why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from printery.testing import unique_prefix
from printery.transport.server import ServerProcess, free_port
from support.acl import acl_rule
from support.service import base_env, spawn, started_entry


@pytest.fixture
def socket_server() -> Iterator[tuple[ServerProcess, str]]:
    """A server listening on a unix socket too (in a short directory: socket paths are
    limited to about 100 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="prt-", dir="/tmp"))
    path = directory / "redis.sock"
    proc = ServerProcess(directory / "data",
                         extra_args=["--unixsocket", str(path), "--unixsocketperm", "700"])
    proc.start()
    try:
        yield proc, str(path)
    finally:
        proc.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _operator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "printery.cli.operator", *args], env=base_env(),
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_service_and_operator_over_a_unix_socket(
    socket_server: tuple[ServerProcess, str], tmp_path: Path
) -> None:
    server, path = socket_server
    prefix = unique_prefix("unix")
    url = f"unix://{path}"
    svc = spawn(["--redis-url", url, "--stream-prefix", prefix], cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready over unix")
        r.xadd(f"{prefix}:deployment:started", started_entry("dep-unix-1"))
        svc.wait_until(lambda: r.xlen(f"{prefix}:notification:sent") == 1,
                       what="deployment through the socket")
        done = _operator("--redis-url", url, "--stream-prefix", prefix, "streams", "--json")
        assert done.returncode == 0, done.stderr
        names = {s["stream"] for s in json.loads(done.stdout)}
        assert f"{prefix}:deployment:started" in names, done.stdout
        assert "TypeError" not in svc.log() + done.stderr
    finally:
        r.close()
        code = svc.stop()
    assert code == 0, svc.log()
