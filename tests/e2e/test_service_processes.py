"""``printery-workers --processes 2``: two child services share the work; the parent's
``/status`` and ``/metrics`` cover both; SIGTERM stops everything with exit 0."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import redis
from prometheus_client.parser import text_string_to_metric_families

from printery.testing import unique_prefix
from printery.transport.server import ServerProcess
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
