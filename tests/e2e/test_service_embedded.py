"""The embedded default (docs/reference.md, printery-workers): no Redis URL, an empty
directory, and the service still runs, with its data under ``./.printery`` surviving a
restart."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import psutil
import redis

from support.service import spawn, started_entry


def _server_url(cwd: Path) -> str:
    state = json.loads((cwd / ".printery" / "server.json").read_text())
    return f"redis://{state['host']}:{state['port']}/0"


def test_embedded_default_persists_across_restart(tmp_path: Path) -> None:
    svc = spawn([], cwd=tmp_path)
    try:
        assert (tmp_path / ".printery").is_dir()
        first = svc.log().strip().splitlines()[0]
        assert "using embedded server at redis://" in first and "started" in first
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
        r = redis.Redis.from_url(_server_url(tmp_path), decode_responses=True)
        try:
            r.xadd("materi:events:deployment:deployment:started", {"data": "not json"})
        finally:
            r.close()
    finally:
        assert svc.stop() == 0, svc.log()

    again = spawn([], cwd=tmp_path)
    try:
        r = redis.Redis.from_url(_server_url(tmp_path), decode_responses=True)
        try:
            # The undecodable entry went to the dlq (docs/reference.md, Failures) in
            # either run; the stream and its entry are still there after the restart
            # (append-only file).
            assert r.xlen("materi:events:deployment:deployment:started") == 1
            groups = r.xinfo_groups("materi:events:deployment:deployment:started")
            assert [g["name"] for g in groups] == ["validator"]
            again.wait_until(
                lambda: r.xlen("materi:events:deployment:dlq") >= 1, what="dlq entry"
            )
        finally:
            r.close()
    finally:
        assert again.stop() == 0, again.log()


# -- the embedded server dies, or its data dir goes (issue 14 item 11) ---------------------

STARTED = "materi:events:deployment:deployment:started"
SENT = "materi:events:deployment:notification:sent"


def _server_pid(cwd: Path) -> int:
    return int(json.loads((cwd / ".printery" / "server.json").read_text())["pid"])


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_killed_server_is_restarted_on_its_data(tmp_path: Path) -> None:
    svc = spawn([], cwd=tmp_path)
    try:
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
        url = _server_url(tmp_path)
        with redis.Redis.from_url(url, decode_responses=True) as r:
            r.xadd(STARTED, started_entry("dep-before-kill"))
            svc.wait_until(lambda: r.xlen(SENT) == 1, what="first deployment")
        first = _server_pid(tmp_path)
        psutil.Process(first).kill()  # kill -9 of the valkey process

        def restarted() -> int:
            pid = _server_pid(tmp_path)
            return pid if pid != first and _running(pid) else 0

        second = svc.wait_until(restarted, timeout=20, what="server restarted")
        assert _server_url(tmp_path) == url  # same port: every client reconnects
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, timeout=20,
                       what="ready again")
        with redis.Redis.from_url(url, decode_responses=True) as r:
            assert r.xlen(SENT) == 1  # the append-only file brought the data back
            r.xadd(STARTED, started_entry("dep-after-kill"))
            svc.wait_until(lambda: r.xlen(SENT) == 2, timeout=30, what="second deployment")
        assert "restarting it" in svc.log()
    finally:
        code = svc.stop()
    assert code == 0, svc.log()
    assert not _running(second)


def test_server_that_cannot_come_back_ends_the_service_with_1(tmp_path: Path) -> None:
    svc = spawn([], cwd=tmp_path)
    try:
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
        server = psutil.Process(_server_pid(tmp_path))
        manifests = list((tmp_path / ".printery" / "data").rglob("*.manifest"))
        assert manifests, "no append-only manifest"
        # Frozen, the service cannot restart the server before its files are damaged.
        svc.proc.send_signal(signal.SIGSTOP)
        try:
            server.kill()
            manifests[0].write_text("this is not a manifest\n")
        finally:
            svc.proc.send_signal(signal.SIGCONT)
        code = svc.wait(timeout=60)
    finally:
        svc.kill()
    assert code == 1, svc.log()
    lost = [line for line in svc.log().splitlines() if "embedded server lost" in line]
    assert len(lost) == 1 and "server exited with" in lost[0], svc.log()


def test_deleted_data_dir_is_an_error_and_no_server_is_left(tmp_path: Path) -> None:
    svc = spawn([], cwd=tmp_path)
    try:
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
        pid = _server_pid(tmp_path)
        shutil.rmtree(tmp_path / ".printery")

        def not_ready() -> list[str]:
            answer = svc.get("/readyz")
            reasons: list[str] = answer.json().get("reasons", [])
            return reasons if answer.status_code == 503 else []

        reasons = svc.wait_until(not_ready, what="/readyz 503")
        assert any("was deleted" in reason for reason in reasons), reasons
        assert '"level":"error"' in svc.log() and "was deleted" in svc.log()
    finally:
        code = svc.stop()
    assert code == 0, svc.log()
    assert not _running(pid), "the embedded server was left running"
