"""The embedded default (docs/reference.md, printery-workers) against the real packaged
server binary.

Other holders run as separate OS processes, since the locks and leases under test are
per-process: a second holder in this process would prove nothing about a second service.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from printery.servers.embedded import (
    LEASES_DIR,
    STATE_FILE,
    EmbeddedServer,
    find_running,
    start_ephemeral,
)
from printery.servers.process import free_port

HOLDER = """
import sys
from printery.servers.embedded import EmbeddedServer
server = EmbeddedServer(sys.argv[1])
print(server.acquire(), flush=True)
sys.stdin.readline()
server.release()
print("released", flush=True)
"""


class Holder:
    """A separate process that acquires, reports the URL, and releases when told."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def url(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "holder did not report a URL in time"
        return self.proc.stdout.readline().strip()

    def release(self, timeout: float = 30.0) -> None:
        out, _ = self.proc.communicate("\n", timeout=timeout)
        assert "released" in out
        assert self.proc.returncode == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def servers_in(data_dir: Path) -> list[psutil.Process]:
    """Server processes running with ``<data_dir>/data`` as working dir (``--dir``)."""
    target = str((data_dir / "data").resolve())
    found = []
    for proc in psutil.process_iter(["cwd", "name", "status"]):
        if (
            proc.info["cwd"] == target
            and proc.info["status"] != psutil.STATUS_ZOMBIE
            and "server" in (proc.info["name"] or "")
        ):
            found.append(proc)
    return found


def pings(url: str) -> bool:
    with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


def state_pid(data_dir: Path) -> int:
    return int(json.loads((data_dir / STATE_FILE).read_text())["pid"])


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "printery"
    yield path
    # Whatever a failed test left behind: no server may outlive the test.
    for proc in servers_in(path):
        proc.kill()
        proc.wait(10)


@pytest.fixture
def new_holder(data_dir: Path) -> Iterator[Callable[[], Holder]]:
    """Start another process holding the ``data_dir`` server; all are closed at the end."""
    started: list[Holder] = []

    def start() -> Holder:
        started.append(Holder(data_dir))
        return started[-1]

    yield start
    for holder in started:
        holder.close()


@pytest.fixture
def new_server(data_dir: Path) -> Iterator[Callable[[], EmbeddedServer]]:
    """An ``EmbeddedServer`` on ``data_dir`` in this process; all are released at the end."""
    made: list[EmbeddedServer] = []

    def make() -> EmbeddedServer:
        made.append(EmbeddedServer(data_dir))
        return made[-1]

    yield make
    for server in made:
        server.release()


def test_find_running_is_none_when_nothing_runs(data_dir: Path) -> None:
    assert find_running(data_dir) is None  # the dir does not even exist
    data_dir.mkdir()
    assert find_running(data_dir) is None


def test_acquire_starts_a_server_and_records_it(
    data_dir: Path, new_server: Callable[[], EmbeddedServer]
) -> None:
    server = new_server()

    url = server.acquire()

    assert server.started
    assert pings(url)
    assert (data_dir / STATE_FILE).exists()
    assert [p.pid for p in servers_in(data_dir)] == [state_pid(data_dir)]
    assert find_running(data_dir) == url
    assert server.acquire() == url  # idempotent: no second lease, no second server
    assert len(list((data_dir / LEASES_DIR).glob("*.lease"))) == 1


def test_second_process_shares_the_server_and_keeps_it_alive(
    data_dir: Path, new_server: Callable[[], EmbeddedServer], new_holder: Callable[[], Holder]
) -> None:
    server = new_server()
    url = server.acquire()
    pid = state_pid(data_dir)
    other = new_holder()

    assert other.url() == url
    assert state_pid(data_dir) == pid
    assert len(servers_in(data_dir)) == 1

    server.release()  # the other process still holds a lease
    assert find_running(data_dir) == url
    assert pings(url)

    other.release()  # the last holder: stops a server this test process started
    assert find_running(data_dir) is None
    assert not (data_dir / STATE_FILE).exists()
    assert servers_in(data_dir) == []


def test_last_release_stops_a_server_another_process_started(
    data_dir: Path, new_server: Callable[[], EmbeddedServer], new_holder: Callable[[], Holder]
) -> None:
    other = new_holder()
    url = other.url()
    server = new_server()

    assert server.acquire() == url
    assert not server.started

    other.release()  # its starter is gone; the server stays for us
    assert pings(url)
    server.release()
    assert find_running(data_dir) is None
    assert servers_in(data_dir) == []


def test_a_crashed_holder_does_not_keep_the_server_alive(
    data_dir: Path, new_server: Callable[[], EmbeddedServer], new_holder: Callable[[], Holder]
) -> None:
    server = new_server()
    url = server.acquire()
    other = new_holder()
    assert other.url() == url

    other.kill()  # no release: the kernel drops its lease lock
    server.release()

    assert servers_in(data_dir) == []
    assert list((data_dir / LEASES_DIR).glob("*.lease")) == []


def test_concurrent_starts_share_one_server(data_dir: Path, new_holder: Callable[[], Holder]) -> None:
    holders = [new_holder() for _ in range(3)]

    urls = {holder.url() for holder in holders}

    assert len(urls) == 1
    assert len(servers_in(data_dir)) == 1
    for holder in holders:
        holder.release()
    assert servers_in(data_dir) == []


def test_data_survives_a_restart(data_dir: Path, new_server: Callable[[], EmbeddedServer]) -> None:
    server = new_server()
    url = server.acquire()
    with redis.Redis.from_url(url) as client:
        entry_id = client.xadd("s", {"data": "{}"})
    first_pid = state_pid(data_dir)
    server.release()
    assert servers_in(data_dir) == []

    url = server.acquire()

    assert server.started
    assert state_pid(data_dir) != first_pid
    with redis.Redis.from_url(url) as client:
        assert [eid for eid, _ in client.xrange("s")] == [entry_id]


def test_a_stale_state_file_is_replaced(data_dir: Path, new_server: Callable[[], EmbeddedServer]) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(10)
    data_dir.mkdir(parents=True)
    stale = {
        "pid": dead.pid,
        "host": "127.0.0.1",
        "port": free_port(),
        "binary": "valkey-server",
        "run_id": "0" * 40,
        "started_at": "2026-01-01T00:00:00.000Z",
    }
    (data_dir / STATE_FILE).write_text(json.dumps(stale))
    assert find_running(data_dir) is None

    server = new_server()
    url = server.acquire()

    assert server.started
    assert pings(url)
    assert state_pid(data_dir) != dead.pid
    assert find_running(data_dir) == url


def test_a_server_that_lost_its_state_file_is_replaced(
    data_dir: Path, new_server: Callable[[], EmbeddedServer]
) -> None:
    first, second = new_server(), new_server()
    first.acquire()
    old_pid = state_pid(data_dir)
    (data_dir / STATE_FILE).unlink()

    url = second.acquire()

    # Two servers must never share one append-only file: the orphan is stopped.
    assert second.started
    assert [p.pid for p in servers_in(data_dir)] == [state_pid(data_dir)]
    assert state_pid(data_dir) != old_pid
    assert pings(url)


def test_start_ephemeral_persists_nothing(tmp_path: Path) -> None:
    server = start_ephemeral(tmp_path)
    try:
        assert pings(server.url)
        with redis.Redis.from_url(server.url) as client:
            client.xadd("s", {"data": "{}"})
            assert client.config_get("appendonly") == {"appendonly": "no"}
    finally:
        server.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pings(server.url):
        time.sleep(0.05)
    assert not pings(server.url)
    assert not any(tmp_path.glob("appendonly*"))
