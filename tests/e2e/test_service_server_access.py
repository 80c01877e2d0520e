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

from printery.servers.process import ServerProcess, free_port
from printery.testing import unique_prefix
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


PASSWORD = "right-Pa55-word"


@pytest.fixture
def acl_user(server: ServerProcess) -> Iterator[tuple[str, str]]:
    """A user of the session server allowed only ``test:acl-own:*`` keys: ``(user,
    prefix it may use)``."""
    prefix = unique_prefix("acl-own")
    user = f"svc-{prefix.rsplit(':', 1)[-1]}"
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", user, *acl_rule(prefix, PASSWORD))
    try:
        yield user, prefix
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def _refused(server: ServerProcess, url: str, prefix: str, tmp_path: Path) -> str:
    """Run the service until it exits on its own; assert exit 2 and one line naming
    ``redis_url`` without the password; return that line."""
    svc = spawn(["--redis-url", url, "--stream-prefix", prefix], cwd=tmp_path, wait=False)
    assert svc.wait(timeout=30) == 2, svc.log()
    named = [line for line in svc.log().splitlines() if "invalid redis_url" in line]
    assert len(named) == 1, svc.log()
    assert "wrong-pw" not in svc.log() and PASSWORD not in svc.log()
    return named[0]


def test_wrong_credentials_at_start_exit_2(
    server: ServerProcess, acl_user: tuple[str, str], tmp_path: Path
) -> None:
    user, prefix = acl_user
    url = f"redis://{user}:wrong-pw@127.0.0.1:{server.port}/0"
    line = _refused(server, url, prefix, tmp_path)
    assert "credentials" in line and f"{user}:***@" in line


def test_acl_refusal_at_start_exits_2(
    server: ServerProcess, acl_user: tuple[str, str], tmp_path: Path
) -> None:
    user, _ = acl_user
    url = f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"
    elsewhere = unique_prefix("acl-other")  # keys this user may not touch
    line = _refused(server, url, elsewhere, tmp_path)
    assert "ACL" in line and elsewhere in line


def test_unreachable_server_is_retried_with_a_line_per_attempt(tmp_path: Path) -> None:
    port = free_port()
    prefix = unique_prefix("late")
    svc = spawn(["--redis-url", f"redis://127.0.0.1:{port}/0", "--stream-prefix", prefix],
                cwd=tmp_path)  # waits for /healthz: up while the server is not
    late = ServerProcess(tmp_path / "late", port=port)
    try:
        svc.wait_until(lambda: svc.log().count("server not reachable: retrying") >= 3,
                       what="three logged attempts")
        ready = svc.get("/readyz")
        assert ready.status_code == 503
        assert any(f"127.0.0.1:{port}/0 is not reachable" in reason
                   for reason in ready.json()["reasons"]), ready.text
        attempts = [json.loads(line)["attempt"] for line in svc.log().splitlines()
                    if "server not reachable: retrying" in line]
        assert attempts[:3] == [1, 2, 3]
        late.start()  # the server comes up late: the service carries on
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, timeout=30,
                       what="ready once the server is up")
    finally:
        code = svc.stop()
        late.stop()
    assert code == 0, svc.log()


def test_restarts_leave_no_consumers_behind(server: ServerProcess, tmp_path: Path) -> None:
    """Issue 14 item 13: each run used to add its consumers to every group for good."""
    prefix = unique_prefix("restarts")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    started = f"{prefix}:deployment:started"
    try:
        for run in range(2):
            svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
            svc.wait_until(lambda svc=svc: svc.get("/readyz").status_code == 200, what="ready")
            r.xadd(started, started_entry(f"dep-restart-{run}"))
            svc.wait_until(lambda run=run: r.xlen(f"{prefix}:notification:sent") == run + 1,
                           what="deployment done")
            assert any(f":{svc.pid}:" in c["name"]
                       for c in r.xinfo_consumers(started, "validator"))
            assert svc.stop() == 0, svc.log()
            streams = list(r.scan_iter(f"{prefix}:*", _type="STREAM"))
            assert started in streams
            for stream in streams:
                for group in r.xinfo_groups(stream):
                    assert r.xinfo_consumers(stream, group["name"]) == [], (stream, svc.log())
    finally:
        r.close()
