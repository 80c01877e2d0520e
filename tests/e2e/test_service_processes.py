"""``printery-workers --processes 2``: two child services share the work; the parent's
``/status`` and ``/metrics`` cover both; SIGTERM stops everything with exit 0."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import psutil
import redis
from prometheus_client.parser import text_string_to_metric_families

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import spawn


def test_two_processes_share_work_and_stop(server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix("procs")
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2",
         "--worker", "validator"],
        cwd=tmp_path,
    )
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        def both_up() -> bool:
            doc = svc.json("/status")
            return len(doc["processes"]) == 2 and all(
                p["workers"].get("validator", {}).get("state") == "running"
                for p in doc["processes"]
            )

        svc.wait_until(both_up, what="two children running")
        children = [p["pid"] for p in svc.json("/status")["processes"]]
        assert len(set(children)) == 2 and svc.pid not in children
        request = {"service": "api", "version": "1.0.0", "environment": "development",
                   "requested_by": "alice", "notify": ["log"]}
        pipe = r.pipeline(transaction=False)
        for i in range(400):
            pipe.xadd(f"{prefix}:deployment:started",
                      {"data": json.dumps({**request, "deployment_id": f"d-{i}"})})
        pipe.execute()

        def all_validated() -> bool:
            return bool(r.xlen(f"{prefix}:deployment:validated") >= 400)

        svc.wait_until(all_validated, timeout=30, what="400 validated")
        by_child = {
            p["pid"]: p["workers"]["validator"]["processed"]
            for p in svc.json("/status")["processes"]
        }
        assert all(n > 0 for n in by_child.values()), by_child
        doc = svc.json("/status")
        assert doc["workers"]["validator"]["processed"] == sum(by_child.values())
        assert doc["workers"]["validator"]["consumers"] == 2
        assert svc.get("/readyz").status_code == 200

        def scraped() -> float:
            text = svc.get("/metrics").text
            for fam in text_string_to_metric_families(text):
                if fam.name == "printery_messages":
                    return sum(s.value for s in fam.samples if s.name.endswith("_total"))
            return 0.0

        svc.wait_until(lambda: scraped() >= 400, what="merged metrics")
    finally:
        r.close()
        code = svc.stop(signal.SIGTERM)
    assert code == 0, svc.log()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in children)


def test_crashed_child_is_restarted(server: ServerProcess, tmp_path: Path) -> None:
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("child"),
         "--processes", "2", "--worker", "validator", "--backoff", "50"],
        cwd=tmp_path,
    )
    try:
        def pids() -> list[int]:
            procs = svc.json("/status")["processes"]
            alive = [p["pid"] for p in procs if p["alive"] and p["workers"]]
            return alive if len(alive) == 2 else []

        first = svc.wait_until(pids, what="two children")
        psutil.Process(first[0]).kill()

        def replaced() -> bool:
            now = pids()
            return len(now) == 2 and first[0] not in now and first[1] in now

        svc.wait_until(replaced, timeout=20, what="child restarted")
        assert 'printery_process_restarts_total 1.0' in svc.get("/metrics").text
    finally:
        assert svc.stop() == 0, svc.log()


# The parent imports and builds the app without PRINTERY_CHILD_INDEX; child 1 cannot.
CHILD_FAILS_APP = '''
import os

from printery import Message, Pipeline

def pipeline(settings):
    if os.environ.get("PRINTERY_CHILD_INDEX") == "1":
        raise RuntimeError("no config for child 1")
    built = Pipeline("childfails", ingress=["job"])

    @built.step("worker", consumes=["job"])
    async def worker(msg: Message) -> None:
        return None

    return built
'''


def test_child_with_bad_configuration_stops_the_parent_with_2(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "childfails.py").write_text(CHILD_FAILS_APP)
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("cfg2"),
         "--processes", "2", "--app", "childfails:pipeline", "--backoff", "50"],
        cwd=tmp_path, wait=False,
    )
    assert svc.wait(timeout=30) == 2, svc.log()
    assert "configuration error" in svc.log()
    assert svc.log().count("no config for child 1") == 1  # not restarted


def test_parent_polling_its_children_is_not_logged(server: ServerProcess, tmp_path: Path) -> None:
    """Issue 14 item 12: the parent scrapes each child every second; at info level the
    log must not grow with it (it used to get two `HTTP Request` lines a second)."""
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("quiet"),
         "--processes", "2", "--worker", "validator"],
        cwd=tmp_path,
    )
    try:
        def scraped_both() -> bool:
            # Each child's uptime is merged into the parent's metrics only once the
            # parent has polled both children.
            text = svc.get("/metrics").text
            return text.count('printery_worker_up{worker="validator"}') == 1 and all(
                p["workers"] for p in svc.json("/status")["processes"])

        svc.wait_until(scraped_both, what="children polled")
        svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
    finally:
        assert svc.stop() == 0, svc.log()
    assert "HTTP Request" not in svc.log()
    assert "/metrics" not in svc.log() and "/status" not in svc.log()


def test_the_parent_serves_the_api(server: ServerProcess, tmp_path: Path) -> None:
    """With --processes the parent owns --http-addr: /v1 is served there."""
    prefix = unique_prefix()
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2"],
                env={"PRINTERY_API_TOKEN": "t0ken"}, cwd=tmp_path)
    headers = {"Authorization": "Bearer t0ken"}
    try:
        assert svc.http_base is not None
        answer = httpx.post(svc.http_base + "/v1/runs", headers=headers, timeout=10, json={
            "data": {"service": "billing-api", "version": "1.0.0", "environment": "development",
                     "requested_by": "alice", "notify": ["log"]}})
        assert answer.status_code == 202, answer.text
        run_id = answer.json()["run_id"]

        def finished() -> bool:
            run = httpx.get(f"{svc.http_base}/v1/runs/{run_id}", headers=headers, timeout=5)
            return bool(run.json().get("status") == "succeeded")

        svc.wait_until(finished, timeout=40, what="the run to succeed")
        assert httpx.get(svc.http_base + "/v1/runs/x", timeout=5).status_code == 401
    finally:
        assert svc.stop() == 0
