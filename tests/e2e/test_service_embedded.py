"""The embedded default (CONTRACT §6): no Redis URL, an empty directory, and the service
still runs, with its data under ``./.printery`` surviving a restart."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from support.service import spawn


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
            # The undecodable entry went to the dlq (§4) in either run; the stream and
            # its entry are still there after the restart (append-only file).
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
